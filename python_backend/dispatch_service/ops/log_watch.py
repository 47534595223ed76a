"""What the launcher's watchers of Triton's log share (`restart.CrashCounter`,
`request_watch.RequestWatch`): a daemon thread that polls at a period until stopped, and a
tail of the log read in whole lines.

Triton's log is read with `child_process.read_log`: at most `LOG_READ_BYTES` a read, and
nothing from a log that is no regular file (a FIFO or /dev/stdout). A line longer than one
read is skipped past rather than read again forever; a log shorter than the offset reached is
a new one (a restart truncated it) and is read from its start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

from dispatch_service.ops.child_process import LOG_READ_BYTES, read_log

__all__ = ["LogTail", "Poller"]


class Poller:
    """Calls ``check`` every ``poll_s`` from a daemon thread named ``name``, from `start`
    until `stop`."""

    def __init__(self, name: str, poll_s: float, check: Callable[[], None]) -> None:
        self.name = name
        self.poll_s = poll_s
        self.check = check
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check()


class LogTail:
    """The whole lines a log gained since the last `read` (see the module docstring)."""

    def __init__(self) -> None:
        self.offset = 0  # how far the log has been read

    def rewind(self) -> None:
        """Read the next log from its start (a new process writes a new log)."""
        self.offset = 0

    def skip_to_end(self, path: Path) -> None:
        """Read only what ``path`` gains from now on."""
        self.offset = read_log(path, -1)[1]

    def read(self, path: Path) -> bytes:
        """What ``path`` gained since the last read, in whole lines (the rest comes next)."""
        added, size = read_log(path, self.offset)
        if size < self.offset:  # a new log (a restart truncated it)
            self.offset = 0
            added, size = read_log(path, 0)
        end = added.rfind(b"\n") + 1
        if not end and len(added) >= LOG_READ_BYTES:
            end = len(added)  # one line longer than a read: skip past it
        self.offset += end
        return added[:end]
