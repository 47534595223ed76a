"""Pieces of the launcher's supervisor that need no server (dispatch_service.ops.supervisor)."""

from __future__ import annotations

import hashlib
import http.server
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch_service.core.settings import RELOAD_MARK_PARAMETER
from dispatch_service.core.signing import TrustedKeys, generate_private_key, sign_version
from dispatch_service.ops.health import Probe
from dispatch_service.ops.model_control import ModelControlError
from dispatch_service.ops.supervisor import (
    Supervisor,
    SupervisorSettings,
    instance_count,
    stub_deaths,
    stub_models,
    stub_versions,
    triton_activity,
    triton_successes,
)
from dispatch_service.ops.verified_load import LoadVerifier


def fake_proc(root: Path, pid: int, ppid: int, argv: list[str], state: str = "S") -> None:
    folder = root / str(pid)
    folder.mkdir(parents=True)
    (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (folder / "stat").write_text(f"{pid} (triton python b) {state} {ppid} 1 1 0 -1\n")


def test_stubs_of_one_server_are_mapped_to_their_models(tmp_path: Path) -> None:
    stub = "/b/python/triton_python_backend_stub"
    fake_proc(tmp_path, 11, 7, [stub, "/repo/dispatch_model/1/model.py", "r", "1"])
    fake_proc(tmp_path, 12, 7, [stub, "/repo/dispatch_fused/1/model.py", "r", "1"])
    fake_proc(tmp_path, 13, 8, [stub, "/repo/topk_resolver/1/model.py", "r", "1"])  # other server
    fake_proc(tmp_path, 14, 7, [stub, "/repo/feature_encoder/1/model.py"], state="Z")  # dead
    fake_proc(tmp_path, 15, 7, ["/usr/bin/python3", "/repo/x/1/model.py"])
    assert stub_models(7, tmp_path) == {11: "dispatch_model", 12: "dispatch_fused"}
    assert stub_versions(7, tmp_path) == {11: ("dispatch_model", "1"), 12: ("dispatch_fused", "1")}


def test_instance_count_follows_the_instance_groups() -> None:
    assert instance_count({}) == 1
    assert instance_count({"instance_group": [{"kind": "KIND_CPU", "count": 2}]}) == 2
    groups = [{"kind": "KIND_GPU", "count": 2, "gpus": [0, 1]}, {"kind": "KIND_CPU"}]
    assert instance_count({"instance_group": groups}) == 5


ROUTER, MODEL = ("dispatch_router", "1"), ("dispatch_model", "2")


def test_a_killed_stub_of_a_ready_version_is_a_death() -> None:
    # Two router instances, one killed: the version is READY with one stub left.
    lost, alive = {21: ROUTER}, {22: ROUTER}
    assert stub_deaths(lost, alive, {ROUTER}, {"dispatch_router": 2}) == {"dispatch_router": [21]}


def test_stubs_replaced_by_a_config_reload_are_no_death() -> None:
    # deploy/rollback reload the router with new parameters: the new instances start, then
    # Triton ends the old ones. The version stays READY with its full count.
    lost, alive = {21: ROUTER, 22: ROUTER}, {31: ROUTER, 32: ROUTER}
    assert stub_deaths(lost, alive, {ROUTER}, {"dispatch_router": 2}) == {}


def test_a_new_instance_killed_beside_a_stale_old_one_is_a_death() -> None:
    """2.51 leaves the old instances of a model running after one of its stubs died and the
    model was reloaded. Counted as serving, such a stub made the next death of a new
    instance look like a retirement (two deaths 3 s apart: the second never healed)."""
    leftover, new_a, new_b = 21, 31, 32
    lost, alive = {new_a: ROUTER}, {leftover: ROUTER, new_b: ROUTER}
    instances = {"dispatch_router": 2}
    assert stub_deaths(lost, alive, {ROUTER}, instances) == {}  # the old rule: hidden
    assert stub_deaths(lost, alive, {ROUTER}, instances, {leftover}) == {"dispatch_router": [new_a]}
    # The stale stub going away at last is no death.
    assert (
        stub_deaths({leftover: ROUTER}, {31: ROUTER, 32: ROUTER}, {ROUTER}, instances, {21}) == {}
    )


def test_stubs_of_an_unloaded_version_are_no_death() -> None:
    # rollback --unload-canary: version 2 is no longer READY once its stub ends.
    assert stub_deaths({41: MODEL}, {}, {("dispatch_model", "1")}, {"dispatch_model": 1}) == {}
    # The whole model unloaded: no config to read (no instance count), not READY either.
    assert stub_deaths({41: MODEL}, {}, set(), {}) == {}


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


class _Counters:
    """A metrics endpoint whose success counters the test moves."""

    def __init__(self) -> None:
        self.counts = {"dispatch": 10, "dispatch_fused": 10}
        counters = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = "".join(
                    f'nv_inference_request_success{{model="{m}",version="1"}} {n}\n'
                    for m, n in counters.counts.items()
                )
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"


def test_a_busy_probe_is_excused_only_while_its_model_completes_other_requests() -> None:
    counters = _Counters()
    server = FakeServer()
    server.metrics_url = counters.url
    watcher = Supervisor(server, SupervisorSettings(health_port=0), report=lambda line: None)
    probes = [
        Probe("dispatch", False, "Exceeds maximum queue size", 0.01, busy=True),
        Probe("dispatch_fused", False, "answered through fallback level 1", 0.01),
    ]
    try:
        # first reading: nothing to compare
        assert watcher._shedding(probes, watcher._read_successes()) == set()
        counters.counts = {"dispatch": 50, "dispatch_fused": 50}
        # dispatch sheds load and serves others: alive; fused's fallback is a real failure
        assert watcher._shedding(probes, watcher._read_successes()) == {"dispatch"}
        # no progress since: hung, not busy
        assert watcher._shedding(probes, watcher._read_successes()) == set()
        # reloaded (the counter starts again) and serving since: alive
        counters.counts = {"dispatch": 4, "dispatch_fused": 50}
        assert watcher._shedding(probes, watcher._read_successes()) == {"dispatch"}
        # reloaded and nothing served since: not excused
        counters.counts = {"dispatch": 0, "dispatch_fused": 50}
        assert watcher._shedding(probes, watcher._read_successes()) == set()
        # the counters unreachable (a stopped server): nothing is excused
        assert watcher._shedding(probes, {}) == set()
    finally:
        counters.httpd.shutdown()
        counters.httpd.server_close()


class FakeServer:
    """Enough of a TritonServer for the supervisor's HTTP side."""

    process = None
    http_url = grpc_url = "127.0.0.1:1"
    metrics_url = "http://127.0.0.1:1/metrics"
    admin_key = "k"
    required_models = ("dispatch",)

    def start(self, timeout_s: float = 0) -> object:
        return self

    def stop(self, timeout_s: float = 0) -> None:
        pass


@pytest.fixture
def supervisor() -> Iterator[Supervisor]:
    settings = SupervisorSettings(health_port=0, check_every_s=3600, poll_s=3600)
    supervised = Supervisor(FakeServer(), settings, report=lambda line: None).start()
    yield supervised
    supervised.stop()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def test_the_stubs_of_a_crashed_server_are_not_counted_as_stub_deaths(
    supervisor: Supervisor,
) -> None:
    """Triton gone (a SIGSEGV while reloading, seen in CI) takes every stub with it: that is
    for the deep check to declare, not seven model reloads against a dead port."""
    events: list[str] = []
    supervisor.report = events.append
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    supervisor.server.process = ended  # type: ignore[misc]
    supervisor._stubs = {4242: ("dispatch_model", "1"), 4343: ("feature_encoder", "1")}
    supervisor._check_stubs()
    assert supervisor.state.restarts == Counter()
    assert supervisor._stubs == {}
    assert events == []


def test_stubs_are_left_alone_while_the_restart_policy_replaces_the_server(
    supervisor: Supervisor,
) -> None:
    """A new server's stubs come and go while it starts: none of that is a stub death."""
    events: list[str] = []
    supervisor.report = events.append
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as running:
        try:
            supervisor.server.process = running  # type: ignore[misc]
            supervisor.state.restarting = True
            supervisor._stubs = {4242: ("feature_encoder", "1")}
            supervisor._check_stubs()
            assert events == [] and supervisor.state.restarts == Counter()
            supervisor.state.restarting = False  # the same look outside a restart: a death
            supervisor._check_stubs()
            assert supervisor.state.restarts == Counter({"feature_encoder": 1})
            assert any('"stub_died"' in event for event in events)
        finally:
            running.kill()


def test_endpoints_report_ready_then_draining_then_dead(supervisor: Supervisor) -> None:
    url = supervisor.health_url
    assert get(f"{url}/readyz")[0] == 200 and get(f"{url}/livez")[0] == 200
    supervisor.state.draining = True
    assert get(f"{url}/readyz")[0] == 503 and get(f"{url}/livez")[0] == 200
    code, body = get(f"{url}/healthz")
    assert code == 503 and json.loads(body)["draining"] is True
    supervisor.state.dead_reason = "dispatch: FAILED: deadline exceeded"
    assert get(f"{url}/livez")[0] == 503
    assert get(f"{url}/nope")[0] == 404


def test_metrics_count_restarts_per_model(supervisor: Supervisor) -> None:
    supervisor.state.restarts["dispatch_model"] += 2
    code, text = get(f"{supervisor.health_url}/metrics")
    assert code == 200
    assert 'dispatch_launcher_stub_restarts_total{model="dispatch_model"} 2' in text
    assert "dispatch_launcher_ready 1" in text


def ok_probes(*models: str) -> list[Probe]:
    return [Probe(model, True, "answered", 0.01) for model in models]


def test_a_check_begun_before_a_reload_ended_does_not_end_its_recovery(
    supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The router's fallback answers the probes while a stub's model reloads: such an answer
    says nothing of the reloaded model (a stop-19 run saw readiness back after 0.76 s with the
    server about to die)."""
    state = supervisor.state
    state.recovering = {"dispatch_model": float("inf")}  # reload in progress
    monkeypatch.setattr(
        "dispatch_service.ops.supervisor.deep_check", lambda *a: ok_probes("dispatch")
    )
    assert supervisor._check_health()
    assert not supervisor.ready() and list(state.recovering) == ["dispatch_model"]

    def reload_ends_meanwhile(*args: object) -> list[Probe]:
        state.recovering["dispatch_model"] = time.monotonic()
        return ok_probes("dispatch")

    monkeypatch.setattr("dispatch_service.ops.supervisor.deep_check", reload_ends_meanwhile)
    assert supervisor._check_health()
    assert not supervisor.ready()
    # The next check begins after the reload: it ends the recovery.
    monkeypatch.setattr(
        "dispatch_service.ops.supervisor.deep_check", lambda *a: ok_probes("dispatch")
    )
    assert supervisor._check_health()
    assert supervisor.ready() and state.recovering == {}


class CountingServer(FakeServer):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self, timeout_s: float = 0) -> object:
        self.calls.append("start")
        return self

    def stop(self, timeout_s: float = 0) -> None:
        self.calls.append("stop")


@pytest.mark.parametrize("policy", ["exit", "restart"])
def test_an_exited_triton_is_restarted_at_once_or_left_to_the_launcher(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No probes and no dead_after_s wait for a process that is gone: under ``restart`` the
    next check replaces it; under ``exit`` the launcher's loop exits with Triton's status."""
    server = CountingServer()
    events: list[str] = []
    settings = SupervisorSettings(health_port=0, on_dead=policy)  # type: ignore[arg-type]
    watcher = Supervisor(server, settings, report=events.append)

    def no_probe(*args: object) -> list[Probe]:
        raise AssertionError("probed a server that has exited")

    monkeypatch.setattr("dispatch_service.ops.supervisor.deep_check", no_probe)
    crashed = subprocess.Popen([sys.executable, "-c", "import os; os.abort()"])
    crashed.wait()
    server.process = crashed  # type: ignore[assignment]
    assert watcher._check_health()
    if policy == "exit":
        assert server.calls == [] and events == [] and not watcher.dead.is_set()
    else:
        assert server.calls == ["stop", "start"] and watcher.state.server_restarts == 1
        assert '"server_dead"' in events[0] and "exited with -6" in events[0]
        assert '"server_restarted"' in events[-1] and watcher.ready()


class _Repository:
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


def test_a_restart_loads_back_the_configs_set_live() -> None:
    """`deploy` set a canary (dispatch_model versions, router and fused parameters): a server
    restarted by the policy would read config.pbtxt again and end the rollout."""
    files = {
        "dispatch_model": {"version_policy": {"specific": {"versions": [1]}}},
        "dispatch_router": {"parameters": {"canary_percent": {"string_value": "0"}}},
        "dispatch_fused": {"parameters": {"canary_percent": {"string_value": "0"}}},
        "dispatch": {"platform": "ensemble"},
    }
    repo = _Repository(files)
    server = CountingServer()
    server.http_url = repo.url  # type: ignore[misc]
    server.start = lambda timeout_s=0: repo.live.update(  # type: ignore[method-assign]
        {m: dict(c) for m, c in files.items()}
    )
    events: list[str] = []
    watcher = Supervisor(server, SupervisorSettings(health_port=0), report=events.append)
    try:
        deployed = {
            "dispatch_model": {"version_policy": {"specific": {"versions": [1, 2]}}},
            "dispatch_router": {"parameters": {"canary_percent": {"string_value": "25"}}},
        }
        repo.live.update(deployed)
        # A stub of dispatch_fused died earlier: its reload mark is no deploy to load back.
        repo.live["dispatch_fused"] = {
            "parameters": {
                "canary_percent": {"string_value": "0"},
                RELOAD_MARK_PARAMETER: {"string_value": "1"},
            }
        }
        watcher._remember_live()
        watcher._restart()
        assert repo.live["dispatch_model"] == deployed["dispatch_model"]
        assert repo.live["dispatch_router"] == deployed["dispatch_router"]
        # In LIVE_MODELS' order, with the admin key; what the files already say is not reloaded.
        assert repo.loads == [("dispatch_model", "k"), ("dispatch_router", "k")]
        assert sum('"live_config_restored"' in e for e in events) == 2
        assert watcher.state.server_restarts == 1 and watcher.ready()
    finally:
        repo.close()


def test_a_failed_reading_of_the_live_configs_keeps_the_last_one() -> None:
    """On a loaded host a config read timed out now and then; a crash right after it
    restarted the server with the files' routing: the last reading stands."""
    files = {
        "dispatch_model": {"version_policy": {"specific": {"versions": [1]}}},
        "dispatch_router": {"parameters": {"canary_percent": {"string_value": "0"}}},
    }
    repo = _Repository(files)
    server = CountingServer()
    server.http_url = repo.url  # type: ignore[misc]
    server.start = lambda timeout_s=0: repo.live.update(  # type: ignore[method-assign]
        {m: dict(c) for m, c in files.items()}
    )
    watcher = Supervisor(server, SupervisorSettings(health_port=0), report=lambda e: None)
    try:
        canary = {"parameters": {"canary_percent": {"string_value": "25"}}}
        repo.live["dispatch_router"] = canary
        watcher._remember_live()
        del repo.live["dispatch_router"]  # this reading fails (Triton answers an error)
        watcher._remember_live()
        watcher._restart()
        assert repo.live["dispatch_router"] == canary
    finally:
        repo.close()


def test_the_restart_policy_gives_up_after_max_restarts_in_its_window() -> None:
    server = CountingServer()
    events: list[str] = []
    settings = SupervisorSettings(health_port=0, on_dead="restart", max_restarts=2)
    watcher = Supervisor(server, settings, report=events.append)
    assert watcher._dead("dispatch: FAILED", silent=6.0)
    assert watcher._dead("dispatch: FAILED", silent=6.0)
    assert not watcher._dead("dispatch: FAILED", silent=6.0)  # the third death: given up
    assert server.calls == ["stop", "start"] * 2 and watcher.state.server_restarts == 2
    assert watcher.dead.is_set() and not watcher.live()
    assert "given up: 2 restarts in the last 600 s" in watcher.snapshot()["dead_reason"]
    assert any('"restart_limit"' in event for event in events)
    # Restarts older than the window no longer count.
    watcher = Supervisor(server, settings, report=events.append)
    watcher._restarted_at = [time.monotonic() - 601.0] * 2
    assert watcher._dead("dispatch: FAILED", silent=6.0) and not watcher.dead.is_set()


def _stub_repository_files() -> dict[str, dict[str, object]]:
    return {
        "feature_encoder": {"parameters": {"max_orders": {"string_value": "1024"}}},
        "dispatch_model": {"version_policy": {"specific": {"versions": [1, 2]}}},
    }


def _recovering_watcher(
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, dict[str, object]],
    report: Callable[[str], None],
) -> tuple[_Repository, Supervisor]:
    """A supervisor over a fake repository of ``files`` whose deep checks all pass: what a
    stub's recovery (`Supervisor._recover`) talks to."""
    repo = _Repository(files)
    server = CountingServer()
    server.http_url = repo.url  # type: ignore[misc]
    watcher = Supervisor(server, SupervisorSettings(health_port=0), report=report)
    monkeypatch.setattr(
        "dispatch_service.ops.supervisor.deep_check", lambda *a: ok_probes("dispatch")
    )
    return repo, watcher


def test_a_dead_stub_is_replaced_without_unloading_its_model_but_the_scorings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unloading a model takes it away, and an ensemble running it (`dispatch` unknown for
    ~4 s, 45 % of requests failed when a feature_encoder stub died): it is loaded again with a
    new reload mark, which builds fresh instances while the model stays loaded. The scoring
    model, which the router answers for with its fallback, is unloaded, then loaded with its
    own config (faster)."""
    files = _stub_repository_files()
    repo, watcher = _recovering_watcher(monkeypatch, files, lambda line: None)
    try:
        watcher._recover("feature_encoder", [41])
        marked = repo.live["feature_encoder"]["parameters"]
        assert marked["max_orders"] == {"string_value": "1024"}  # type: ignore[index]
        first = marked[RELOAD_MARK_PARAMETER]  # type: ignore[index]
        watcher._recover("feature_encoder", [42])  # each reload differs from the last
        assert repo.live["feature_encoder"]["parameters"][RELOAD_MARK_PARAMETER] != first  # type: ignore[index]
        watcher._recover("dispatch_model", [43])
        assert repo.loads == [
            ("feature_encoder", "k"),
            ("feature_encoder", "k"),
            ("unload dispatch_model", "k"),
            ("dispatch_model", "k"),
        ]
        assert repo.live["dispatch_model"] == files["dispatch_model"]
        assert watcher.ready() and watcher.state.restarts["feature_encoder"] == 2
    finally:
        repo.close()


@pytest.mark.parametrize("model", ["feature_encoder", "dispatch_model"])
def test_a_failed_reload_is_tried_again_until_it_succeeds_or_the_waits_run_out(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """A dead stub's reload can fail once (a stub too slow to start on a busy machine); the
    model must not stay broken until the deep check declares the whole server dead."""
    events: list[dict[str, Any]] = []
    monkeypatch.setattr("dispatch_service.ops.supervisor.RELOAD_RETRY_WAITS_S", (0.01, 0.01))
    repo, watcher = _recovering_watcher(
        monkeypatch, _stub_repository_files(), lambda line: events.append(json.loads(line))
    )
    unload = [(f"unload {model}", "k")] if model == "dispatch_model" else []
    try:
        repo.refuse_loads = 2
        watcher._recover(model, [41])
        # unloaded once (the scoring model), refused twice, loaded on the third attempt
        assert repo.loads == [*unload, *[(f"refused {model}", "k")] * 2, (model, "k")]
        reloads = [e for e in events if e["event"].startswith("model_reload")]
        assert [(e["event"], e["attempt"]) for e in reloads] == [
            ("model_reload_failed", 1),
            ("model_reload_failed", 2),
            ("model_reloaded", 3),
        ]
        assert reloads[0]["retry_in_s"] == 0.01 and "stub timeout" in reloads[0]["error"]
        assert watcher.ready()

        repo.loads, events[:] = [], []
        repo.refuse_loads = 5  # more failures than attempts: three tries, then the verdict
        watcher._recover(model, [42])
        assert repo.loads == [*unload, *[(f"refused {model}", "k")] * 3]
        last = [e for e in events if e["event"] == "model_reload_failed"][-1]
        assert last["attempt"] == 3 and last["retry_in_s"] is None
    finally:
        repo.close()


class _Stubs:
    """The stubs a supervisor sees (`Supervisor._current_stubs`), set by the test."""

    def __init__(self, stubs: dict[int, tuple[str, str]]) -> None:
        self.now = dict(stubs)

    def __call__(self) -> dict[int, tuple[str, str]]:
        return dict(self.now)


def _ready(*keys: tuple[str, str]) -> list[dict[str, str]]:
    return [{"name": m, "version": v, "state": "READY"} for m, v in keys]


ENCODER = ("feature_encoder", "1")


@pytest.fixture
def running() -> Iterator[subprocess.Popen[bytes]]:
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as process:
        try:
            yield process
        finally:
            process.kill()


def test_every_death_is_healed_however_close_and_stale_stubs_are_not_counted(
    monkeypatch: pytest.MonkeyPatch, running: subprocess.Popen[bytes]
) -> None:
    """Two instances; one dies, the reload brings two new ones and 2.51 leaves the old
    survivor running. The next death of a new instance is a death again, and healed."""
    files = {"feature_encoder": {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}}
    events: list[dict[str, Any]] = []
    repo, watcher = _recovering_watcher(monkeypatch, files, lambda e: events.append(json.loads(e)))
    repo.index = _ready(ENCODER)
    watcher.server.process = running  # type: ignore[misc]
    stubs = _Stubs({11: ENCODER, 12: ENCODER})
    monkeypatch.setattr(watcher, "_current_stubs", stubs)
    try:
        watcher._stubs = stubs()
        del stubs.now[11]  # killed
        stubs_after_reload = {12: ENCODER, 21: ENCODER, 22: ENCODER}  # 12: the stale survivor

        def load_brings_new_instances(*args: object, **kwargs: object) -> None:
            stubs.now = dict(stubs_after_reload)

        monkeypatch.setattr(
            "dispatch_service.ops.supervisor.load_model",
            lambda *a, **k: (
                load_brings_new_instances(),
                repo.loads.append(("feature_encoder", "k")),
            ),
        )
        watcher._check_stubs()
        assert watcher.ready() and watcher.state.restarts["feature_encoder"] == 1
        assert watcher._stale == {12}
        # 3 s later (any time): a new instance dies.
        del stubs.now[21]
        stubs_after_reload = {12: ENCODER, 22: ENCODER, 31: ENCODER, 32: ENCODER}
        watcher._check_stubs()
        assert watcher.state.restarts["feature_encoder"] == 2 and watcher.ready()
        assert not any(e["event"] == "stub_retired" for e in events)
    finally:
        repo.close()


def test_a_death_during_another_models_recovery_is_found_at_the_next_look(
    monkeypatch: pytest.MonkeyPatch, running: subprocess.Popen[bytes]
) -> None:
    files = {"feature_encoder": {}, "topk_resolver": {}}
    repo, watcher = _recovering_watcher(monkeypatch, files, lambda line: None)
    resolver = ("topk_resolver", "1")
    repo.index = _ready(ENCODER, resolver)
    watcher.server.process = running  # type: ignore[misc]
    stubs = _Stubs({11: ENCODER, 12: resolver})
    monkeypatch.setattr(watcher, "_current_stubs", stubs)
    loads: list[str] = []

    def load(url: str, model: str, *args: object, **kwargs: object) -> None:
        loads.append(model)
        if model == "feature_encoder":  # meanwhile the resolver's stub dies
            stubs.now = {21: ENCODER}
        else:
            stubs.now[22] = resolver

    monkeypatch.setattr("dispatch_service.ops.supervisor.load_model", load)
    try:
        watcher._stubs = stubs()
        del stubs.now[11]
        watcher._check_stubs()
        assert loads == ["feature_encoder"]
        watcher._check_stubs()  # the resolver's stub, lost while the encoder reloaded
        assert loads == ["feature_encoder", "topk_resolver"]
        assert watcher.state.restarts == Counter({"feature_encoder": 1, "topk_resolver": 1})
        assert watcher.ready()
    finally:
        repo.close()


def test_a_model_not_healed_keeps_the_server_not_ready_and_is_tried_again(
    monkeypatch: pytest.MonkeyPatch, running: subprocess.Popen[bytes]
) -> None:
    """Every reload attempt fails: the model stays not ready (never 'ready' with a dead
    instance) and is recovered again after a bounded wait, until it heals."""
    monkeypatch.setattr("dispatch_service.ops.supervisor.RELOAD_RETRY_WAITS_S", ())
    monkeypatch.setattr("dispatch_service.ops.supervisor.HEAL_RETRY_WAITS_S", (0.0,))
    events: list[dict[str, Any]] = []
    repo, watcher = _recovering_watcher(
        monkeypatch, {"feature_encoder": {}}, lambda e: events.append(json.loads(e))
    )
    repo.index = _ready(ENCODER)
    watcher.server.process = running  # type: ignore[misc]
    stubs = _Stubs({11: ENCODER})
    monkeypatch.setattr(watcher, "_current_stubs", stubs)
    refusals = [ModelControlError("HTTP 400: stub timeout", 400)] * 2

    def load(*args: object, **kwargs: object) -> None:
        if refusals:
            raise refusals.pop()
        stubs.now = {21: ENCODER}  # the new instance

    monkeypatch.setattr("dispatch_service.ops.supervisor.load_model", load)
    try:
        watcher._stubs = stubs()
        stubs.now = {}
        watcher._check_stubs()  # the death: one attempt, refused
        assert not watcher.ready()
        assert watcher.snapshot()["unhealed"] == {"feature_encoder": "reload failed"}
        text = watcher.metrics_text()
        assert 'dispatch_launcher_unhealed{model="feature_encoder"} 1' in text
        watcher._check_stubs()  # tried again: refused again
        assert not watcher.ready()
        watcher._check_stubs()  # the next load succeeds and brings the instance
        assert watcher.ready() and watcher.snapshot()["unhealed"] == {}
        kinds = [e["event"] for e in events]
        assert kinds.count("model_not_healed") == 2 and kinds.count("model_recovery_retried") == 2
        assert watcher.state.restarts["feature_encoder"] == 1  # one death, three reloads
    finally:
        repo.close()


def _signed_repository(root: Path) -> tuple[Path, TrustedKeys]:
    key = generate_private_key()
    for model, versions in (("feature_encoder", (1,)), ("dispatch_model", (1, 2))):
        for version in versions:
            folder = root / model / str(version)
            folder.mkdir(parents=True)
            (folder / "model.py").write_text(f"# {model} {version}\n")
            sign_version(folder, key)
    return root, TrustedKeys.from_public_keys(key.public_key())


def test_a_reload_never_loads_files_changed_since_they_were_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stub dies after its version's files changed on disk: the supervisor verifies before
    it reloads. The changed model is not loaded (it stays not ready, tried again later in
    case the files come back) and the refusal is logged with the digest of what was found."""
    model = "feature_encoder"
    repository, trusted = _signed_repository(tmp_path / "repo")
    events: list[dict[str, Any]] = []
    files = _stub_repository_files()
    repo, watcher = _recovering_watcher(monkeypatch, files, lambda e: events.append(json.loads(e)))
    watcher.verifier = LoadVerifier(repository, trusted)
    try:
        (repository / model / "1" / "model.py").write_text("import os  # not what was signed\n")
        watcher._recover(model, [41])
        assert repo.loads == []
        assert not watcher.ready() and model in watcher.snapshot()["unhealed"]
        assert model in watcher._heal_due
        (refusal,) = [e for e in events if e["event"] == "model_load_refused"]
        changed = (repository / model / "1" / "model.py").read_bytes()
        assert refusal["version"] == 1 and refusal["check"] == "digest_mismatch"
        assert refusal["file"] == "model.py"
        assert refusal["file_sha256"] == hashlib.sha256(changed).hexdigest()
        assert len(refusal["folder_sha256"]) == 64
    finally:
        repo.close()


def test_a_reload_leaves_out_a_canary_changed_since_it_was_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository, trusted = _signed_repository(tmp_path / "repo")
    events: list[dict[str, Any]] = []
    repo, watcher = _recovering_watcher(
        monkeypatch, _stub_repository_files(), lambda e: events.append(json.loads(e))
    )
    watcher.verifier = LoadVerifier(repository, trusted)
    try:
        (repository / "dispatch_model" / "2" / "extra.py").write_text("print('hi')\n")
        watcher._recover("dispatch_model", [41])
        assert repo.loads == [("unload dispatch_model", "k"), ("dispatch_model", "k")]
        assert repo.live["dispatch_model"]["version_policy"] == {"specific": {"versions": [1]}}
        (refusal,) = [e for e in events if e["event"] == "model_load_refused"]
        assert refusal["version"] == 2 and refusal["check"] == "unlisted_file"
        assert refusal["file"] == "extra.py"
    finally:
        repo.close()


def fallback_probes(*models: str, level: int = 2) -> list[Probe]:
    return [
        Probe(m, False, f"answered through fallback level {level}", 0.01, fallback_level=level)
        for m in models
    ]


def test_a_fallback_answer_is_degraded_not_dead_and_healthy_again_later(
    supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scoring model unloaded: the rule fallback answers every window. That is a
    degraded server, alive and serving, never declared dead for it."""
    events: list[dict[str, Any]] = []
    supervisor.report = lambda line: events.append(json.loads(line))
    monkeypatch.setattr(
        "dispatch_service.ops.supervisor.deep_check", lambda *a: fallback_probes("dispatch")
    )
    supervisor.state.last_ok = time.monotonic() - 60.0  # far past dead_after_s
    assert supervisor._check_health()
    assert supervisor.live() and supervisor.ready() and not supervisor.dead.is_set()
    snap = supervisor.snapshot()
    assert snap["status"] == "degraded" and snap["degraded"] == {"dispatch": 2}
    code, body = get(f"{supervisor.health_url}/healthz")
    assert code == 200 and json.loads(body)["status"] == "degraded"
    text = supervisor.metrics_text()
    assert 'dispatch_launcher_degraded{entry_point="dispatch"} 1' in text
    assert 'dispatch_launcher_fallback_level{entry_point="dispatch"} 2' in text
    assert [e["event"] for e in events] == ["degraded"]
    monkeypatch.setattr(
        "dispatch_service.ops.supervisor.deep_check", lambda *a: ok_probes("dispatch")
    )
    assert supervisor._check_health()
    assert supervisor.snapshot()["status"] == "ok"
    assert 'dispatch_launcher_degraded{entry_point="dispatch"} 0' in supervisor.metrics_text()
    assert events[-1]["event"] == "healthy"


def test_a_fallback_answer_ends_no_recovery(
    supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    supervisor.state.recovering = {"dispatch_model": time.monotonic() - 5.0}
    monkeypatch.setattr(
        "dispatch_service.ops.supervisor.deep_check", lambda *a: fallback_probes("dispatch")
    )
    assert supervisor._check_health()
    assert not supervisor.ready() and "dispatch_model" in supervisor.state.recovering


UNDER_REFUSED_LOAD = """\
nv_inference_request_success{model="dispatch",version="1"} 500
nv_inference_request_success{model="topk_resolver",version="1"} 500
nv_inference_request_failure{model="dispatch",reason="OTHER",version="1"} %d
nv_inference_pending_request_count{model="dispatch",version="1"} 7
nv_inference_pending_request_count{model="feature_encoder",version="1"} 5
nv_inference_pending_request_count{model="topk_resolver",version="1"} 0
"""


class _GatedServer(FakeServer):
    """A server with a drain gate, its metrics those of a drained server under continuous
    traffic: every look finds more refusals and requests queued at the gate, no success."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process  # type: ignore[assignment]
        self.gate_closed = False
        self.stopped = False
        self.looks = 0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.looks += 1
                body = (UNDER_REFUSED_LOAD % (100 * server.looks)).encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.metrics_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"

    def close_gate(self) -> None:
        self.gate_closed = True

    def stop(self, timeout_s: float = 0) -> None:
        self.stopped = True


def test_a_drain_under_continuous_traffic_closes_the_gate_ends_quiet_and_kills_triton() -> None:
    """Refused requests keep coming (and queue at the gate) while nothing accepted is left:
    the drain ends after quiet_s, not at its timeout, and Triton is killed at once -- a
    graceful stop of 2.51 would answer NOT_FOUND while unloading."""
    with subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    ) as triton:
        server = _GatedServer(triton)
        events: list[dict[str, Any]] = []
        settings = SupervisorSettings(
            health_port=0, drain_timeout_s=20.0, drain_grace_s=0.1, quiet_s=0.3
        )
        watcher = Supervisor(server, settings, report=lambda e: events.append(json.loads(e)))
        try:
            watcher.drain_and_stop()
            assert triton.wait(timeout=10) == -9  # SIGKILL
        finally:
            triton.kill()
            server.httpd.shutdown()
            server.httpd.server_close()
    assert server.gate_closed and server.stopped and not watcher.ready()
    (finished,) = [e for e in events if e["event"] == "drain_finished"]
    assert finished["quiet"] is True  # ended once quiet, not by its timeout


def test_the_deep_checks_windows_are_counted_apart(
    supervisor: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probes are left out of the project's metrics (`serving.probe`); the launcher says
    how many it sent, for subtracting them from Triton's own counters."""
    monkeypatch.setattr(
        "dispatch_service.ops.supervisor.deep_check", lambda *a: ok_probes("dispatch")
    )
    assert supervisor._check_health() and supervisor._check_health()
    assert supervisor.snapshot()["probes"] == {"dispatch": 2}
    assert 'dispatch_launcher_probes_total{entry_point="dispatch"} 2' in supervisor.metrics_text()


def test_a_stub_running_code_that_does_not_verify_keeps_the_server_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running: subprocess.Popen[bytes]
) -> None:
    """Triton's repository API (behind the admin key) can load a model from uploaded files
    (a temporary folder outside the repository) or from files changed on disk, without the
    launcher: the new stub is reported with its digests and the server is not ready while
    it runs."""
    repository, trusted = _signed_repository(tmp_path / "repo")
    events: list[dict[str, Any]] = []
    watcher = Supervisor(
        FakeServer(),
        SupervisorSettings(health_port=0),
        report=lambda e: events.append(json.loads(e)),
        verifier=LoadVerifier(repository, trusted),
    )
    watcher.server.process = running  # type: ignore[misc]
    uploaded = tmp_path / "folderXYZ" / "1" / "model.py"
    uploaded.parent.mkdir(parents=True)
    uploaded.write_text("import os\n")
    signed = repository / "feature_encoder" / "1" / "model.py"
    files = {21: uploaded, 22: signed}
    stubs = _Stubs({11: ENCODER})
    monkeypatch.setattr(watcher, "_current_stubs", stubs)
    monkeypatch.setattr(
        "dispatch_service.ops.supervisor.stub_model_files", lambda parent: dict(files)
    )
    watcher._stubs = stubs()
    stubs.now = {11: ENCODER, 21: ("folderXYZ", "1"), 22: ENCODER}
    monkeypatch.setattr(watcher, "_deaths", lambda lost, now: {})
    watcher._check_stubs()
    (found,) = [e for e in events if e["event"] == "unverified_code_running"]
    assert found["pid"] == 21 and "outside the model repository" in found["reason"]
    assert found["file_sha256"] == hashlib.sha256(b"import os\n").hexdigest()
    assert not watcher.ready()
    assert watcher.snapshot()["unhealed"] == {"folderXYZ": "running code that does not verify"}
    stubs.now = {11: ENCODER, 22: ENCODER}  # unloaded: the server is ready again
    watcher._check_stubs()
    assert watcher.ready()
    # A stub started from repository files changed since they were signed.
    signed.write_text("import os  # changed\n")
    stubs.now = {11: ENCODER, 22: ENCODER, 23: ENCODER}
    files[23] = signed
    watcher._check_stubs()
    assert events[-1]["event"] == "unverified_code_running" and events[-1]["pid"] == 23
    assert events[-1]["check"] == "digest_mismatch" and not watcher.ready()


def test_two_stubs_found_dead_at_one_look_count_as_two_deaths_healed_by_one_reload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo, watcher = _recovering_watcher(monkeypatch, _stub_repository_files(), lambda e: None)
    try:
        watcher._recover("feature_encoder", [41, 42])
        assert repo.loads == [("feature_encoder", "k")]
        assert watcher.state.restarts["feature_encoder"] == 2
        assert 'dispatch_launcher_stub_restarts_total{model="feature_encoder"} 2' in (
            watcher.metrics_text()
        )
    finally:
        repo.close()
