"""Helpers the geocoding tests share (tests/unit is on pytest's pythonpath)."""

from __future__ import annotations

__all__ = ["SERVER_KEY", "ManualClock"]

SERVER_KEY = "test-key"


class ManualClock:
    """A monotonic clock that moves only when told (cache TTL, breaker timing)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
