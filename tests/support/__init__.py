"""Helpers shared by several test modules (not tests themselves)."""
