"""SAE steering and monitoring hooks: arrive with per-request steering."""
