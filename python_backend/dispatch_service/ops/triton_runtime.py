"""Where a tritonserver listens (`Ports`) and which runtime it is (`TritonRuntime`): the
embedded build of the `nvidia-pytriton` wheel, or a stock install such as the NGC image's.
`server.TritonServer` starts one from these."""

from __future__ import annotations

import random
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dispatch_service.core.paths import REPO_ROOT

__all__ = ["PRIVATE_SHM_SHIM", "Ports", "TritonRuntime", "free_port"]

# The LD_PRELOAD shim `make setup` builds from native/private_shm.c: Triton and its stubs
# then create their /dev/shm regions 0600, where Triton 2.51's Python backend sets 0644.
PRIVATE_SHM_SHIM = REPO_ROOT / ".triton" / "lib" / "libdispatch_private_shm.so"


@dataclass(frozen=True)
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def free(cls) -> Ports:
        """Three distinct loopback ports nobody listens on right now (`free_port`)."""
        chosen: list[int] = []
        while len(chosen) < 3:
            port = free_port()
            if port not in chosen:
                chosen.append(port)
        http, grpc, metrics = chosen
        return cls(http, grpc, metrics)


# Ports for servers are drawn below the kernel's ephemeral range: a port drawn from it
# (bind to 0) is free only until some process's outgoing connection takes it, and with
# tests starting servers in two processes beside thousands of client connections, a
# server's port was taken before it bound ("address already in use").
_LISTEN_PORTS_FROM: Final = 10_000


def free_port(*, rng: random.Random | None = None) -> int:
    """A loopback port nobody listens on right now, below the ephemeral range where the
    host leaves room for it (else the kernel's pick)."""
    draw = rng or random.SystemRandom()
    below = _ephemeral_start()
    for _ in range(100 if below - _LISTEN_PORTS_FROM >= 1_000 else 0):
        port = draw.randrange(_LISTEN_PORTS_FROM, below)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_start(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _LISTEN_PORTS_FROM  # unknown: no range of our own


@dataclass(frozen=True)
class TritonRuntime:
    """Where the server binary, its libraries and the Python backend folder are."""

    tritonserver: Path
    library_path: Path
    backend_dir: Path
    python_bin_dir: Path  # the stub finds numpy & co. through `python3` on PATH
    # Preloaded into Triton (its stubs inherit it) when present: `PRIVATE_SHM_SHIM`.
    private_shm_shim: Path = PRIVATE_SHM_SHIM

    @classmethod
    def from_venv(cls, venv: Path | None = None, backend_dir: Path | None = None) -> TritonRuntime:
        """The wheel's server in ``venv`` (default: the running one) with the backend folder
        `make setup` lays out (default: `.triton/backends` of this repository)."""
        venv = venv or Path(sys.prefix)
        backend_dir = backend_dir or REPO_ROOT / ".triton" / "backends"
        site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        return cls(
            tritonserver=site / "pytriton" / "tritonserver" / "bin" / "tritonserver",
            library_path=site / "nvidia_pytriton.libs",
            backend_dir=backend_dir,
            python_bin_dir=venv / "bin",
        )

    @classmethod
    def from_install(cls, tritonserver: Path, python_bin_dir: Path) -> TritonRuntime:
        """A stock install such as the NGC image's /opt/tritonserver/bin/tritonserver: its own
        lib/ and backends/ (which hold the native onnxruntime backend the `gpu` profile uses)."""
        root = tritonserver.resolve().parent.parent
        return cls(
            tritonserver=tritonserver,
            library_path=root / "lib",
            backend_dir=root / "backends",
            python_bin_dir=python_bin_dir,
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

    def preload(self) -> Path | None:
        """The shim to preload into Triton, or None where it was not built."""
        return self.private_shm_shim if self.private_shm_shim.is_file() else None

    def private_shm_note(self) -> str | None:
        """A line for the launcher's start when the shim is missing, else None."""
        if self.preload() is not None:
            return None
        return (
            f"note: {self.private_shm_shim} is missing (make setup builds it with cc): "
            "Triton 2.51's Python backend makes its shared-memory regions 0644, so a local "
            "user may open one before its stub seals it; run the server as a user of its own "
            "or in a container with its own /dev/shm"
        )
