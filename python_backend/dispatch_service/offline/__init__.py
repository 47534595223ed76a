"""Offline, never on the request path: simulator, baselines, evaluation, profiling, training."""
