"""Gateway service: the Graphiti REST contract over HTTP, backed by engram over NATS."""
