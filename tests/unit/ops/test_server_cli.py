"""The launcher's command line (dispatch_service.ops.server_cli) without a real tritonserver:
keys, refusals and warnings before a start, exit codes, events, signals.

The stand-in "tritonserver" scripts are in fake_tritonserver.py.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from fake_tritonserver import FAKE_READY_SERVER, write_script

from dispatch_service.ops.host import process_ended
from dispatch_service.ops.keys import KeyFileError
from dispatch_service.ops.server import Ports
from dispatch_service.ops.server_cli import build_parser, event_printer, main, resolve_keys


def test_main_reports_an_incomplete_runtime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "--venv",
            str(tmp_path / "no-venv"),
            "--backend-dir",
            str(tmp_path / "no-backends"),
            "--log",
            str(tmp_path / "server.log"),
            "--http-port",
            str(Ports.free().http),
            "--key-dir",
            str(tmp_path / "keys"),
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: Triton runtime incomplete")
    assert "make setup" in err


def test_the_launcher_refuses_a_triton_arg_beyond_loopback_and_warns_when_exposed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    install = tmp_path / "opt"  # a stand-in server that exits at once
    write_script(install / "bin" / "tritonserver", "#!/bin/sh\nexit 7\n")
    (install / "lib").mkdir()
    (install / "backends" / "python").mkdir(parents=True)
    ports = Ports.free()
    base = [
        "--key-dir",
        str(tmp_path / "keys"),
        "--tritonserver",
        str(install / "bin" / "tritonserver"),
    ]
    base += ["--log", str(tmp_path / "log"), "--http-port", str(ports.http)]
    base += ["--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics)]
    bind = "--triton-arg=--metrics-address=0.0.0.0"
    assert main([*base, bind], out=io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "refusing to listen beyond loopback (--metrics-address=0.0.0.0)" in err
    assert not (tmp_path / "log").exists()
    # --expose lets it through (to the stand-in, which exits) with a warning first.
    assert main([*base, bind, "--expose"], out=io.StringIO()) == 1
    err = capsys.readouterr().err
    assert "warning: exposing --metrics-address=0.0.0.0" in err and "exited with 7" in err


def launcher_args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    return build_parser().parse_args(["--key-dir", str(tmp_path / "keys"), *extra])


def test_missing_keys_are_created_and_their_paths_printed_never_the_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("DISPATCH_ADMIN_KEY", "DISPATCH_SHM_KEY", "DISPATCH_ADMIN_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("DISPATCH_SHM_KEY_FILE", raising=False)
    out = io.StringIO()
    keys = resolve_keys(launcher_args(tmp_path), out)
    text = out.getvalue()
    assert (
        str(tmp_path / "keys" / "admin.key") in text and str(tmp_path / "keys" / "shm.key") in text
    )
    assert keys.admin not in text and keys.shm not in text
    again = resolve_keys(launcher_args(tmp_path), io.StringIO())
    assert again == keys  # the same keys on the next start


def test_keys_from_the_environment_win_and_images_refuse_to_run_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_ADMIN_KEY", "from-env-admin")
    monkeypatch.setenv("DISPATCH_SHM_KEY", "from-env-shm")
    keys = resolve_keys(launcher_args(tmp_path, "--no-create-keys"), io.StringIO())
    assert (keys.admin, keys.shm) == ("from-env-admin", "from-env-shm")
    assert not (tmp_path / "keys").exists()
    monkeypatch.delenv("DISPATCH_SHM_KEY")
    monkeypatch.delenv("DISPATCH_SHM_KEY_FILE", raising=False)
    with pytest.raises(KeyFileError, match="no shared-memory key"):
        resolve_keys(launcher_args(tmp_path, "--no-create-keys"), io.StringIO())


def test_a_failed_start_limit_below_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--on-dead", "restart", "--max-failed-starts", "0", "--tritonserver", "/nonexistent"])
    assert stopped.value.code == 2
    assert "--max-failed-starts must be >= 1, got 0" in capsys.readouterr().err


def test_events_into_a_closed_pipe_do_not_stop_the_launcher() -> None:
    """A parent that stopped reading: the drain's events raised BrokenPipeError and the
    launcher exited with its Triton still running."""
    read, write = os.pipe()
    os.close(read)
    broken = os.fdopen(write, "w")
    report = event_printer(broken)
    report('{"event": "drain_started"}')  # EPIPE (Python ignores SIGPIPE): swallowed
    with contextlib.suppress(BrokenPipeError):  # the line still buffered fails once more
        broken.close()
    report('{"event": "drain_finished"}')  # a closed file: swallowed too


class SignalOnReady(io.StringIO):
    """The launcher's output, read by a caller that sends SIGHUP as soon as "ready:" appears.
    Records the handlers in place at that moment."""

    def __init__(self) -> None:
        super().__init__()
        self.handlers_at_ready: dict[str, object] | None = None

    def write(self, text: str) -> int:
        if "ready:" in text and self.handlers_at_ready is None:
            self.handlers_at_ready = {s.name: signal.getsignal(s) for s in STOP_SIGNALS}
            # With SIGHUP unhandled, its default action would end the test process: a later
            # signal then still stops the launcher, and the assertion below says what was wrong.
            unhandled = self.handlers_at_ready["SIGHUP"] == signal.SIG_DFL
            threading.Timer(
                1.0 if unhandled else 0.0, os.kill, (os.getpid(), signal.SIGHUP)
            ).start()
        return super().write(text)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def test_a_signal_sent_on_ready_drains_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI sent SIGHUP the moment it read "ready:", before the handlers were installed: the
    launcher died of the default action with exit -1 instead of draining."""
    monkeypatch.setenv("FAKE_TRITON_REPORT", str(tmp_path / "report.json"))
    tritonserver = write_script(
        tmp_path / "install" / "bin" / "tritonserver", f"#!{sys.executable}\n{FAKE_READY_SERVER}"
    )
    (tmp_path / "install" / "lib").mkdir()
    (tmp_path / "install" / "backends" / "python").mkdir(parents=True)
    ports = Ports.free()
    out = SignalOnReady()
    saved = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        code = main(
            [
                "--tritonserver",
                str(tritonserver),
                "--log",
                str(tmp_path / "server.log"),
                "--http-port",
                str(ports.http),
                "--grpc-port",
                str(ports.grpc),
                "--metrics-port",
                str(ports.metrics),
                "--health-port",
                str(Ports.free().http),
                "--key-dir",
                str(tmp_path / "keys"),
                "--drain-timeout",
                "1",
                "--require",
                "",  # the fake answers readiness only, not a window
            ],
            out,
        )
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    assert out.handlers_at_ready is not None, out.getvalue()
    assert not [
        name for name, h in out.handlers_at_ready.items() if h == saved[signal.Signals[name]]
    ]
    assert code == 0, out.getvalue()
    assert "tritonserver stopped" in out.getvalue()


def test_a_drain_that_never_ends_still_stops_the_server_and_the_launcher(tmp_path: Path) -> None:
    """A launcher stuck in its drain (3 of 9 SIGTERMs printed no drain_started in 60 s) is
    ended by `stop_regardless`: its server's group killed, the launcher exited 1."""
    pid_file = tmp_path / "server.pid"
    script = f"""
import os, sys, time
from pathlib import Path
from dispatch_service.ops.child_process import ChildService
from dispatch_service.ops.server_cli import stop_regardless
server = ChildService(Path({str(tmp_path / "child.log")!r}), "sleeper")
server.spawn([sys.executable, "-c", "import time; time.sleep(120)"], dict(os.environ))
Path({str(pid_file)!r}).write_text(str(server.process.pid))
stop_regardless(server, 0.5)
time.sleep(120)  # a drain that never ends
"""
    launcher = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert launcher.returncode == 1, launcher.stderr
    assert "the drain did not end in 0 s: killing tritonserver" in launcher.stderr
    child = int(pid_file.read_text())
    assert process_ended(child, timeout_s=10)
