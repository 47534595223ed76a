"""The embedded Triton restarts itself by default, and each of its crashes is counted.

Triton 2.51 (the `nvidia-pytriton` wheel, NGC 24.10) dies with SIGSEGV under valid gRPC
traffic whose clients give up early: a burst of requests to the `dispatch` ensemble with
1-15 ms deadlines from 32 callers took the server down after 900-6,700 requests in most runs
of this repository's burst (`perf/deadline_burst.py`). The crash is in the gRPC front end,
not in any model: backtraces of the live process show `ModelInferHandler::Process` locking
the mutex of a call context already released, in its cancellation check (`IsCancelled`,
`HandleCancellation`), `ModelInferHandler::Execute` finishing a finished call, or gRPC's
timer thread in `grpc_timer_heap_remove`; no allocation pool size or other setting avoided
it on `dispatch` (docs/security.md, "Client deadlines crash the embedded 2.51"). It matches
Triton's cancellation defects in the gRPC front end (triton-inference-server/server issue
7368, fixed by its pull request 7840 in 24.12 / Triton 2.53; its issue 8034 on 25.01): only
a newer Triton fixes it. So the launcher of the embedded build restarts a Triton that has
died (`--on-dead restart`, the supervisor's policy: the next check, at most a second later,
starts a new server and loads back the live routing), while a `--tritonserver` given on the
command line (a patched release, e.g. the NGC image) keeps `exit` for its process manager
unless told otherwise.

`CrashCounter` watches the server's process (each one a restart puts in place) and counts
every death by a signal -- SIGSEGV, SIGABRT (2.51's `boost::interprocess::lock_exception`
abort), SIGKILL (the OOM killer, a `kill -9`), SIGTERM from anyone else, ... -- as
``dispatch_launcher_server_crashes_total{signal=...}`` on the launcher's `/metrics`, with one
``server_crashed`` event line each. Only a stop the launcher asked for (its SIGTERM, its
SIGKILL after the exit timeout: `ChildService.stopped_pids`) is no crash. A
Triton that caught a crash signal but did not die of it counts too: 2.51's handler prints
``Signal (11) received.`` and may then hang (seen once under the burst: the deep check then
declared it dead and the launcher killed it), so the server's log is read as it grows, and
each process counts at most once, by its log or by its exit status.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Protocol

from dispatch_service.ops.child_process import end_process_group
from dispatch_service.ops.log_watch import LogTail, Poller

__all__ = [
    "CRASH_SIGNALS",
    "EMBEDDED_ON_DEAD",
    "CrashCounter",
    "crash_signal",
    "default_on_dead",
    "end_process_group",
    "start_again",
]

OnDead = Literal["exit", "restart"]
# The embedded 2.51 crashes on valid traffic (see the module docstring): it restarts itself.
EMBEDDED_ON_DEAD: OnDead = "restart"
CRASH_SIGNALS = frozenset(
    {signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGILL}
)
# Triton's own line when it catches a signal (2.51: "Signal (11) received.").
SIGNAL_LINE = re.compile(rb"^Signal \((\d+)\) received\.", re.MULTILINE)


class WatchedServer(Protocol):
    """What the counter needs of `server.TritonServer`: its current process, its log, and
    the pids it stopped itself."""

    @property
    def process(self) -> subprocess.Popen[bytes] | None: ...
    @property
    def log_path(self) -> Path: ...
    @property
    def stopped_pids(self) -> set[int]: ...


class RestartableServer(Protocol):
    def start(self, timeout_s: float = ...) -> object: ...
    def stop(self, timeout_s: float = ..., *, graceful: bool = ...) -> None: ...


def start_again(
    server: RestartableServer,
    stop_timeout_s: float = 5.0,
    attempts: int = 10,
    wait_s: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
    *,
    graceful: bool = True,
    start: Callable[[], object] | None = None,
) -> None:
    """Stop ``server`` (without ``graceful``: SIGKILL at once, for a process that crashed
    and has nothing left to finish) and start it again. A start refused because the old
    process's ports are still held ("already in use": `TritonServer.check_host` refuses
    before starting anything) is tried again after ``wait_s``, ``attempts`` times in all:
    once, under a burst, the crashed server's ports were still taken when the restart began
    (by a child it had forked: now ended with its group, `end_process_group`), and the
    launcher gave up (exit 3) instead of serving again. Any other failure is raised.
    ``start``: how to start it (default ``server.start``)."""
    server.stop(timeout_s=stop_timeout_s, graceful=graceful)
    for attempt in range(attempts):
        try:
            (start or server.start)()
            return
        except Exception as exc:
            if "already in use" not in str(exc) or attempt == attempts - 1:
                raise
        sleep(wait_s)


def default_on_dead(requested: str | None, tritonserver: Path | None) -> OnDead:
    """The launcher's policy for a dead server: the one asked for, else ``restart`` for the
    embedded build (no ``--tritonserver``) and ``exit`` for another Triton, whose process
    manager restarts it."""
    if requested is not None:
        if requested not in ("exit", "restart"):
            raise ValueError(f"on_dead must be exit or restart, got {requested!r}")
        return "restart" if requested == "restart" else "exit"
    return EMBEDDED_ON_DEAD if tritonserver is None else "exit"


def crash_signal(returncode: int | None) -> str | None:
    """The name (``SIGSEGV``, ``SIGKILL``) of the signal a process's exit status shows it died
    of, or None: still running or a normal exit. A status of 128 + n (a shell's report of
    signal n) counts as that signal too. Whether the launcher asked for it is the caller's
    to know (`CrashCounter`)."""
    if returncode is None:
        return None
    number = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    try:
        return signal.Signals(number).name if number > 0 else None
    except ValueError:
        return f"signal {number}"


class CrashCounter:
    """Counts the crashes of a server's successive processes (`crash_signal`) from a thread
    polling every ``poll_s``; a process replaced between two polls is still judged by its
    status. ``report`` gets one JSON-ready event per crash."""

    def __init__(
        self,
        server: WatchedServer,
        report: Callable[[dict[str, object]], None],
        poll_s: float = 0.1,
    ) -> None:
        self.server = server
        self.report = report
        self.poll_s = poll_s
        self.crashes: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._watched: subprocess.Popen[bytes] | None = None
        self._judged: set[int] = set()  # pids of the processes already judged (exited)
        self._counted: set[int] = set()  # pids already counted as crashed
        self._log = LogTail()  # the current process's log
        self._poller = Poller("crash_counter", poll_s, self.check)

    def start(self) -> CrashCounter:
        self._poller.start()
        return self

    def stop(self) -> None:
        self._poller.stop()

    def total(self) -> int:
        with self._lock:
            return sum(self.crashes.values())

    def current_crashed(self) -> bool:
        """Whether the server's current process has been counted as crashed: its log says
        it caught a crash signal, and 2.51 may then hang, alive, before it exits."""
        process = self.server.process
        return process is not None and process.pid in self._counted

    def check(self) -> None:
        """One poll: judge the watched process if it exited, read what its log added, and
        watch the current one."""
        current = self.server.process
        previous = self._watched
        if previous is not None and previous is not current:
            self._judge(previous)  # replaced by a restart since the last poll
            self._log.rewind()  # the new process writes a new log
        self._watched = current
        if current is not None:
            self._read_log(current)
            self._judge(current)

    def _judge(self, process: subprocess.Popen[bytes]) -> None:
        code = process.poll()
        if code is None or process.pid in self._judged:
            return
        self._judged.add(process.pid)
        if process.pid in self.server.stopped_pids:
            return  # the launcher stopped it
        name = crash_signal(code)
        if name is not None:
            self._count(process, name, "exit")

    def _read_log(self, process: subprocess.Popen[bytes]) -> None:
        """Count a crash signal Triton reports catching (a process that may live on, hung),
        from what its log gained (`log_watch.LogTail`)."""
        for match in SIGNAL_LINE.finditer(self._log.read(self.server.log_path)):
            number = int(match.group(1))
            if number in CRASH_SIGNALS:
                self._count(process, signal.Signals(number).name, "log")
                return

    def _count(self, process: subprocess.Popen[bytes], name: str, seen_in: str) -> None:
        if process.pid in self._counted:
            return
        self._counted.add(process.pid)
        with self._lock:
            self.crashes[name] += 1
            total = sum(self.crashes.values())
        self.report(
            {
                "event": "server_crashed",
                "signal": name,
                "pid": process.pid,
                "seen_in": seen_in,
                "crashes": total,
            }
        )

    def metrics_text(self) -> str:
        """Prometheus lines: the crashes by signal (a zero SIGSEGV series before any)."""
        with self._lock:
            counts = dict(self.crashes)
        counts.setdefault("SIGSEGV", 0)
        lines = [
            "# HELP dispatch_launcher_server_crashes_total Triton processes that died of a "
            "signal the launcher did not send (each restarted under --on-dead restart).",
            "# TYPE dispatch_launcher_server_crashes_total counter",
        ]
        lines += [
            f'dispatch_launcher_server_crashes_total{{signal="{name}"}} {count}'
            for name, count in sorted(counts.items())
        ]
        return "\n".join(lines) + "\n"
