"""What the launcher's log watchers share (dispatch_service.ops.log_watch): a log read in
whole lines from where the last read stopped, and a polling thread that stops."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from dispatch_service.ops.child_process import LOG_READ_BYTES
from dispatch_service.ops.log_watch import LogTail, Poller


def test_whole_lines_only_from_where_the_last_read_stopped(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"one\ntw")
    tail = LogTail()
    assert tail.read(log) == b"one\n"
    assert tail.read(log) == b""  # "tw" waits for its end
    with log.open("ab") as handle:
        handle.write(b"o\nthree\n")
    assert tail.read(log) == b"two\nthree\n"
    assert tail.offset == log.stat().st_size


def test_a_shorter_log_is_a_new_one_and_rewind_and_skip_to_end(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"a long first line\n")
    tail = LogTail()
    tail.read(log)
    log.write_bytes(b"new\n")  # truncated by a restart
    assert tail.read(log) == b"new\n"
    tail.rewind()
    assert tail.read(log) == b"new\n"
    with log.open("ab") as handle:
        handle.write(b"old\n")
    tail.skip_to_end(log)
    with log.open("ab") as handle:
        handle.write(b"later\n")
    assert tail.read(log) == b"later\n"


def test_a_line_longer_than_a_read_is_skipped_past_and_a_fifo_never_read(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"x" * (LOG_READ_BYTES + 10) + b"\nnext\n")
    tail = LogTail()
    assert len(tail.read(log)) == LOG_READ_BYTES
    assert tail.read(log) == b"x" * 10 + b"\nnext\n"
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert LogTail().read(fifo) == b""  # returns at once: not opened for blocking reads


def test_the_poller_calls_check_from_its_named_thread_until_stopped() -> None:
    names: list[str] = []
    called = threading.Event()

    def check() -> None:
        names.append(threading.current_thread().name)
        called.set()

    poller = Poller("a_watch", 0.01, check)
    poller.start()
    assert called.wait(10)
    poller.stop()
    count = len(names)
    called.clear()
    assert not called.wait(0.1)  # no more calls once stopped
    assert len(names) == count and set(names) == {"a_watch"}
