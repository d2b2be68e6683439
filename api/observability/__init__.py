"""What api/status/ answers from: the api's own counters, every live worker's published stats and the cluster's
state (readiness per served model), rendered in Prometheus' text format for /metrics."""
