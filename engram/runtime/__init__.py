"""The NATS runtime every service shares: broker and consumers, streams and KV buckets, NATS users, per-group order and slots, dead letters, erasure and session epochs."""
