"""The launcher's own HTTP endpoint: ``/livez`` and ``/readyz`` (200 or 503), ``/healthz``
(the supervisor's snapshot as JSON), ``/metrics`` (Prometheus text) and, with a control gate,
the ``/v2/...`` control requests (`control_gate`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from dispatch_service.ops.control_gate import MAX_CONTROL_BODY_BYTES, ControlGate, GateAnswer

__all__ = ["HealthVerdicts", "launcher_metrics", "serve_health"]


class HealthVerdicts(Protocol):
    """What the endpoint serves (`supervisor.Supervisor`)."""

    def live(self) -> bool: ...
    def ready(self) -> bool: ...
    def snapshot(self) -> dict[str, Any]: ...
    def metrics_text(self) -> str: ...


def serve_health(
    supervisor: HealthVerdicts, host: str, port: int, gate: ControlGate | None = None
) -> ThreadingHTTPServer:
    """Serve the verdicts (and the ``gate``'s requests) on ``host:port`` from threads of
    their own; returns the server (its ``shutdown`` ends it)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = 30.0  # a client that stops sending mid-request loses its connection

        def do_POST(self) -> None:
            if gate is None:
                self._send(404, b"not found\n", "text/plain")
                return
            length = self.headers.get("Content-Length", "0")
            if not length.isdigit() or int(length) > MAX_CONTROL_BODY_BYTES:
                self.close_connection = True
                text = f"Content-Length: a number up to {MAX_CONTROL_BODY_BYTES} bytes"
                self._send_gate(GateAnswer.error(413, text))
                return
            body = self.rfile.read(int(length))
            self._send_gate(gate.handle("POST", self.path, self._headers(), body))

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if gate is not None and path.startswith("/v2"):
                self._send_gate(gate.handle("GET", self.path, self._headers(), None))
            elif path == "/livez":
                ok = supervisor.live()
                self._send(200 if ok else 503, b"live\n" if ok else b"dead\n", "text/plain")
            elif path == "/readyz":
                ok = supervisor.ready()
                body = b"ready\n" if ok else b"not ready\n"
                self._send(200 if ok else 503, body, "text/plain")
            elif path == "/healthz":
                snap = supervisor.snapshot()
                code = 200 if snap["ready"] else 503
                self._send(code, json.dumps(snap).encode(), "application/json")
            elif path == "/metrics":
                self._send(200, supervisor.metrics_text().encode(), "text/plain; version=0.0.4")
            else:
                self._send(404, b"not found\n", "text/plain")

        def _headers(self) -> dict[str, str]:
            return {name.lower(): value for name, value in self.headers.items()}

        def _send_gate(self, answer: GateAnswer) -> None:
            self._send(answer.status, answer.body, answer.content_type)

        def _send(self, code: int, body: bytes, kind: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    http = ThreadingHTTPServer((host, port), Handler)
    http.daemon_threads = True
    thread = threading.Thread(target=http.serve_forever, name="health-http", daemon=True)
    thread.start()
    return http


def launcher_metrics(snap: dict[str, Any], entry_points: Sequence[str]) -> str:
    """The launcher's own Prometheus text from a supervisor snapshot (`Supervisor.snapshot`)."""
    lines = [
        "# HELP dispatch_launcher_stub_restarts_total Python-backend stubs found dead "
        "and their model reloaded by the launcher.",
        "# TYPE dispatch_launcher_stub_restarts_total counter",
    ]
    lines += [
        f'dispatch_launcher_stub_restarts_total{{model="{m}"}} {n}'
        for m, n in sorted(snap["stub_restarts"].items())
    ]
    lines += [
        "# HELP dispatch_launcher_ready 1 when every entry point answers a small window.",
        "# TYPE dispatch_launcher_ready gauge",
        f"dispatch_launcher_ready {int(snap['ready'])}",
        "# HELP dispatch_launcher_server_restarts_total Servers restarted after a failed "
        "deep check.",
        "# TYPE dispatch_launcher_server_restarts_total counter",
        f"dispatch_launcher_server_restarts_total {snap['server_restarts']}",
        "# HELP dispatch_launcher_degraded 1 while the entry point answers its probe only "
        "through a fallback (the scoring model away or failing).",
        "# TYPE dispatch_launcher_degraded gauge",
    ]
    degraded = snap["degraded"]
    lines += [
        f'dispatch_launcher_degraded{{entry_point="{m}"}} {int(m in degraded)}'
        for m in entry_points
    ]
    lines += [
        "# HELP dispatch_launcher_fallback_level The fallback level of the entry point's "
        "last probe answer (0: the chosen model version scored it).",
        "# TYPE dispatch_launcher_fallback_level gauge",
    ]
    lines += [
        f'dispatch_launcher_fallback_level{{entry_point="{m}"}} {degraded.get(m, 0)}'
        for m in entry_points
    ]
    lines += [
        "# HELP dispatch_launcher_unhealed 1 while a model's instances are not all back "
        "(its reload refused or failing); the server is not ready meanwhile.",
        "# TYPE dispatch_launcher_unhealed gauge",
    ]
    lines += [f'dispatch_launcher_unhealed{{model="{m}"}} 1' for m in sorted(snap["unhealed"])]
    lines += [
        "# HELP dispatch_launcher_probes_total Deep-check windows sent to the entry point "
        "(counted by Triton's nv_inference_* like any request; the project's own metrics "
        "leave them out).",
        "# TYPE dispatch_launcher_probes_total counter",
    ]
    lines += [
        f'dispatch_launcher_probes_total{{entry_point="{m}"}} {n}'
        for m, n in sorted(snap["probes"].items())
    ]
    return "\n".join(lines) + "\n"
