"""The launcher (`python -m dispatch_service.ops.server`) as a child process for tests."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from dispatch_service.core.paths import REPO_ROOT
from dispatch_service.ops.host import proc_stat
from dispatch_service.ops.server import Ports

__all__ = ["EXAMPLE", "Launcher", "free_port", "status"]

EXAMPLE = REPO_ROOT / "client" / "examples" / "window_small.json"


def status(url: str) -> int:
    """The HTTP status ``url`` answers (0 when nothing answers)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Launcher:
    def __init__(self, ports: Ports, log: Path, key_dir: Path, *extra: str) -> None:
        self.ports = ports
        if "--health-port" not in extra:
            # Not the default (metrics port + 1): on a busy host that port may be taken by
            # some connection's local end, and a fresh-clone CI run saw the start fail so.
            extra = (*extra, "--health-port", str(free_port()))
        argv = [
            sys.executable,
            "-m",
            "dispatch_service.ops.server",
            "--http-port",
            str(ports.http),
            "--grpc-port",
            str(ports.grpc),
            "--metrics-port",
            str(ports.metrics),
            "--log",
            str(log),
            "--key-dir",
            str(key_dir),
            *extra,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
        self.process = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        self.lines: list[str] = []

    def read_until(self, marker: str, timeout_s: float) -> bool:
        """Collect stdout lines until one starts with ``marker`` or the process ends.

        Reads the pipe a byte at a time below Python's buffering: a buffered readline may
        take several lines at once, and `select` then waits on an empty pipe while the
        marker sits in the buffer. Nothing past the marker's line is consumed, so a later
        reader of ``process.stdout`` gets every following line.
        """
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        line = bytearray()
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1.0)
            if not ready:
                continue
            byte = os.read(fd, 1)
            if not byte:
                return False
            if byte != b"\n":
                line += byte
                continue
            text = line.decode("utf-8", "replace")
            line.clear()
            self.lines.append(text)
            if text.startswith(marker):
                return True
        return False

    def children(self, name: str) -> list[int]:
        """Pids of this launcher's child processes whose command name is ``name``."""
        found = []
        for pid_dir in Path("/proc").glob("[0-9]*"):
            stat = proc_stat(pid_dir)
            if stat is not None and stat.parent == self.process.pid and stat.name == name:
                found.append(int(pid_dir.name))
        return found

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return int(self.process.returncode)
