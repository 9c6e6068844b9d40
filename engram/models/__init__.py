"""Model factories shared by services: embedders (and, with the extractor, LLM clients)."""
