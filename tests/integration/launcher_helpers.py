"""The launcher (`python -m dispatch_service.ops.server`) as a child process for tests."""

from __future__ import annotations

import contextlib
import io
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from patience import patience

from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.core.repository_layout import ONNX_FILE, SCORING_MODEL, model_layout
from dispatch_service.core.signing import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    generate_private_key,
    private_key_pem,
    public_key_pem,
)
from dispatch_service.ops import admin, triton_runtime
from dispatch_service.ops.host import proc_stat
from dispatch_service.ops.server import Ports

__all__ = [
    "EXAMPLE",
    "Launcher",
    "SharedLauncher",
    "free_port",
    "signed_repository",
    "status",
    "worse_version",
]

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


def signed_repository(root: Path) -> tuple[Path, Path, Path]:
    """A copy of the model repository signed with a fresh key (by `dispatch-admin
    sign-repository`); (repository, trusted keys folder, signing key file)."""
    repository = root / "repo"
    shutil.copytree(
        MODEL_REPOSITORY,
        repository,
        ignore=shutil.ignore_patterns("__pycache__", MANIFEST_NAME, SIGNATURE_NAME),
    )
    key = generate_private_key()
    key_file = root / "signing.key"
    key_file.write_bytes(private_key_pem(key))
    key_file.chmod(0o600)
    trusted = root / "trusted_keys"
    trusted.mkdir()
    (trusted / "ops.pub").write_bytes(public_key_pem(key.public_key()))
    code = admin.main(["sign-repository", str(repository), "--key", str(key_file)], io.StringIO())
    assert code == 0
    return repository, trusted, key_file


def worse_version(repository: Path, key_file: Path, version: int) -> None:
    """Version ``version`` of the scoring model: version 1's files, its model's outputs mapped
    (eta, p, cost) -> (200 - eta, 1 - p, cost), so it prefers the riders version 1 finds
    slowest; the repository signed again with ``key_file``."""
    scoring = model_layout(repository, SCORING_MODEL)
    shutil.copytree(scoring.version(1), scoring.version(version))
    path = scoring.version(version) / ONNX_FILE
    model = onnx.load(path)
    graph = model.graph
    out = graph.output[0].name
    raw = f"{out}_before_worse"
    for node in graph.node:
        node.output[:] = [raw if name == out else name for name in node.output]
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array([-1, -1, 1], np.float32), "worse_scale"),
            numpy_helper.from_array(np.array([200, 1, 0], np.float32), "worse_shift"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("Mul", [raw, "worse_scale"], ["worse_scaled"]),
            helper.make_node("Add", ["worse_scaled", "worse_shift"], [out]),
        ]
    )
    onnx.checker.check_model(model)
    onnx.save(model, path)
    code = admin.main(["sign-repository", str(repository), "--key", str(key_file)], io.StringIO())
    assert code == 0


def free_port() -> int:
    return triton_runtime.free_port()


class Launcher:
    def __init__(self, ports: Ports, log: Path, key_dir: Path, *extra: str) -> None:
        self.ports = ports
        if "--health-port" not in extra:
            # Not the default (metrics port + 1): on a busy host that port may be taken by
            # some connection's local end, and a fresh-clone CI run saw the start fail so.
            extra = (*extra, "--health-port", str(free_port()))
        if "--outcome-store" not in extra and "--no-outcomes" not in extra:
            # The decision records of this launcher's windows stay with its log, out of the
            # checkout's state folder (the default).
            extra = (*extra, "--outcome-store", str(log.parent / "outcomes.sqlite3"))
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
        self._reader: threading.Thread | None = None
        self.key_dir = key_dir
        self.health_url = f"http://127.0.0.1:{extra[extra.index('--health-port') + 1]}"

    @property
    def admin_key(self) -> str:
        return (self.key_dir / "admin.key").read_text().strip()

    def keep_reading(self) -> None:
        """Collect the launcher's later stdout lines in the background (into ``lines``), so
        that a launcher kept for several tests never blocks on a full pipe."""
        self._reader = threading.Thread(target=self.read_until, args=("\0", 3600), daemon=True)
        self._reader.start()

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
        if self._reader is not None:  # at the end of its output: closing it under it would fail
            self._reader.join(timeout=10)
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        return int(self.process.returncode)


class SharedLauncher:
    """One launcher for several tests of a module (a start is about 10 CPU-seconds of stubs),
    ready when `get` returns it; started again, in a folder of its own, for the next test
    where one has ended it (so a test that stops it may run in any place)."""

    def __init__(self, folder: Path, *extra: str) -> None:
        self.folder, self.extra = folder, extra
        self.launcher: Launcher | None = None
        self.starts = 0

    def get(self) -> Launcher:
        if self.launcher is None or self.launcher.process.poll() is not None:
            self.stop()
            folder = self.folder / f"launcher-{self.starts}"
            folder.mkdir()
            self.starts += 1
            self.launcher = Launcher(
                Ports.free(), folder / "server.log", folder / "keys", *self.extra
            )
            if not self.launcher.read_until("ready:", patience(240)):
                process, error = self.launcher.process, ""
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=30)  # its output ended: it is exiting, say why
                    error = process.stderr.read() if process.stderr is not None else ""
                self.launcher.stop()
                raise AssertionError("\n".join([*self.launcher.lines, error]))
        return self.launcher

    def stop(self) -> None:
        if self.launcher is not None:
            self.launcher.stop()
