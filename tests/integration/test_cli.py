"""`dispatch-client` against the live server, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch_service.core.paths import REPO_ROOT
from dispatch_service.ops.server import TritonServer

EXAMPLE = REPO_ROOT / "client" / "examples" / "window_small.json"
CLI = Path(sys.prefix) / "bin" / "dispatch-client"


def run_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CLI), *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_example_window_is_dispatched(triton: TritonServer, protocol: str) -> None:
    url = triton.http_url if protocol == "http" else triton.grpc_url
    done = run_cli("--url", url, "--protocol", protocol, str(EXAMPLE))
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    window = json.loads(EXAMPLE.read_text())
    assert [o["order_id"] for o in answer["orders"]] == [o["id"] for o in window["orders"]]
    rider_ids = {r["id"] for r in window["riders"]}
    for order in answer["orders"]:
        assert order["top_k"], order
        assert {c["rider_id"] for c in order["top_k"]} <= rider_ids
        assert order["assigned_rider_id"] in rider_ids | {None}


def test_stdin_and_both_protocols_agree(triton: TritonServer) -> None:
    text = EXAMPLE.read_text()
    over_http = run_cli("--url", triton.http_url, "--protocol", "http", "-", stdin=text)
    over_grpc = run_cli("--url", triton.grpc_url, "--protocol", "grpc", str(EXAMPLE))
    assert over_http.returncode == over_grpc.returncode == 0
    assert json.loads(over_http.stdout) == json.loads(over_grpc.stdout)


def test_server_rejection_is_one_line_and_exit_1(triton: TritonServer) -> None:
    window = json.loads(EXAMPLE.read_text())
    window["orders"][1]["pickup"] = [91.0, 121.47]
    done = run_cli("--url", triton.http_url, "--protocol", "http", "-", stdin=json.dumps(window))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "ORDER_PICKUP" in lines[0] and "latitude" in lines[0]


def test_malformed_json_is_one_line_and_exit_2(triton: TritonServer) -> None:
    done = run_cli("--url", triton.http_url, "-", stdin='{"orders": [')
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("error:")
