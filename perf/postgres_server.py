"""A throwaway PostgreSQL server for the outcome store's tests and benchmark: `initdb` in a
temporary folder, `pg_ctl start` on a free loopback port, stopped and removed after.

Debian's ``postgresql`` package (installed by `make setup`) provides the binaries under
``/usr/lib/postgresql/<major>/bin``. PostgreSQL refuses to run as root: as root, the
server runs as the ``postgres`` user the package creates (its folder handed to it).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["PostgresUnavailableError", "postgres_bin", "throwaway_postgres"]

DATABASE = "outcomes"
USER = "dispatch"


class PostgresUnavailableError(RuntimeError):
    """No PostgreSQL binaries here (run `make setup`)."""


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's bin folder."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if not found:
        raise PostgresUnavailableError(
            "no PostgreSQL under /usr/lib/postgresql: `make setup` installs Debian's postgresql"
        )
    return found[-1].parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """A running server with an empty database; yields its URL."""
    binaries = postgres_bin()
    root = Path(tempfile.mkdtemp(prefix="dispatch-pg-"))
    data = root / "data"
    as_root = os.geteuid() == 0
    prefix = ["runuser", "-u", "postgres", "--"] if as_root else []
    if as_root:
        shutil.chown(root, "postgres")
    port = _free_port()
    log = root / "server.log"

    def run(*argv: str) -> None:
        subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=120)

    try:
        run(str(binaries / "initdb"), "-D", str(data), "-U", USER, "-A", "trust", "--no-sync")
        options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
        run(str(binaries / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(log), "-w", "start")
        run(str(binaries / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", USER, DATABASE)
        yield f"postgresql://{USER}@127.0.0.1:{port}/{DATABASE}"
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(
                [*prefix, str(binaries / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
                capture_output=True,
                timeout=120,
            )
        shutil.rmtree(root, ignore_errors=True)
