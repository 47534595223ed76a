"""dispatch_service.ops.restart: the embedded build's default policy and the crash counter."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dispatch_service.ops.child_process import LOG_READ_BYTES, ChildService, read_log
from dispatch_service.ops.restart import (
    EMBEDDED_ON_DEAD,
    CrashCounter,
    crash_signal,
    default_on_dead,
    end_process_group,
    start_again,
)
from dispatch_service.ops.server_cli import build_parser


def test_the_embedded_build_restarts_by_default_another_triton_exits() -> None:
    assert EMBEDDED_ON_DEAD == "restart"
    assert default_on_dead(None, None) == "restart"
    assert default_on_dead(None, Path("/opt/tritonserver/bin/tritonserver")) == "exit"


@pytest.mark.parametrize("asked", ["exit", "restart"])
def test_an_explicit_policy_wins(asked: str) -> None:
    assert default_on_dead(asked, None) == asked
    assert default_on_dead(asked, Path("/opt/tritonserver/bin/tritonserver")) == asked


def test_the_launcher_leaves_the_policy_to_the_build_unless_told() -> None:
    assert build_parser().parse_args([]).on_dead is None
    assert build_parser().parse_args(["--on-dead", "exit"]).on_dead == "exit"


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="exit or restart"):
        default_on_dead("retry", None)


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (-signal.SIGSEGV, "SIGSEGV"),
        (-signal.SIGABRT, "SIGABRT"),
        (-signal.SIGBUS, "SIGBUS"),
        (128 + signal.SIGSEGV, "SIGSEGV"),  # a shell's report of the same death
        (None, None),  # still running
        (0, None),
        (1, None),
        (-signal.SIGTERM, "SIGTERM"),
        (-signal.SIGKILL, "SIGKILL"),  # an OOM kill
        (128 + signal.SIGKILL, "SIGKILL"),
    ],
)
def test_every_signal_death_is_named(code: int | None, name: str | None) -> None:
    assert crash_signal(code) == name


class FakeServer:
    def __init__(self, log_path: Path = Path("/nonexistent/server.log")) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = log_path
        self.stopped_pids: set[int] = set()


def dying(sig: signal.Signals) -> subprocess.Popen[bytes]:
    """A child that ends itself with ``sig`` (waited for: its status is known)."""
    process = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.kill(os.getpid(), {int(sig)})"],
    )
    process.wait(timeout=30)
    return process


def test_each_crashed_process_is_counted_once_by_signal() -> None:
    server = FakeServer()
    events: list[dict[str, object]] = []
    counter = CrashCounter(server, events.append)
    counter.check()  # no process yet
    server.process = dying(signal.SIGSEGV)
    counter.check()
    counter.check()  # the same dead process again: not counted twice
    # A restart replaced the next one between two polls: still judged by its status.
    server.process = dying(signal.SIGABRT)
    server.process = dying(signal.SIGTERM)
    server.stopped_pids.add(server.process.pid)  # a stop the launcher asked for
    counter.check()
    counter.check()
    assert dict(counter.crashes) == {"SIGSEGV": 1}
    # The SIGABRT one was never seen by a poll: only what a poll saw is judged.
    server.process = dying(signal.SIGABRT)
    counter.check()
    assert dict(counter.crashes) == {"SIGSEGV": 1, "SIGABRT": 1}
    assert counter.total() == 2
    assert [(e["event"], e["signal"], e["crashes"]) for e in events] == [
        ("server_crashed", "SIGSEGV", 1),
        ("server_crashed", "SIGABRT", 2),
    ]


def test_a_process_replaced_after_a_poll_is_judged_at_the_next() -> None:
    server = FakeServer()
    counter = CrashCounter(server, lambda event: None)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        server.process = alive
        counter.check()  # running: nothing to judge yet
        alive.send_signal(signal.SIGSEGV)
        alive.wait(timeout=30)
        server.process = dying(signal.SIGTERM)  # the restart's new process (stopped)
        server.stopped_pids.add(server.process.pid)
        counter.check()
    finally:
        if alive.poll() is None:
            alive.kill()
            alive.wait(timeout=30)
    assert dict(counter.crashes) == {"SIGSEGV": 1}


def test_the_metric_has_a_zero_series_before_any_crash_and_counts_by_signal() -> None:
    server = FakeServer()
    counter = CrashCounter(server, lambda event: None)
    assert 'dispatch_launcher_server_crashes_total{signal="SIGSEGV"} 0' in counter.metrics_text()
    server.process = dying(signal.SIGABRT)
    counter.check()
    text = counter.metrics_text()
    assert "# TYPE dispatch_launcher_server_crashes_total counter" in text
    assert 'dispatch_launcher_server_crashes_total{signal="SIGABRT"} 1' in text
    assert 'dispatch_launcher_server_crashes_total{signal="SIGSEGV"} 0' in text


def test_the_watch_thread_counts_and_stops() -> None:
    server = FakeServer()
    events: list[dict[str, object]] = []
    counter = CrashCounter(server, events.append, poll_s=0.01).start()
    try:
        server.process = dying(signal.SIGSEGV)
        for _ in range(500):  # bounded: up to 500 polls of the thread
            if events:
                break
            threading.Event().wait(0.01)
    finally:
        counter.stop()
    assert counter.total() == 1


def test_a_kill_9_counts_as_sigkill_and_the_launchers_own_stop_does_not(tmp_path: Path) -> None:
    """An OOM kill is a SIGKILL and is counted as a crash. The launcher's
    own stop signals the group too, and must not count."""
    server = ChildService(tmp_path / "child.log", "sleeper")
    events: list[dict[str, object]] = []
    counter = CrashCounter(server, events.append)
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    server.spawn(sleep, dict(os.environ))
    counter.check()
    server.stop(timeout_s=5)  # SIGTERM from the launcher
    server.spawn(sleep, dict(os.environ))
    counter.check()
    server.stop(graceful=False)  # the drain's SIGKILL
    server.spawn(sleep, dict(os.environ))
    counter.check()
    assert server.process is not None
    os.kill(server.process.pid, signal.SIGKILL)  # someone else's kill -9
    server.process.wait(timeout=30)
    counter.check()
    server.stop()
    assert dict(counter.crashes) == {"SIGKILL": 1}
    assert [(e["event"], e["signal"]) for e in events] == [("server_crashed", "SIGKILL")]


def test_a_crash_signal_triton_caught_and_lived_on_counts_once(tmp_path: Path) -> None:
    # 2.51 prints "Signal (11) received." and may hang instead of dying: the log tells.
    log = tmp_path / "server.log"
    log.write_bytes(b"I1203 started\nSignal (15) received.\n")
    server = FakeServer(log)
    events: list[dict[str, object]] = []
    counter = CrashCounter(server, events.append)
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        server.process = hung
        counter.check()
        assert counter.total() == 0  # SIGTERM is a stop, not a crash
        with log.open("ab") as out:
            out.write(b"Signal (11) received.\nSignal (1")  # a line still being written
        counter.check()
        counter.check()
        assert dict(counter.crashes) == {"SIGSEGV": 1}
        hung.send_signal(signal.SIGSEGV)  # and then it dies of it: still one crash
        hung.wait(timeout=30)
        counter.check()
    finally:
        if hung.poll() is None:
            hung.kill()
            hung.wait(timeout=30)
    assert dict(counter.crashes) == {"SIGSEGV": 1}
    assert [(e["signal"], e["seen_in"]) for e in events] == [("SIGSEGV", "log")]


def test_a_restarted_servers_new_log_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"x" * 4096 + b"\n")
    server = FakeServer(log)
    counter = CrashCounter(server, lambda event: None)
    server.process = dying(signal.SIGTERM)
    server.stopped_pids.add(server.process.pid)
    counter.check()
    log.write_bytes(b"Signal (6) received.\n")  # the next process's log, shorter
    server.process = subprocess.Popen([sys.executable, "-c", "pass"])
    server.process.wait(timeout=30)
    counter.check()
    assert dict(counter.crashes) == {"SIGABRT": 1}


class Restartable:
    def __init__(self, refusals: list[str]) -> None:
        self.refusals = refusals
        self.calls: list[str] = []

    def stop(self, timeout_s: float = 20.0, *, graceful: bool = True) -> None:
        self.calls.append(f"stop {timeout_s:g}" if graceful else "kill")

    def start(self, timeout_s: float = 120.0) -> object:
        self.calls.append("start")
        if self.refusals:
            raise RuntimeError(self.refusals.pop(0))
        return self


def test_a_restart_waits_out_ports_the_old_server_still_holds() -> None:
    server = Restartable(["port(s) 8000 on 127.0.0.1 already in use (another server?)"] * 2)
    waits: list[float] = []
    start_again(server, sleep=waits.append)
    assert server.calls == ["stop 5", "start", "start", "start"]
    assert waits == [1.0, 1.0]


def test_a_crashed_server_is_killed_not_waited_for() -> None:
    server = Restartable([])
    start_again(server, graceful=False)
    assert server.calls == ["kill", "start"]


def test_a_restart_gives_up_on_ports_after_its_attempts_and_on_any_other_error() -> None:
    held = Restartable(["already in use"] * 5)
    with pytest.raises(RuntimeError, match="already in use"):
        start_again(held, attempts=3, sleep=lambda s: None)
    assert held.calls.count("start") == 3
    broken = Restartable(["tritonserver exited with 1"])
    with pytest.raises(RuntimeError, match="exited"):
        start_again(broken, sleep=lambda s: None)
    assert broken.calls.count("start") == 1


LEFTOVER = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a child forked with Triton's handlers
child = os.fork()
if child == 0:
    time.sleep(60)
    os._exit(0)
print(child, flush=True)
os._exit(int(sys.argv[1]))
"""


def leftover_group(exit_code: int) -> tuple[subprocess.Popen[bytes], int]:
    """A session leader that exits at once, leaving a child that ignores SIGTERM."""
    leader = subprocess.Popen(
        [sys.executable, "-c", LEFTOVER, str(exit_code)],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert leader.stdout is not None
    child = int(leader.stdout.readline())
    leader.wait(timeout=30)
    leader.stdout.close()
    return leader, child


def gone(pid: int) -> bool:
    for _ in range(100):  # bounded: the kernel reaps an orphan through init
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        threading.Event().wait(0.05)
    return False


def test_what_a_crashed_server_left_in_its_group_is_ended() -> None:
    leader, child = leftover_group(-signal.SIGSEGV % 256)
    try:
        assert not gone(child)
        end_process_group(leader.pid)
        assert gone(child)
        end_process_group(leader.pid)  # nothing left: no error
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_stopping_a_server_whose_process_already_died_ends_its_group(tmp_path: Path) -> None:
    service = ChildService(tmp_path / "child.log", "tritonserver")
    leader, child = leftover_group(0)
    service.process = leader
    try:
        service.stop(timeout_s=5)
        assert gone(child)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_a_child_and_its_children_create_files_private_from_the_first_byte(
    tmp_path: Path,
) -> None:
    """The server and its stubs start with umask 077: what they create with a default mode
    is never open to another local user, not even for a moment."""
    child = ChildService(tmp_path / "child.log", "umask")
    grandchild = f"open({str(tmp_path / 'made_by_grandchild')!r}, 'w').close()"
    script = (
        "import subprocess, sys\n"
        f"open({str(tmp_path / 'made_by_child')!r}, 'w').close()\n"
        f"subprocess.run([sys.executable, '-c', {grandchild!r}], check=True)\n"
    )
    child.spawn([sys.executable, "-c", script], dict(os.environ))
    assert child.process is not None
    assert child.process.wait(timeout=30) == 0, child.log_tail()
    child.stop()
    for name in ("made_by_child", "made_by_grandchild"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o600, name


def test_the_log_is_read_a_bounded_part_at_a_time_and_never_when_not_a_file(
    tmp_path: Path,
) -> None:
    """A 1 GiB log (one endless line) is read LOG_READ_BYTES a poll, never whole; a FIFO in
    its place neither blocks the counter nor is read."""
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        out.truncate(1 << 30)  # sparse: 1 GiB of zeros, no newline
    server = FakeServer(log)
    counter = CrashCounter(server, lambda event: None)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as running:
        try:
            server.process = running
            counter.check()
            assert counter._log.offset == LOG_READ_BYTES
            counter.check()
            assert counter._log.offset == 2 * LOG_READ_BYTES
            log.unlink()
            os.mkfifo(log)
            done = threading.Event()
            threading.Thread(target=lambda: (counter.check(), done.set()), daemon=True).start()
            assert done.wait(10), "the counter blocked on a FIFO"
            assert read_log(log) == (b"", 0)
            assert counter.total() == 0
        finally:
            running.kill()


def test_a_server_that_caught_a_crash_signal_and_lives_on_is_said_crashed(tmp_path: Path) -> None:
    """2.51 prints "Signal (11) received." and may hang before it exits: readiness must not
    wait for the exit (`Supervisor.crash_seen`)."""
    log = tmp_path / "server.log"
    log.write_bytes(b"I1203 started\n")
    server = FakeServer(log)
    counter = CrashCounter(server, lambda event: None)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as hung:
        try:
            server.process = hung
            counter.check()
            assert not counter.current_crashed()
            with log.open("ab") as out:
                out.write(b"Signal (11) received.\n")
            counter.check()
            assert counter.current_crashed()
        finally:
            hung.kill()
