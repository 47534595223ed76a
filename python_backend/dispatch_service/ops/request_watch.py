"""Who keeps killing stubs: the request ids of windows whose declared shape no tensor can have.

Triton 2.51 aborts a Python-backend stub on a declared shape whose byte size wraps past 2^64
(e.g. ORDER_FIELDS [1, 2^61+1, 7] FP64 with 56 bytes: 2^61+1 x 7 x 8 wraps to 56, so
Triton's own size check passes) before the model runs, so no model can log the request.
Triton itself logs each request before it is executed, at log verbosity 1: one line
``[request id: <id>] prepared: ... model: <model>, ... input: <name>, type: <type>, original
shape: [<dims>] ...``. So after each stub death the launcher turns verbosity 1 on for
`WATCH_S` (Triton's logging API, behind its key; it costs about 2.5 KB of log a request) and
reads what the log adds: every request with a shape of 2^63 bytes or more (no window has
one) is counted (``dispatch_launcher_impossible_shape_requests_total{model}``) and logged
(``impossible_shape_request``, its id capped at 128 characters and escaped, at most
`EVENTS_PER_MINUTE` lines a minute). A client that keeps killing stubs is then seen from its
second window on; its first one killed the stub that started the watch.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

from dispatch_service.ops.log_watch import LogTail, Poller
from dispatch_service.ops.model_control import ModelControlError, update_logging

__all__ = [
    "EVENTS_PER_MINUTE",
    "WATCH_S",
    "ImpossibleShape",
    "RequestWatch",
    "impossible_shapes",
]

WATCH_S: Final = 120.0  # verbosity 1 this long after the last stub death
EVENTS_PER_MINUTE: Final = 20  # logged lines a minute at most; the counter counts them all
ID_CHARS: Final = 128
IMPOSSIBLE_BYTES: Final = 1 << 63  # Triton computes byte sizes in int64
# Bytes per element of Triton's types; BYTES elements count one each (their length is data).
_ELEMENT_BYTES: Final = {
    "BOOL": 1,
    "UINT8": 1,
    "INT8": 1,
    "BYTES": 1,
    "UINT16": 2,
    "INT16": 2,
    "FP16": 2,
    "BF16": 2,
    "UINT32": 4,
    "INT32": 4,
    "FP32": 4,
    "UINT64": 8,
    "INT64": 8,
    "FP64": 8,
}
_PREPARED = re.compile(rb"\[request id: (?P<id>.*?)\] prepared: (?P<rest>.*)$", re.MULTILINE)
_MODEL = re.compile(rb" model: (?P<model>[^,]*),")
_INPUT = re.compile(
    rb"input: (?P<name>[^,]*), type: (?P<type>[A-Z0-9]+), original shape: \[(?P<dims>[-0-9,]*)\]"
)


class ImpossibleShape:
    """One request Triton prepared with a shape no tensor can have."""

    def __init__(self, request_id: str, model: str, tensor: str, shape: list[int]) -> None:
        self.request_id = request_id
        self.model = model
        self.tensor = tensor
        self.shape = shape


def impossible_shapes(log: bytes) -> list[ImpossibleShape]:
    """The requests of Triton's verbose log lines ``log`` whose declared shape holds
    `IMPOSSIBLE_BYTES` or more (one per request id in a row: an ensemble's request and its
    first step's are prepared under one id; its first such input)."""
    found: list[ImpossibleShape] = []
    for line in _PREPARED.finditer(log):
        if found and found[-1].request_id == _clip(line["id"]):
            continue
        model = _MODEL.search(line["rest"])
        for tensor in _INPUT.finditer(line["rest"]):
            dims = [int(d) for d in tensor["dims"].split(b",") if d]
            size = _ELEMENT_BYTES.get(tensor["type"].decode(), 1)
            if any(d < 0 for d in dims) or math.prod(dims) * size < IMPOSSIBLE_BYTES:
                continue
            found.append(
                ImpossibleShape(
                    _clip(line["id"]),
                    model["model"].decode(errors="replace") if model else "",
                    tensor["name"].decode(errors="replace"),
                    dims,
                )
            )
            break
    return found


def _clip(raw: bytes) -> str:
    """A client's request id as a log may hold it: escaped, at most `ID_CHARS` characters."""
    text = raw.decode(errors="replace")
    text = text[:ID_CHARS] + ("..." if len(text) > ID_CHARS else "")
    return text.encode("unicode_escape").decode("ascii")


class WatchedServer(Protocol):
    """What the watch needs of `server.TritonServer`."""

    @property
    def log_path(self) -> Path: ...
    @property
    def http_url(self) -> str: ...
    @property
    def admin_key(self) -> str | None: ...


class RequestWatch:
    """Turns Triton's verbose log on after a stub death (`arm`) and reports the impossible
    shapes it shows, from a thread polling every ``poll_s``; off again `WATCH_S` after the
    last death."""

    def __init__(
        self,
        server: WatchedServer,
        report: Callable[[dict[str, object]], None],
        poll_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server = server
        self.report = report
        self.poll_s = poll_s
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._until: float | None = None  # verbose until then; None: not watching
        self._log = LogTail()
        self._logged: list[float] = []  # when the last event lines were printed
        self._poller = Poller("request_watch", poll_s, self.check)

    def start(self) -> RequestWatch:
        self._poller.start()
        return self

    def stop(self) -> None:
        self._poller.stop()

    def arm(self) -> None:
        """A stub died: log every request for `WATCH_S` from now (verbosity 1). Not where
        Triton's log is no regular file the launcher can read (e.g. /dev/stdout)."""
        if not self.server.log_path.is_file():
            return
        with self._lock:
            watching = self._until is not None
            self._until = self.clock() + WATCH_S
        if not watching:
            self._log.skip_to_end(self.server.log_path)  # from here on
        # Set at each death: a server restarted meanwhile (for its leaked stubs) starts at 0.
        self._verbose(1)

    def check(self) -> None:
        """One poll: read what the log added while watching, stop watching when due."""
        with self._lock:
            until = self._until
        if until is None:
            return
        self._read()
        if self.clock() >= until:
            with self._lock:
                self._until = None
            self._verbose(0)

    def _verbose(self, level: int) -> None:
        try:
            update_logging(
                self.server.http_url, {"log_verbose_level": level}, self.server.admin_key
            )
        except ModelControlError as exc:  # a server gone or restarting: its next start is 0
            self.report({"event": "request_watch_failed", "error": str(exc)[:300]})

    def _read(self) -> None:
        for found in impossible_shapes(self._log.read(self.server.log_path)):
            with self._lock:
                self.counts[found.model] += 1
            now = self.clock()
            self._logged = [t for t in self._logged if now - t < 60.0]
            if len(self._logged) < EVENTS_PER_MINUTE:
                self._logged.append(now)
                self.report(
                    {
                        "event": "impossible_shape_request",
                        "model": found.model,
                        "request_id": found.request_id,
                        "tensor": found.tensor,
                        "shape": found.shape,
                    }
                )

    def metrics_text(self) -> str:
        """Prometheus lines: the impossible-shape requests seen, by model."""
        with self._lock:
            counts = dict(self.counts)
        lines = [
            "# HELP dispatch_launcher_impossible_shape_requests_total Requests whose declared "
            "shape no tensor can have (a Triton 2.51 stub dies of one), seen in Triton's log "
            "while watching after a stub death.",
            "# TYPE dispatch_launcher_impossible_shape_requests_total counter",
        ]
        lines += [
            f'dispatch_launcher_impossible_shape_requests_total{{model="{model}"}} {count}'
            for model, count in sorted(counts.items())
        ]
        return "\n".join(lines) + "\n"
