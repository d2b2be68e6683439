"""What an operator or a client asks of the server itself: GET /health and /health/ready, GET /metrics, GET /version."""
