"""Tests for the extractor service."""
