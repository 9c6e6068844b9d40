"""Observability: OpenTelemetry tracing (engram's and graphiti's side) and the pipeline's freshness and backlog metrics."""
