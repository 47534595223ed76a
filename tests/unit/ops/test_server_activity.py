"""Triton's request counters read from a stand-in metrics endpoint
(dispatch_service.ops.server_activity)."""

from __future__ import annotations

import http.server
import threading

from dispatch_service.ops.server_activity import triton_activity, triton_successes

METRICS = """\
# HELP nv_inference_request_success Number of successful inference requests
nv_inference_request_success{model="dispatch",version="1"} 120
nv_inference_request_success{model="dispatch_fused",version="1"} 30
nv_inference_request_failure{model="dispatch",reason="REJECTED",version="1"} 2
nv_inference_pending_request_count{model="dispatch",version="1"} 3
nv_inference_pending_request_count{model="topk_resolver",version="1"} 1
nv_inference_count{model="dispatch",version="1"} 999
"""


class _Server:
    def __init__(self, body: str) -> None:
        text = body.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_activity_sums_pending_and_completed_requests_over_models() -> None:
    server = _Server(METRICS)
    try:
        assert triton_activity(server.url) == (4.0, 152.0)
    finally:
        server.close()


def test_successes_are_summed_per_model() -> None:
    server = _Server(METRICS)
    try:
        assert triton_successes(server.url) == {"dispatch": 120.0, "dispatch_fused": 30.0}
    finally:
        server.close()
