"""Start and stop this repository's tritonserver (the `cpu` profile's embedded Triton 2.51).

Used by `make serve`, the integration-test fixture and the benchmarks, so all three start
the server the same way. The runtime comes from the `nvidia-pytriton` wheel in the venv;
`scripts/setup.sh` lays out its Python backend folder.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from dispatch_service.paths import MODEL_REPOSITORY, REPO_ROOT

ADMIN_KEY_HEADER = "admin-key"


@dataclass(frozen=True)
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def free(cls) -> Ports:
        """Three distinct loopback ports nobody listens on right now."""
        sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(3)]
        try:
            for sock in sockets:  # held open together, so the three differ
                sock.bind(("127.0.0.1", 0))
            http, grpc, metrics = (int(sock.getsockname()[1]) for sock in sockets)
        finally:
            for sock in sockets:
                sock.close()
        return cls(http, grpc, metrics)


@dataclass(frozen=True)
class TritonRuntime:
    """Where the server binary, its libraries and the Python backend folder are."""

    tritonserver: Path
    library_path: Path
    backend_dir: Path
    python_bin_dir: Path  # the stub finds numpy & co. through `python3` on PATH

    @classmethod
    def from_venv(cls, venv: Path, backend_dir: Path) -> TritonRuntime:
        site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        return cls(
            tritonserver=site / "pytriton" / "tritonserver" / "bin" / "tritonserver",
            library_path=site / "nvidia_pytriton.libs",
            backend_dir=backend_dir,
            python_bin_dir=venv / "bin",
        )

    def check(self) -> None:
        missing = [
            str(path)
            for path in (self.tritonserver, self.library_path, self.backend_dir / "python")
            if not path.exists()
        ]
        if missing:
            raise FileNotFoundError(
                f"Triton runtime incomplete ({', '.join(missing)} missing): run `make setup`"
            )


@dataclass
class ServerOptions:
    model_repository: Path = MODEL_REPOSITORY
    ports: Ports = field(default_factory=Ports)
    profile: str = "cpu"
    # Explicit control so operators can load/unload versions live; "*" loads everything.
    model_control: str = "explicit"
    load_models: Sequence[str] = ("*",)
    # Load/unload endpoints answer only callers presenting this key (header `admin-key`).
    admin_key: str | None = None
    extra_args: Sequence[str] = ()
    host: str = "127.0.0.1"


class ServerError(RuntimeError):
    pass


class TritonServer:
    """A tritonserver child process; a context manager that always stops it."""

    def __init__(self, runtime: TritonRuntime, options: ServerOptions, log_path: Path) -> None:
        self.runtime = runtime
        self.options = options
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def http_url(self) -> str:
        return f"{self.options.host}:{self.options.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.options.host}:{self.options.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.options.host}:{self.options.ports.metrics}/metrics"

    def command(self) -> list[str]:
        opts = self.options
        args = [
            str(self.runtime.tritonserver),
            f"--model-repository={opts.model_repository}",
            f"--backend-directory={self.runtime.backend_dir}",
            f"--http-address={opts.host}",
            f"--grpc-address={opts.host}",
            f"--metrics-address={opts.host}",
            f"--http-port={opts.ports.http}",
            f"--grpc-port={opts.ports.grpc}",
            f"--metrics-port={opts.ports.metrics}",
            f"--model-config-name={opts.profile}",
            f"--model-control-mode={opts.model_control}",
            # Several servers (tests, benchmarks) may share /dev/shm: keep regions apart.
            f"--backend-config=python,shm-region-prefix-name=dispatch{opts.ports.http}_",
            "--backend-config=python,shm-default-byte-size=4194304",
            "--backend-config=python,shm-growth-byte-size=4194304",
            "--strict-readiness=true",
            "--exit-timeout-secs=10",
            "--log-verbose=0",
        ]
        if opts.load_models and opts.model_control != "explicit":
            raise ValueError("load_models needs model_control='explicit'")
        args += [f"--load-model={name}" for name in opts.load_models]
        if opts.admin_key:
            args += [
                f"--http-restricted-api=model-repository:{ADMIN_KEY_HEADER}={opts.admin_key}",
                f"--grpc-restricted-protocol=model-repository:{ADMIN_KEY_HEADER}={opts.admin_key}",
            ]
        args += list(opts.extra_args)
        return args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.runtime.python_bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["LD_LIBRARY_PATH"] = str(self.runtime.library_path)
        return env

    def start(self, timeout_s: float = 120.0) -> TritonServer:
        self.runtime.check()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,
            )
        self.wait_ready(timeout_s)
        return self

    def is_ready(self) -> bool:
        url = f"http://{self.http_url}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(
                    f"tritonserver exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if self.is_ready():
                return
            time.sleep(0.25)
        self.stop()
        raise ServerError(f"tritonserver not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 20.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=timeout_s)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """`make serve`: start the server in the foreground and print the endpoints."""
    parser = argparse.ArgumentParser(description="Serve the dispatch model repository")
    parser.add_argument("--venv", type=Path, default=REPO_ROOT / ".venv")
    parser.add_argument("--backend-dir", type=Path, default=REPO_ROOT / ".triton" / "backends")
    parser.add_argument("--model-repository", type=Path, default=MODEL_REPOSITORY)
    parser.add_argument("--profile", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument("--log", type=Path, default=REPO_ROOT / ".triton" / "server.log")
    args = parser.parse_args(argv)
    options = ServerOptions(
        model_repository=args.model_repository,
        ports=Ports(args.http_port, args.grpc_port, args.metrics_port),
        profile=args.profile,
        host=args.host,
    )
    server = TritonServer(TritonRuntime.from_venv(args.venv, args.backend_dir), options, args.log)
    print(f"starting tritonserver (profile {args.profile}), log: {args.log}", flush=True)
    try:
        server.start()
    except (ServerError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"ready: HTTP http://{server.http_url}  gRPC {server.grpc_url}  "
        f"metrics {server.metrics_url}\nCtrl-C stops it.",
        flush=True,
    )
    stop = False

    def _stop(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stop and server.process is not None and server.process.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    code = server.process.returncode if server.process is not None else 0
    server.stop()
    print("tritonserver stopped", flush=True)
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
