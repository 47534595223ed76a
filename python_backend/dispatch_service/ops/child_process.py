"""A child process in its own process group, its output in a log file, ready when a URL
answers 200.

The launcher's tritonserver (`server.TritonServer`) is one; the benchmarks' FastAPI baseline
(`perf.sessions`) another, so both start, wait and stop the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Final

from dispatch_service.ops.host import die_with_parent

__all__ = [
    "LOG_READ_BYTES",
    "LOG_TAIL_BYTES",
    "PRIVATE_UMASK",
    "READY_POLL_S",
    "ChildService",
    "ServerError",
    "end_process_group",
    "read_log",
]

PRIVATE_UMASK: Final = 0o077


# The most of a child's log read at once: a tail for a message, the part of a growing log
# read per poll (`restart.CrashCounter`). A log is never read whole: it may be huge.
LOG_TAIL_BYTES: Final = 64 << 10
LOG_READ_BYTES: Final = 4 << 20
# How often a start asks whether the child is ready. A restarted Triton is ready when its
# last stub is set up; each poll waited up to this long on top (a refused connection costs
# either side next to nothing).
READY_POLL_S: Final = 0.05


def read_log(path: Path, offset: int = 0, limit: int = LOG_READ_BYTES) -> tuple[bytes, int]:
    """(up to ``limit`` bytes of ``path`` from ``offset``, the file's size); a negative
    ``offset`` counts from the end. (b"", 0) when it is absent, unreadable or no regular
    file: a FIFO or a device is never read (opened without blocking, refused by its type),
    as where the log goes to /dev/stdout."""
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b"", 0
    try:
        status = os.fstat(handle)
        if not stat.S_ISREG(status.st_mode):
            return b"", 0
        size = status.st_size
        start = max(0, size + offset) if offset < 0 else min(offset, size)
        return os.pread(handle, min(limit, size - start), start), size
    except OSError:
        return b"", 0
    finally:
        os.close(handle)


def end_process_group(pgid: int) -> None:
    """SIGKILL whatever is left of a stopped or crashed server's process group (the server
    runs in a session of its own). Once, after a SIGSEGV under the deadline burst, 2.51 left
    a child it had forked just before (one thread, stuck on a lock before its exec, with
    Triton's signal handlers, so SIGTERM did nothing) holding all three listening sockets:
    every later start on those ports was refused until it was killed by hand."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class ServerError(RuntimeError):
    """A server that did not start, died starting or was refused; the message says why."""


class ChildService:
    """A child process in its own process group, its output in a log file.

    Readiness is an HTTP URL answering 200; stopping signals the whole group (SIGTERM, then
    SIGKILL), so helper processes such as Triton's backend stubs go with it. It runs with
    umask 077 (`PRIVATE_UMASK`), its own children too. Its own group
    shields the child from signals sent to ours, so it is told to stop when its parent dies
    (`host.die_with_parent`): a killed launcher never leaves a Triton behind.
    """

    def __init__(self, log_path: Path, name: str) -> None:
        self.log_path = log_path
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None
        # Pids of the processes this object was asked to stop while they ran: their signal
        # deaths are stops, not crashes (`restart.CrashCounter`).
        self.stopped_pids: set[int] = set()

    def spawn(
        self,
        command: Sequence[str],
        env: dict[str, str],
        cwd: Path | None = None,
        preamble: str = "",
    ) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            log.write(preamble.encode())
            log.flush()
            self.process = subprocess.Popen(
                [*die_with_parent(), *command],
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # What the child creates with a default mode is its owner's alone. Triton
                # 2.51's Python backend sets its shared-memory regions to 0644 explicitly
                # all the same: the shim `TritonServer` preloads keeps them 0600.
                umask=PRIVATE_UMASK,
            )

    @staticmethod
    def http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_http_ok(self, url: str, timeout_s: float) -> None:
        """Wait until `url` answers 200; a dead child or the deadline raises ServerError."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if self.http_ok(url):
                return
            time.sleep(READY_POLL_S)
        self.stop()
        raise ServerError(f"{self.name} not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path.exists() and not self.log_path.is_file():
            return f"(log goes to {self.log_path})"  # e.g. /dev/stdout in the images
        data, size = read_log(self.log_path, -LOG_TAIL_BYTES)
        if not size:
            return "(no log)"
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])

    def stop(self, timeout_s: float = 20.0, *, graceful: bool = True) -> None:
        """SIGTERM the group and wait ``timeout_s``, then SIGKILL it; without ``graceful``,
        SIGKILL at once (nothing left to finish)."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            self.stopped_pids.add(process.pid)  # before the signal: never taken for a crash
            if graceful:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
            else:
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=max(timeout_s, 5.0))
        end_process_group(process.pid)  # what a crash or the stop left of its group

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
