"""What closes work nobody else will: the request and batch reapers, and requests whose worker died."""
