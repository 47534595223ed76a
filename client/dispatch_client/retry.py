"""When and how long a client waits before sending a refused window again.

A refusal without work (UNAVAILABLE: queue full, the window's deadline expired, a model
reloading) is often over a moment later. `RetryPolicy` sends such a window again: a bounded
number of attempts, capped exponential backoff with full jitter (each wait drawn uniformly
from zero to the cap, so callers refused together do not come back together), and an overall
budget so a retried window is never answered later than the caller can use it. A throttle per
client (`RetryThrottle`, the rule of gRPC's retry throttling) stops retrying while most sends
are refused: retries ride out a reload or a short burst, but under sustained overload they
would only multiply the load. Measured with 512 callers on two cores (`perf.overload
--backoff`, perf/tuning_log.json): no fewer refusals and no better latency than callers that
re-send at once, and without the throttle less throughput; the policy adds no capacity.

Only failures where the server did no work are retried: a refusal with UNAVAILABLE (HTTP
503) and a connection that could not be made. So is, once, a window whose model instance
died under it (`lost_instance`: the server restarts the instance and another one serves the
window); once only, since a window that itself killed the instance would kill one per send.
A request that timed out may still be running on the server, and a bad window stays bad, so
neither is sent again. Dispatching a window has no side effect on the server, so a retry
cannot assign twice.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, TypeVar

from dispatch_client.errors import DispatchConnectionError, DispatchError, DispatchServerError

__all__ = [
    "DEFAULT_RETRY",
    "MAX_ATTEMPTS",
    "NO_RETRY",
    "UNAVAILABLE_STATUSES",
    "RetryPolicy",
    "RetryThrottle",
    "is_retryable",
    "lost_instance",
]

UNAVAILABLE_STATUSES: Final = frozenset({"503", "StatusCode.UNAVAILABLE"})
"""The statuses of a refusal without work: a full queue, an expired deadline, a model not
ready (TRITONSERVER_ERROR_UNAVAILABLE)."""

MAX_ATTEMPTS: Final = 10  # sends of one window at most, whatever a policy asks
LOST_INSTANCE_SENDS: Final = 2  # sends of a window whose instance died under it, at most
# Triton's Python backend answers INTERNAL "Stub process '<instance>' is not healthy." for
# the requests an instance had when its process died.
_LOST_INSTANCE_STATUSES: Final = frozenset({"500", "StatusCode.INTERNAL"})
_LOST_INSTANCE_TEXT: Final = ("Stub process", "is not healthy")

T = TypeVar("T")


def lost_instance(error: BaseException) -> bool:
    """The model instance serving the request died under it; the window got no answer."""
    return (
        isinstance(error, DispatchServerError)
        and error.status in _LOST_INSTANCE_STATUSES
        and all(text in error.message for text in _LOST_INSTANCE_TEXT)
    )


def is_retryable(error: BaseException) -> bool:
    """The server did no work for this request, or lost it with its instance, and may do it
    later."""
    if isinstance(error, DispatchServerError):
        return error.status in UNAVAILABLE_STATUSES or lost_instance(error)
    if isinstance(error, DispatchConnectionError):
        return not error.timed_out
    return False


class RetryThrottle:
    """One client's right to retry, shared by its threads: `max_tokens` tokens; a send
    refused without work takes one, an answered send gives back `token_ratio`; retries are
    allowed only while more than half are left. A lasting refusal rate above about
    `token_ratio` / (1 + `token_ratio`) (9 % with the defaults) therefore stops retries
    until answers come back; a short burst of refusals is still ridden out."""

    def __init__(self, max_tokens: float = 10.0, token_ratio: float = 0.1) -> None:
        if not (math.isfinite(max_tokens) and max_tokens > 0):
            raise ValueError(f"retry throttle max_tokens must be > 0, got {max_tokens!r}")
        if not (math.isfinite(token_ratio) and 0 < token_ratio <= max_tokens):
            raise ValueError(
                f"retry throttle token_ratio must be within (0, max_tokens], got {token_ratio!r}"
            )
        self.max_tokens = max_tokens
        self.token_ratio = token_ratio
        self._tokens = max_tokens
        self._lock = threading.Lock()

    @property
    def tokens(self) -> float:
        return self._tokens

    def succeeded(self) -> None:
        with self._lock:
            self._tokens = min(self.max_tokens, self._tokens + self.token_ratio)

    def refused(self) -> None:
        with self._lock:
            self._tokens = max(0.0, self._tokens - 1.0)

    def allows_retry(self) -> bool:
        return self._tokens > self.max_tokens / 2


@dataclass(frozen=True)
class RetryPolicy:
    """`attempts` sends at most (1: never retry); before the n-th retry (n = 1, 2, ...) a
    wait drawn uniformly from [0, min(`max_backoff_ms`, `initial_backoff_ms` x 2^(n-1))];
    no retry whose wait would end more than `budget_ms` after the first send."""

    attempts: int = 3
    initial_backoff_ms: float = 25.0
    max_backoff_ms: float = 400.0
    budget_ms: float = 2_000.0
    # The jitter's source; a seeded `random.Random` makes the waits reproducible in tests.
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ValueError(f"retry attempts must be an integer, got {self.attempts!r}")
        if not 1 <= self.attempts <= MAX_ATTEMPTS:
            raise ValueError(
                f"retry attempts must be within 1..{MAX_ATTEMPTS}, got {self.attempts}"
            )
        for name in ("initial_backoff_ms", "max_backoff_ms", "budget_ms"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"retry {name} must be a finite number >= 0, got {value!r}")
        if self.max_backoff_ms < self.initial_backoff_ms:
            raise ValueError(
                f"retry max_backoff_ms ({self.max_backoff_ms:g}) must not be below "
                f"initial_backoff_ms ({self.initial_backoff_ms:g})"
            )

    def backoff_ms(self, retry: int) -> float:
        """The wait before retry number `retry` (1 for the first), full jitter."""
        cap = min(self.max_backoff_ms, self.initial_backoff_ms * 2.0 ** (retry - 1))
        return self.rng.uniform(0.0, cap)

    def next_wait_ms(
        self,
        error: BaseException,
        sends: int,
        elapsed_ms: float,
        throttle: RetryThrottle | None = None,
    ) -> float | None:
        """How long to wait before sending again after `sends` sends, the last refused with
        `error`, `elapsed_ms` after the first; None: do not send again. A retryable refusal
        is counted against `throttle`. The one rule behind `call` and the overload
        generator's backing-off callers (`perf.overload`)."""
        if not is_retryable(error):
            return None
        if throttle is not None:
            throttle.refused()
            if not throttle.allows_retry():
                return None
        if sends >= self.attempts:
            return None
        if lost_instance(error) and sends >= LOST_INSTANCE_SENDS:
            return None
        wait = self.backoff_ms(sends)
        return None if elapsed_ms + wait > self.budget_ms else wait

    def call(
        self,
        send: Callable[[], T],
        *,
        throttle: RetryThrottle | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> T:
        """`send()` until it returns, raises an error that is not retryable, runs out of
        attempts, would run past the budget or `throttle` stops it; the last error is
        raised as it is, with `attempts` set to the number of sends."""
        started = clock()
        sends = 0
        while True:
            sends += 1
            try:
                answer = send()
            except DispatchError as exc:
                exc.attempts = sends
                elapsed_ms = (clock() - started) * 1000.0
                wait = self.next_wait_ms(exc, sends, elapsed_ms, throttle)
                if wait is None:
                    raise
                sleep(wait / 1000.0)
            else:
                if throttle is not None:
                    throttle.succeeded()
                return answer


DEFAULT_RETRY: Final = RetryPolicy()
NO_RETRY: Final = RetryPolicy(attempts=1)
