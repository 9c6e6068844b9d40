"""The local stack `engram up` runs: embedded NATS and FalkorDB from pip-installed binaries, the supervisor, the data dir's lock and finding a running stack again."""
