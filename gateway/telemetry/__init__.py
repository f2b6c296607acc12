"""Per-request telemetry: the request record, its ``llm_request`` span and the Prometheus metrics."""
