"""What operators read: /metrics in Prometheus' format and /health/ready, from the api and every live worker."""
