"""Shared by every layer: input errors, typed settings, metric vocabulary, paths."""
