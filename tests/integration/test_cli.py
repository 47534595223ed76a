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


@pytest.mark.parametrize("protocol", ["http", "grpc", "grpc-shm"])
def test_addresses_in_the_json_are_located_and_the_source_printed(
    triton: TritonServer, protocol: str
) -> None:
    """The shipped server names no geocoding provider: the addresses are matched offline
    against the gazetteer (a POI, a road + house number), coordinates stay as given."""
    example = REPO_ROOT / "client" / "examples" / "window_addresses.json"
    url = triton.http_url if protocol == "http" else triton.grpc_url
    done = run_cli("--url", url, "--protocol", protocol, str(example))
    assert done.returncode == 0, done.stderr
    orders = json.loads(done.stdout)["orders"]
    assert [(o["pickup_source"], o["dropoff_source"]) for o in orders] == [
        ("gazetteer", "coordinates"),
        ("coordinates", "gazetteer"),
    ]
    assert all(order["top_k"] for order in orders)


def test_an_address_nobody_knows_is_exit_2_naming_the_column_and_row(
    triton: TritonServer,
) -> None:
    window = json.loads((REPO_ROOT / "client" / "examples" / "window_addresses.json").read_text())
    window["orders"][1]["dropoff_address"] = "火星基地一号"
    done = run_cli("--url", triton.grpc_url, "--protocol", "grpc", "-", stdin=json.dumps(window))
    assert done.returncode == 2
    assert "ORDER_TEXT[dropoff_address]: row 1: address '火星基地一号'" in done.stderr
    assert run_cli("--url", triton.grpc_url, "--protocol", "grpc", str(EXAMPLE)).returncode == 0


def test_stdin_and_both_protocols_agree(triton: TritonServer) -> None:
    text = EXAMPLE.read_text()
    over_http = run_cli("--url", triton.http_url, "--protocol", "http", "-", stdin=text)
    over_grpc = run_cli("--url", triton.grpc_url, "--protocol", "grpc", str(EXAMPLE))
    assert over_http.returncode == over_grpc.returncode == 0
    assert json.loads(over_http.stdout) == json.loads(over_grpc.stdout)


def rejection_lines(triton: TritonServer, request_id: str) -> list[dict[str, object]]:
    """The server log's request_rejected records for one request id."""
    records = []
    for line in triton.log_path.read_text(errors="replace").splitlines():
        if "request_rejected" in line and request_id in line:
            text = line[line.index('"{') + 1 : line.rindex('}"') + 1].replace('\\"', '"')
            records.append(json.loads(text))
    return records


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_server_rejection_is_one_line_exit_2_and_logged_under_the_request_id(
    triton: TritonServer, protocol: str
) -> None:
    # The client cannot know latitude 95 is wrong; the server refuses it as invalid input:
    # the same exit code as input the client refuses itself.
    window = json.loads(EXAMPLE.read_text())
    window["orders"][1]["pickup"] = [95.0, 121.47]
    url = triton.http_url if protocol == "http" else triton.grpc_url
    rid = f"cli-test-{protocol}-latitude"
    argv = ("--url", url, "--protocol", protocol, "--request-id", rid, "-")
    done = run_cli(*argv, stdin=json.dumps(window))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "ORDER_FIELDS[pickup_lat, pickup_lon]" in lines[0] and "latitude" in lines[0]
    assert lines[0].endswith(f"(request id {rid})")
    [record] = rejection_lines(triton, rid)
    assert (
        record["tensor"] == "ORDER_FIELDS[pickup_lat, pickup_lon]"
        and record["model"] == "feature_encoder"
    )


def test_a_generated_request_id_is_printed_and_logged(triton: TritonServer) -> None:
    window = json.loads(EXAMPLE.read_text())
    window["riders"][0]["capacity"] = -1
    done = run_cli("--url", f"http://{triton.http_url}", "-", stdin=json.dumps(window))
    assert done.returncode == 2
    rid = done.stderr.strip().rsplit("(request id ", 1)[1].rstrip(")")
    assert len(rid) == 32
    [record] = rejection_lines(triton, rid)
    assert record["tensor"] == "RIDER_FIELDS[capacity]"


def test_a_server_failure_is_exit_1(triton: TritonServer) -> None:
    done = run_cli("--url", triton.http_url, "--model", "no_such_model", str(EXAMPLE))
    assert done.returncode == 1
    assert "no_such_model" in done.stderr and "(request id " in done.stderr


def test_the_version_tag_forces_the_scoring_version(triton: TritonServer) -> None:
    for tag, version in (("2", 2), ("stable", 1)):
        done = run_cli("--url", triton.http_url, "--version-tag", tag, str(EXAMPLE))
        assert done.returncode == 0, done.stderr
        orders = json.loads(done.stdout)["orders"]
        assert {o["model_version"] for o in orders} == {version}
        assert {o["fallback_level"] for o in orders} == {0}
    done = run_cli("--url", triton.http_url, "--version-tag", "newest", str(EXAMPLE))
    assert done.returncode == 2 and "MODEL_VERSION_TAG" in done.stderr


def test_weights_change_the_answer_through_the_cli(triton: TritonServer) -> None:
    cost_only = run_cli("--url", triton.http_url, "--weights", "0,0,1", str(EXAMPLE))
    latency_only = run_cli("--url", triton.http_url, "--weights", "1,0,0", str(EXAMPLE))
    assert cost_only.returncode == latency_only.returncode == 0
    assert json.loads(cost_only.stdout) != json.loads(latency_only.stdout)


def test_malformed_json_is_one_line_and_exit_2(triton: TritonServer) -> None:
    done = run_cli("--url", triton.http_url, "-", stdin='{"orders": [')
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("error:")


def documented_example() -> tuple[str, dict[str, object]]:
    """The request and the response docs/contract.md shows for the window JSON."""
    text = (REPO_ROOT / "docs" / "contract.md").read_text()
    section = text[text.index("## The window as JSON") :]
    blocks = [b.split("\n", 1)[1] for b in section.split("```json")[1:3]]
    request, response = (b[: b.index("```")] for b in blocks)
    return request, json.loads(response)


def test_the_documented_example_is_what_the_server_answers(triton: TritonServer) -> None:
    request, response = documented_example()
    example = REPO_ROOT / "client" / "examples" / "window_two_orders.json"
    assert json.loads(request) == json.loads(example.read_text())
    done = run_cli("--url", triton.http_url, str(example))
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    # Same riders, order and versions; numbers to FP32 precision (another CPU may round the
    # last digit differently).
    assert_close(answer, response)


def assert_close(got: object, want: object, path: str = "") -> None:
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), path
        for key in want:
            assert_close(got[key], want[key], f"{path}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_close(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-5), path
    else:
        assert got == want, path
