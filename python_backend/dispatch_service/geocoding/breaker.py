"""A circuit breaker per geocoding provider: stop calling one that keeps failing.

A provider that is down costs every window its whole timeout; after a few failures in a row
the breaker opens and the chain skips that provider at once (straight to the next one or
the gazetteer). After ``open_s`` it lets one trial call through (half-open): a success
closes it, a failure opens it for another ``open_s``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from enum import Enum

__all__ = ["BreakerState", "CircuitBreaker"]


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """Consecutive-failure breaker; ``clock`` is injectable so tests move time by hand."""

    def __init__(
        self,
        failure_threshold: int = 5,
        open_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("breaker failure_threshold must be >= 1")
        if not open_s > 0:
            raise ValueError("breaker open_s must be > 0")
        self._threshold = failure_threshold
        self._open_s = open_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._opened_at = 0.0
        self._state = BreakerState.CLOSED
        self._trial_in_flight = False
        self.times_opened = 0

    @property
    def state(self) -> BreakerState:
        with self._lock:
            self._advance()
            return self._state

    def _advance(self) -> None:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self._open_s:
            self._state = BreakerState.HALF_OPEN
            self._trial_in_flight = False

    def allow(self) -> bool:
        """May a call go out now? In half-open, only one trial at a time."""
        with self._lock:
            self._advance()
            if self._state is BreakerState.CLOSED:
                return True
            if self._state is BreakerState.HALF_OPEN and not self._trial_in_flight:
                self._trial_in_flight = True
                return True
            return False

    def record_success(self) -> None:
        with self._lock:
            self._failures = 0
            self._state = BreakerState.CLOSED
            self._trial_in_flight = False

    def record_failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._state is BreakerState.HALF_OPEN or (
                self._state is BreakerState.CLOSED and self._failures >= self._threshold
            ):
                self._state = BreakerState.OPEN
                self._opened_at = self._clock()
                self._trial_in_flight = False
                self.times_opened += 1

    def release(self) -> None:
        """A call that neither succeeded nor failed (cancelled): free the half-open trial."""
        with self._lock:
            self._trial_in_flight = False
