"""The Makefile: `make help` lists every target on one line; the sign targets' commands."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from dispatch_service.core.paths import REPO_ROOT

MAKEFILE = REPO_ROOT / "Makefile"
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make(*args: str) -> str:
    done = subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO_ROOT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_help_lists_every_target_on_one_line() -> None:
    targets = set(re.findall(r"^([a-zA-Z0-9_-]+):", MAKEFILE.read_text(), re.MULTILINE))
    lines = make("help").splitlines()
    listed = {line.split()[0] for line in lines}
    assert listed == targets
    assert len(lines) == len(targets)
    assert all(len(line.split(maxsplit=1)) == 2 for line in lines)  # a name and a text


def test_sign_all_and_perf_pass_their_variables() -> None:
    assert "sign-repository /r --key /k.key" in make("-n", "sign-all", "KEY=/k.key", "REPO=/r")
    assert "run_perf_analyzer --url h:1" in make("-n", "perf", "URL=h:1")
    fixed = make("-n", "perf", "HTTP_PORT=1", "GRPC_PORT=2", "METRICS_PORT=3")
    assert "--http-port 1 --grpc-port 2 --metrics-port 3" in fixed
    assert "--grpc-port" not in make("-n", "perf").splitlines()[-1]
