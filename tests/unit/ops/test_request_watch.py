"""The launcher's watch for requests whose declared shape no tensor can have (`ops.request_watch`):
Triton's verbose log lines, as Triton 2.51 wrote them for a wrapped ORDER_FIELDS shape."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch_service.ops.request_watch import (
    EVENTS_PER_MINUTE,
    WATCH_S,
    RequestWatch,
    impossible_shapes,
)

# Lines of a 2.51 log at verbosity 1 (cut to the inputs that matter): a window, then the
# wrapped shape of scripts/repro_shape_wrap.py: 2^61 + 1 rows of 7 FP64, 56 bytes sent.
GOOD = (
    'I1207 15:48:35.8 1 infer_request.cc:905] "[request id: good-42] prepared: [0x1] request '
    "id: good-42, model: dispatch_fused, requested version: -1, actual version: 1, flags: 0x0, "
    "batch size: 1, priority: 2, timeout (us): 0\\noriginal inputs:\\n[0x2] input: "
    "ORDER_FIELDS, type: FP64, original shape: [1,64,7], batch + shape: [1,64,7], shape: "
    '[64,7]\\n[0x3] input: ORDER_IDS, type: BYTES, original shape: [1,64], shape: [64]\\n"\n'
)
WRAPPED = (
    'I1207 15:48:35.9 1 infer_request.cc:905] "[request id: killer\\"-77] prepared: [0x4] '
    "request id: killer-77, model: dispatch_fused, requested version: -1, actual version: 1, "
    "flags: 0x0, batch size: 1, priority: 2, timeout (us): 0\\noriginal inputs:\\n[0x5] input: "
    "WINDOW_FIELDS, type: FP64, original shape: [1,2], shape: [2]\\n[0x6] input: ORDER_FIELDS, "
    "type: FP64, original shape: [1,2305843009213693953,7], batch + shape: "
    '[1,2305843009213693953,7], shape: [2305843009213693953,7]\\n"\n'
)


def test_a_shape_of_2_to_the_63_bytes_or_more_is_found_with_its_request_id() -> None:
    # (2^61 + 1) x 7 x 8 bytes = 7 x 2^64 + 56: far past 2^63; 64 x 7 x 8 = 3,584 bytes.
    (found,) = impossible_shapes((GOOD + WRAPPED).encode())
    assert found.request_id == 'killer\\\\"-77'  # escaped as it goes into a log line
    assert (found.model, found.tensor) == ("dispatch_fused", "ORDER_FIELDS")
    assert found.shape == [1, 2**61 + 1, 7]
    assert impossible_shapes(GOOD.encode()) == []
    # The ensemble's request and its first step's, under one id: one request.
    step = WRAPPED.replace("model: dispatch_fused", "model: feature_encoder")
    ensemble = WRAPPED.replace("model: dispatch_fused", "model: dispatch")
    assert [f.model for f in impossible_shapes((ensemble + step).encode())] == ["dispatch"]
    # 2^60 BYTES elements (one byte each at least): below 2^63, not impossible.
    bytes_line = GOOD.replace(
        "ORDER_IDS, type: BYTES, original shape: [1,64]",
        "ORDER_IDS, type: BYTES, original shape: [1,1152921504606846976]",
    )
    assert impossible_shapes(bytes_line.encode()) == []
    long_id = WRAPPED.replace('killer\\"-77', "k" * 500)
    (clipped,) = impossible_shapes(long_id.encode())
    assert clipped.request_id == "k" * 128 + "..."


class LoggingApi:
    """Triton's /v2/logging: what each POST set, with the key it carried."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, object], str | None]] = []
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.posts.append((body, self.headers.get("admin-key")))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"127.0.0.1:{self.httpd.server_address[1]}"


@pytest.fixture
def api() -> Iterator[LoggingApi]:
    served = LoggingApi()
    yield served
    served.httpd.shutdown()
    served.httpd.server_close()


class Server:
    def __init__(self, log_path: Path, http_url: str) -> None:
        self.log_path = log_path
        self.http_url = http_url
        self.admin_key: str | None = "k3y"


def test_a_stub_death_turns_the_log_on_and_later_requests_are_reported_then_off(
    tmp_path: Path, api: LoggingApi
) -> None:
    log = tmp_path / "server.log"
    log.write_text(WRAPPED)  # before the death: not this watch's to report
    now = [100.0]
    events: list[dict[str, object]] = []
    watch = RequestWatch(Server(log, api.url), events.append, clock=lambda: now[0])
    watch.check()  # not armed: nothing read, nothing set
    assert api.posts == [] and events == []
    watch.arm()
    assert api.posts == [({"log_verbose_level": 1}, "k3y")]
    with log.open("a") as out:
        killers = [WRAPPED.replace('killer\\"-77', f"killer-{n}") for n in range(25)]
        out.write(GOOD + "".join(killers) + WRAPPED[:40])  # the last line half written
    watch.check()
    assert len(events) == EVENTS_PER_MINUTE  # capped a minute; all 25 counted
    assert events[0]["event"] == "impossible_shape_request"
    assert events[0]["tensor"] == "ORDER_FIELDS" and events[0]["model"] == "dispatch_fused"
    assert 'model="dispatch_fused"} 25' in watch.metrics_text()
    now[0] += WATCH_S - 1
    watch.arm()  # another death: watched longer, set again (a restarted server starts at 0)
    now[0] += WATCH_S - 1
    watch.check()
    assert api.posts == [({"log_verbose_level": 1}, "k3y")] * 2
    now[0] += 2
    watch.check()
    assert api.posts[-1] == ({"log_verbose_level": 0}, "k3y")


def test_no_watch_where_the_log_is_no_file_the_launcher_reads(
    tmp_path: Path, api: LoggingApi
) -> None:
    watch = RequestWatch(Server(Path("/dev/null"), api.url), lambda event: None)
    watch.arm()
    assert api.posts == []
