"""The launcher's own HTTP endpoint (dispatch_service.ops.health_endpoint) serving a
supervisor over a stand-in server (the ``supervisor`` fixture: conftest.py)."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

from supervisor_stand_ins import http_get

from dispatch_service.ops.control_gate import ControlGate, GateAnswer
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


def test_metrics_count_restarts_per_model(supervisor: Supervisor) -> None:
    supervisor.state.restarts["dispatch_model"] += 2
    code, text = http_get(f"{supervisor.health_url}/metrics")
    assert code == 200
    assert 'dispatch_launcher_stub_restarts_total{model="dispatch_model"} 2' in text
    assert "dispatch_launcher_ready 1" in text


def test_the_control_gate_answers_posts_and_v2_gets_and_caps_the_body(
    supervisor: Supervisor, tmp_path: Path
) -> None:
    sent: list[tuple[str, str]] = []

    def triton(method: str, path: str, body: bytes | None, *, admin: bool) -> GateAnswer:
        sent.append((method, path))
        return GateAnswer(200, b'{"ok": true}')

    gate = ControlGate("k", triton, repository=tmp_path)
    http = serve_health(supervisor, "127.0.0.1", 0, gate)
    url = f"http://127.0.0.1:{http.server_address[1]}"
    try:
        index = urllib.request.Request(
            f"{url}/v2/repository/index", b"{}", {"Admin-Key": "k"}, method="POST"
        )
        with urllib.request.urlopen(index, timeout=5) as response:
            assert response.status == 200
        assert http_get(f"{url}/v2/models/x/config") == (200, '{"ok": true}')
        assert http_get(f"{url}/readyz")[0] == 200
        with socket.create_connection(http.server_address, timeout=5) as sock:
            sock.sendall(
                b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nadmin-key: k\r\n"
                b"Content-Length: 99999999999\r\n\r\n"
            )
            assert sock.recv(200).startswith(b"HTTP/1.0 413")
    finally:
        http.shutdown()
        http.server_close()
    assert sent == [("POST", "/v2/repository/index"), ("GET", "/v2/models/x/config")]
