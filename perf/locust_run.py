"""The short locust scenario of `make bench` and the parsing of its statistics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from dispatch_service.core.paths import REPO_ROOT

__all__ = [
    "parse_locust_stats",
    "run_locust",
]


# ---- locust ----------------------------------------------------------------------------------


def parse_locust_stats(text: str) -> dict[str, Any]:
    """The 'Aggregated' row of locust's `--csv` *_stats.csv (times in ms)."""
    import csv
    import io

    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Name") == "Aggregated":
            return {
                "requests": int(row["Request Count"]),
                "failures": int(row["Failure Count"]),
                "rps": float(row["Requests/s"]),
                "p50_ms": float(row["50%"]),
                "p95_ms": float(row["95%"]),
                "p99_ms": float(row["99%"]),
            }
    raise ValueError("no Aggregated row in locust stats")


def run_locust(
    host: str, size: str, body: str, users: int, seconds: int, *, max_requests: int, out: Path
) -> dict[str, Any]:
    prefix = out / f"locust_{size}_{body}"
    command = [
        str(Path(sys.prefix) / "bin" / "locust"),
        "-f",
        str(REPO_ROOT / "perf" / "locustfile.py"),
        "--headless",
        "--host",
        host,
        "-u",
        str(users),
        "-r",
        str(users),
        "--run-time",
        f"{seconds}s",
        "--stop-timeout",
        "5",
        "--csv",
        str(prefix),
        "--only-summary",
        "--loglevel",
        "WARNING",
        "--window-size",
        size,
        "--body",
        body,
        "--max-requests",
        str(max_requests),
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    info: dict[str, Any] = {
        "users": users,
        "size": size,
        "body": body,
        "run_time": f"{seconds} s",
        "max_requests": max_requests,
        "command": " ".join(command),
    }
    try:
        done = subprocess.run(
            command,
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=seconds + 90,
            check=False,
        )
        (out / f"locust_{size}_{body}.log").write_text(done.stdout + done.stderr)
        info.update(parse_locust_stats(Path(f"{prefix}_stats.csv").read_text()))
    except (subprocess.TimeoutExpired, OSError, ValueError, KeyError) as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info
