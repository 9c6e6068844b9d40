"""Extractor service: turns Episodes into graphiti-core knowledge-graph updates."""
