"""Writing into engram from outside the services: transcripts (`engram ingest`), promotions, whole triplets, and the message size every publisher checks."""
