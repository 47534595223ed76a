"""Client text in log lines: capped, escaped, without quoted values, and rate-limited.

A request id or an error message reaches the log as at most `MAX_LOGGED_CHARS` printable
ASCII characters (control characters, newlines, backslashes and non-ASCII escaped as
``\\n``, ``\\x1b``, ``\\u2028``), followed by a marker of the original length when it was
cut: a 1 MB request id costs about 150 bytes of log. `without_values` drops the quoted
values an error message may carry (``address 'Nanjing Rd 1'`` becomes ``address '...'``),
so no payload value (address, id, city) reaches a log line above debug. `LogRateLimit` is a
token bucket for lines a client can cause one per request (rejections, failures).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Final

__all__ = [
    "MAX_LOGGED_CHARS",
    "MAX_LOGGED_ERROR_CHARS",
    "LogRateLimit",
    "clip",
    "describe_error",
    "without_values",
]

MAX_LOGGED_CHARS: Final = 128
MAX_LOGGED_ERROR_CHARS: Final = 256
# A quoted literal as repr() writes it ('...', "...", with escapes), or an unterminated
# one running to the end (a message cut short).
_QUOTED: Final = re.compile(r"""'(?:[^'\\]|\\.)*(?:'|$)|"(?:[^"\\]|\\.)*(?:"|$)""", re.DOTALL)


def clip(value: object, limit: int = MAX_LOGGED_CHARS) -> str:
    """``value`` as text for one log line: printable ASCII only (anything else escaped, a
    backslash doubled), at most ``limit`` characters of it, then ``...[N chars]`` with the
    original length N when it was longer. Bytes are read as UTF-8 (an invalid byte reads as U+FFFD).
    Costs O(limit), however long the value."""
    if isinstance(value, bytes | bytearray):
        head = bytes(value[: limit + 1]).decode("utf-8", "replace")
        return _cut(head, len(value), limit)
    text = value if isinstance(value, str) else str(value)
    return _cut(text[: limit + 1], len(text), limit)


def without_values(text: str, limit: int = MAX_LOGGED_ERROR_CHARS) -> str:
    """``text`` with each quoted literal replaced by ``'...'``, capped like `clip` (the
    marker gives the original length)."""
    head = text[: 4 * limit]  # the values go before the cut: none is left half-shown
    redacted = _QUOTED.sub("'...'", head)
    length = len(redacted) if len(head) == len(text) else len(text)
    return _cut(redacted[: limit + 1], length, limit)


def _cut(head: str, length: int, limit: int) -> str:
    escaped = head.encode("unicode_escape").decode("ascii")
    if length <= limit and len(escaped) <= limit:
        return escaped
    return f"{escaped[:limit]}...[{length} chars]"


def describe_error(exc: BaseException, limit: int = MAX_LOGGED_ERROR_CHARS) -> str:
    """``Type: message`` for a log line, the message `without_values`."""
    return f"{type(exc).__name__}: {without_values(str(exc), limit)}"


class LogRateLimit:
    """A token bucket over log lines: up to ``burst`` at once, then ``per_s`` a second.

    `admit` answers whether one more line may be written and, when it may, how many were
    dropped since the last admitted one (to be reported in one summary line). Thread-safe.
    """

    def __init__(
        self,
        per_s: float = 1.0,
        burst: int = 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if per_s <= 0 or burst < 1:
            raise ValueError("a log rate limit needs per_s > 0 and burst >= 1")
        self.per_s = per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._dropped = 0
        self._lock = threading.Lock()

    @property
    def dropped(self) -> int:
        """Lines dropped since the last admitted one."""
        with self._lock:
            return self._dropped

    def admit(self) -> int | None:
        """None: drop this line. Else the number dropped before it (0 most of the time)."""
        with self._lock:
            now = self._clock()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.per_s)
            self._last = now
            if self._tokens < 1.0:
                self._dropped += 1
                return None
            self._tokens -= 1.0
            dropped, self._dropped = self._dropped, 0
            return dropped
