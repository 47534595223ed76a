"""Stand-ins for the supervisor's tests (tests/unit/ops/test_supervisor.py,
test_stub_healing.py, test_health_endpoint.py): a server that runs nothing, Triton's
model-repository API over a dict of configs, and deep-check answers."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.request

from dispatch_service.ops.health import Probe


class FakeServer:
    """Enough of a TritonServer for the supervisor's HTTP side."""

    process = None
    http_url = grpc_url = "127.0.0.1:1"
    metrics_url = "http://127.0.0.1:1/metrics"
    admin_key = "k"
    priority_key = "p"
    required_models = ("dispatch",)

    def start(self, timeout_s: float = 0) -> object:
        return self

    def stop(self, timeout_s: float = 0, *, graceful: bool = True) -> None:
        pass


def ok_probes(*models: str) -> list[Probe]:
    return [Probe(model, True, "answered", 0.01) for model in models]


class CountingServer(FakeServer):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self, timeout_s: float = 0) -> object:
        self.calls.append("start")
        return self

    def stop(self, timeout_s: float = 0, *, graceful: bool = True) -> None:
        self.calls.append("stop" if graceful else "kill")
        self.process = None  # as a real server's stop lets go of its process


class StandInRepository:
    """Triton's config and load endpoints over models whose files say ``files``: a load with
    a config overrides it; `start` (a new server) reads the files again."""

    def __init__(self, files: dict[str, dict[str, object]]) -> None:
        self.files = files
        self.live = {m: dict(c) for m, c in files.items()}
        self.loads: list[tuple[str, str | None]] = []
        self.refuse_loads = 0  # the next this many loads fail (HTTP 400), as Triton's would
        self.index: list[dict[str, str]] = []  # what /v2/repository/index answers
        repo = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                model = self.path.split("/")[3]
                if model not in repo.live:
                    self._send(400, {"error": f"Request for unknown model: '{model}'"})
                else:
                    self._send(200, repo.live[model])

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/repository/index"):
                    self._send(200, repo.index)
                    return
                model, action = self.path.split("/")[4:6]
                if action == "unload":
                    repo.loads.append((f"unload {model}", self.headers.get("admin-key")))
                elif repo.refuse_loads > 0:
                    repo.refuse_loads -= 1
                    repo.loads.append((f"refused {model}", self.headers.get("admin-key")))
                    self._send(400, {"error": f"load failed for model '{model}': stub timeout"})
                    return
                else:
                    repo.live[model] = json.loads(body["parameters"]["config"])
                    repo.loads.append((model, self.headers.get("admin-key")))
                self._send(200, {})

            def _send(self, code: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def http_get(url: str) -> tuple[int, str]:
    """(status, body) of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
