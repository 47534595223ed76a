"""The launcher's own HTTP endpoint (dispatch_service.ops.health_endpoint) serving a
supervisor over a stand-in server (the ``supervisor`` fixture: conftest.py)."""

from __future__ import annotations

import json

from supervisor_stand_ins import http_get

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
