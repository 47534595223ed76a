"""The launcher's HTTP service (dispatch_service.ops.health_endpoint) serving a supervisor
over a stand-in server (the ``supervisor`` fixture: conftest.py): probes, build info, one
prometheus_client registry (its text checked with prometheus_client's own parser), the
control gate and extra routes."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from supervisor_stand_ins import http_get

from dispatch_service.ops.control_gate import MAX_CONTROL_BODY_BYTES, ControlGate, GateAnswer
from dispatch_service.ops.health_endpoint import serve_health
from dispatch_service.ops.supervisor import Supervisor


def test_endpoints_report_ready_then_draining_then_dead(supervisor: Supervisor) -> None:
    url = supervisor.health_url
    assert http_get(f"{url}/readyz")[0] == 200 and http_get(f"{url}/livez")[0] == 200
    supervisor.state.draining = True
    assert http_get(f"{url}/readyz")[0] == 503 and http_get(f"{url}/livez")[0] == 200
    code, body = http_get(f"{url}/healthz")
    assert code == 503 and json.loads(body)["draining"] is True
    supervisor.state.dead_reason = "dispatch: FAILED: deadline exceeded"
    assert http_get(f"{url}/livez")[0] == 503
    assert http_get(f"{url}/nope")[0] == 404


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_metrics_count_restarts_per_model(supervisor: Supervisor) -> None:
    supervisor.state.restarts["dispatch_model"] += 2
    code, text = http_get(f"{supervisor.health_url}/metrics")
    assert code == 200
    samples = _samples(text)
    assert samples["dispatch_launcher_stub_restarts_total", (("model", "dispatch_model"),)] == 2
    assert samples["dispatch_launcher_ready", ()] == 1
    assert "# TYPE dispatch_launcher_stub_restarts_total counter" in text


def test_text_sources_join_the_one_registry(supervisor: Supervisor) -> None:
    supervisor.metric_sources.append(
        lambda: '# TYPE dispatch_launcher_x gauge\ndispatch_launcher_x{k="v"} 7\n'
    )
    samples = _samples(http_get(f"{supervisor.health_url}/metrics")[1])
    assert samples["dispatch_launcher_x", (("k", "v"),)] == 7
    assert samples["dispatch_launcher_ready", ()] == 1


def test_build_info_is_in_healthz_and_metrics(supervisor: Supervisor) -> None:
    import platform
    from importlib import metadata

    version = metadata.version("triton-dispatch")  # the installed distribution's
    assert version == (Path(__file__).resolve().parents[3] / "VERSION").read_text().strip()
    build = json.loads(http_get(f"{supervisor.health_url}/healthz")[1])["build"]
    assert build == {"version": version, "python": platform.python_version()}
    samples = _samples(http_get(f"{supervisor.health_url}/metrics")[1])
    labels = (("python", platform.python_version()), ("version", version))
    assert samples["dispatch_build_info", labels] == 1


def test_extra_routes_are_served_beside_the_probes(supervisor: Supervisor) -> None:
    async def outcomes(_: web.Request) -> web.Response:
        return web.json_response({"outcomes": 3})

    http = serve_health(
        supervisor,
        "127.0.0.1",
        0,
        registry=supervisor.registry,
        extra_routes=[web.get("/outcomes", outcomes)],
    )
    try:
        assert http_get(f"{http.url}/outcomes") == (200, '{"outcomes": 3}')
        assert http_get(f"{http.url}/readyz")[0] == 200
        assert http_get(f"{http.url}/v2/models/x/config")[0] == 404  # no gate: no control
    finally:
        http.stop()


def test_a_taken_port_raises_at_start(supervisor: Supervisor) -> None:
    port = int(supervisor.health_url.rsplit(":", 1)[1])
    with pytest.raises(OSError):
        serve_health(supervisor, "127.0.0.1", port, registry=supervisor.registry)


def test_the_control_gate_answers_posts_and_v2_gets_and_caps_the_body(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    sent: list[tuple[str, str]] = []

    def triton(method: str, path: str, body: bytes | None, *, admin: bool) -> GateAnswer:
        sent.append((method, path))
        return GateAnswer(200, b'{"ok": true}')

    gate = ControlGate("k", triton, repository=tmp_path)
    http = serve_health(supervisor, "127.0.0.1", 0, gate, registry=supervisor.registry)
    url = http.url
    try:
        index = urllib.request.Request(
            f"{url}/v2/repository/index", b"{}", {"Admin-Key": "k"}, method="POST"
        )
        with urllib.request.urlopen(index, timeout=5) as response:
            assert response.status == 200
        assert http_get(f"{url}/v2/models/x/config") == (200, '{"ok": true}')
        assert http_get(f"{url}/readyz")[0] == 200
        with socket.create_connection(http.address, timeout=5) as sock:
            sock.sendall(
                b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nadmin-key: k\r\n"
                b"Content-Length: 99999999999\r\n\r\n"
            )
            assert sock.recv(200).startswith(b"HTTP/1.1 413")
        with socket.create_connection(http.address, timeout=5) as sock:  # chunked, past the cap
            chunk = b"x" * (MAX_CONTROL_BODY_BYTES + 1)
            sock.sendall(
                b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nadmin-key: k\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                + f"{len(chunk):x}\r\n".encode()
                + chunk
                + b"\r\n0\r\n\r\n"
            )
            assert sock.recv(200).startswith(b"HTTP/1.1 413")
    finally:
        http.stop()
    assert sent == [("POST", "/v2/repository/index"), ("GET", "/v2/models/x/config")]


def test_control_requests_in_flight_never_hold_up_the_probes(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    """Loads take minutes on a real server: while every control thread waits on one, the
    probes and /metrics still answer."""
    import threading

    from dispatch_service.ops.health_endpoint import CONTROL_THREADS

    release = threading.Event()
    entered = threading.Semaphore(0)

    def slow_triton(method: str, path: str, body: bytes | None, *, admin: bool) -> GateAnswer:
        entered.release()
        release.wait(60)
        return GateAnswer(200, b"{}")

    gate = ControlGate("k", slow_triton, repository=tmp_path)
    http = serve_health(supervisor, "127.0.0.1", 0, gate, registry=supervisor.registry)
    calls = [
        threading.Thread(target=http_get, args=(f"{http.url}/v2/models/m{n}/config",))
        for n in range(CONTROL_THREADS + 2)
    ]
    try:
        for call in calls:
            call.start()
        for _ in range(CONTROL_THREADS):
            assert entered.acquire(timeout=30)  # every control thread is taken
        assert http_get(f"{http.url}/readyz")[0] == 200
        assert http_get(f"{http.url}/livez")[0] == 200
        assert http_get(f"{http.url}/metrics")[0] == 200
    finally:
        release.set()
        for call in calls:
            call.join(30)
        http.stop()
