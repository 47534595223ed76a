"""Pieces of the launcher's supervisor that need no server (dispatch_service.ops.supervisor):
the deep check's verdicts, the restart policy, the drain. Stub healing is
test_stub_healing.py's, the HTTP endpoint test_health_endpoint.py's; the stand-ins are in
supervisor_stand_ins.py and the ``supervisor`` fixture in conftest.py."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from supervisor_stand_ins import CountingServer, FakeServer, StandInRepository, http_get, ok_probes

from dispatch_service.core.settings import RELOAD_MARK_PARAMETER
from dispatch_service.ops.health import Probe
from dispatch_service.ops.supervisor import Supervisor
from dispatch_service.ops.supervisor_state import SupervisorSettings


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


def test_a_restart_loads_back_the_configs_set_live() -> None:
    """`deploy` set a canary (dispatch_model versions, router and fused parameters): a server
    restarted by the policy would read config.pbtxt again and end the rollout."""
    files = {
        "dispatch_model": {"version_policy": {"specific": {"versions": [1]}}},
        "dispatch_router": {"parameters": {"canary_percent": {"string_value": "0"}}},
        "dispatch_fused": {"parameters": {"canary_percent": {"string_value": "0"}}},
        "dispatch": {"platform": "ensemble"},
    }
    repo = StandInRepository(files)
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


def test_a_restart_serves_on_first_instances_keeps_the_live_routing_then_adds_the_rest() -> None:
    """A restart is ready on one instance a model (half a full start's CPU); the live
    routing goes back on that instance alone, and the stub watch adds the other instances
    once the server is ready, not before."""
    one = [{"count": 1, "kind": "KIND_CPU"}]
    files = {"dispatch_router": {"parameters": {"canary_percent": {"string_value": "0"}}}}
    repo = StandInRepository(files)

    class FirstInstances(CountingServer):
        pending: tuple[str, ...] = ()

        def start_first_instances(self, timeout_s: float = 0, live: object = None) -> object:
            self.calls.append("start_first_instances")
            repo.live["dispatch_router"] = {**files["dispatch_router"], "instance_group": one}
            self.pending = ("dispatch_router",)
            return self

        @property
        def instances_pending(self) -> tuple[str, ...]:
            return self.pending

        def add_instances(self, timeout_s: float = 0) -> list[str]:
            self.calls.append("add_instances")
            self.pending = ()
            return ['{"event": "instances_added"}']

    server = FirstInstances()
    server.http_url = repo.url  # type: ignore[misc]
    events: list[str] = []
    watcher = Supervisor(server, SupervisorSettings(health_port=0), report=events.append)
    try:
        canary = {
            "parameters": {"canary_percent": {"string_value": "25"}},
            "instance_group": [{"count": 1, "kind": "KIND_CPU"}, {"count": 1, "kind": "KIND_CPU"}],
        }
        repo.live["dispatch_router"] = canary
        watcher._remember_live()
        with watcher._lock:
            watcher.state.ready = False
        watcher._restart()
        assert server.calls == ["stop", "start_first_instances"]
        # The canary's routing is back, on the first instance alone.
        assert repo.live["dispatch_router"] == {**canary, "instance_group": one}
        assert watcher.ready() and server.instances_pending == ("dispatch_router",)
        with watcher._lock:
            watcher.state.ready = False
        watcher._add_pending_instances()  # not ready: not yet
        assert server.calls[-1] == "start_first_instances"
        with watcher._lock:
            watcher.state.ready = True
        watcher._add_pending_instances()
        watcher._add_pending_instances()  # nothing left: loads nothing
        assert server.calls[-1] == "add_instances" and server.calls.count("add_instances") == 1
        assert '{"event": "instances_added"}' in events
    finally:
        repo.close()


def test_a_restart_starts_with_the_live_configs_and_loads_nothing_back() -> None:
    """The live routing goes to the restart's start (a recovery's reload mark left out), so
    the new server serves it from the start: no reload of new stubs before it is ready. A
    verified server starts from its files and loads the live configs back, each checked."""
    files = {"dispatch_router": {"parameters": {"canary_percent": {"string_value": "0"}}}}
    repo = StandInRepository(files)
    starts: list[object] = []

    class LiveStart(CountingServer):
        def start_first_instances(self, timeout_s: float = 0, live: object = None) -> object:
            self.calls.append("start_first_instances")
            starts.append(live)
            repo.live.update(live or {})  # Triton started each with its config
            return self

    server = LiveStart()
    server.http_url = repo.url  # type: ignore[misc]
    events: list[str] = []
    watcher = Supervisor(server, SupervisorSettings(health_port=0), report=events.append)
    try:
        canary = {"parameters": {"canary_percent": {"string_value": "25"}}}
        marked = {
            "parameters": {**canary["parameters"], RELOAD_MARK_PARAMETER: {"string_value": "3"}}
        }
        repo.live["dispatch_router"] = marked
        watcher._remember_live()
        watcher._restart()
        assert starts == [{"dispatch_router": canary}]
        assert repo.live["dispatch_router"] == canary
        assert repo.loads == []  # served as it started: nothing loaded back
        assert not any('"live_config_restored"' in e for e in events)
        assert watcher.ready()
        watcher.verifier = object()  # type: ignore[assignment]  # a verified server's
        assert watcher._live_at_start() == {}
    finally:
        repo.close()


def test_after_a_failed_start_on_first_instances_the_next_start_is_a_full_one() -> None:
    """A client killing stubs as the server starts (a wrapped shape) fails a start on one
    instance a model, and five such starts in a row would give the server up: after one,
    the launcher starts every instance."""

    class FailingFirst(CountingServer):
        def start_first_instances(self, timeout_s: float = 0, live: object = None) -> object:
            self.calls.append("start_first_instances")
            raise RuntimeError("required entry point(s) dispatch_fused not serving")

    server = FailingFirst()
    settings = SupervisorSettings(health_port=0, on_dead="restart", failed_start_wait_s=0.0)
    watcher = Supervisor(server, settings, report=lambda line: None)
    watcher._restart()
    watcher._restart()
    starts = [call for call in server.calls if call.startswith("start")]
    assert starts == ["start_first_instances", "start"]
    assert watcher.state.server_restarts == 1 and not watcher.dead.is_set()
    watcher._restart()  # ready again: the next restart is on first instances again
    starts = [call for call in server.calls if call.startswith("start")]
    assert starts == ["start_first_instances", "start", "start_first_instances"]


def test_a_failed_reading_of_the_live_configs_keeps_the_last_one() -> None:
    """On a loaded host a config read timed out now and then; a crash right after it
    restarted the server with the files' routing: the last reading stands."""
    files = {
        "dispatch_model": {"version_policy": {"specific": {"versions": [1]}}},
        "dispatch_router": {"parameters": {"canary_percent": {"string_value": "0"}}},
    }
    repo = StandInRepository(files)
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


def test_crashes_after_ready_never_spend_the_restart_budget() -> None:
    """Traffic crashed the embedded 2.51 six times in six bursts and the launcher, at its old
    limit of 5 restarts in 10 minutes, exited 3: the service was gone. A restart that
    reaches ready never counts."""
    server = CountingServer()
    settings = SupervisorSettings(health_port=0, on_dead="restart", max_failed_starts=2)
    watcher = Supervisor(server, settings, report=lambda line: None)
    for _ in range(20):
        assert watcher._dead("tritonserver exited with -11", silent=0.0)
    assert server.calls == ["stop", "start"] * 20 and watcher.state.server_restarts == 20
    assert not watcher.dead.is_set() and watcher.live() and watcher.ready()


class _FailingStarts(CountingServer):
    """A server whose next ``failures`` starts fail, as one that cannot start would."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def start(self, timeout_s: float = 0) -> object:
        super().start(timeout_s)
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError("dispatch_fused: stub failed to start")
        return self


def test_a_server_that_cannot_start_is_given_up_after_max_failed_starts_in_a_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_probe(*args: object) -> list[Probe]:
        raise AssertionError("probed a server that is not running")

    monkeypatch.setattr("dispatch_service.ops.supervisor.deep_check", no_probe)
    events: list[dict[str, Any]] = []
    settings = SupervisorSettings(
        health_port=0, on_dead="restart", max_failed_starts=3, failed_start_wait_s=0.0
    )
    # Two failed starts, then one that works: the count starts again.
    server = _FailingStarts(failures=2)
    watcher = Supervisor(server, settings, report=lambda line: events.append(json.loads(line)))
    assert watcher._dead("tritonserver exited with -11", silent=0.0)
    assert not watcher.ready() and not watcher.dead.is_set()
    # The next check finds no process (the failed start stopped it) and starts again at once.
    assert watcher._check_health() and not watcher.ready()
    assert watcher._check_health() and watcher.ready()
    assert [e["failed_starts"] for e in events if e["event"] == "restart_failed"] == [1, 2]
    # Three failures in a row: given up, with the cause.
    server.failures = 3
    assert watcher._dead("tritonserver exited with -11", silent=0.0)
    assert watcher._check_health()
    assert not watcher._check_health()
    assert watcher.dead.is_set() and not watcher.live()
    reason = watcher.snapshot()["dead_reason"]
    assert "restart failed 3 times in a row" in reason and "stub failed to start" in reason
    assert events[-1]["event"] == "restart_limit"


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
    code, body = http_get(f"{supervisor.health_url}/healthz")
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

    def stop(self, timeout_s: float = 0, *, graceful: bool = True) -> None:
        self.stopped = True
        self.graceful = graceful


def test_a_drain_under_continuous_traffic_closes_the_gate_ends_quiet_and_kills_triton() -> None:
    """Refused requests keep coming (and queue at the gate) while nothing accepted is left:
    the drain ends after quiet_s, not at its timeout, and Triton is stopped at once (not
    gracefully) -- a graceful stop of 2.51 would answer NOT_FOUND while unloading."""
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
        finally:
            triton.kill()
            server.httpd.shutdown()
            server.httpd.server_close()
    assert server.gate_closed and server.stopped and not server.graceful
    assert not watcher.ready()
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


def test_a_slow_healthz_field_holds_up_neither_readiness_nor_the_drain(
    supervisor: Supervisor,
) -> None:
    """The fleet watcher's ``/healthz`` field waits on the watcher's lock, held while it
    applies a revision (a load that may take a minute): a snapshot taken meanwhile held the
    supervisor's lock too, and SIGTERM printed no ``drain_started`` for 60 s."""
    release = threading.Event()
    supervisor.detail_sources["fleet_state"] = lambda: release.wait(30)
    scrape = threading.Thread(target=supervisor.snapshot, daemon=True)
    scrape.start()
    try:
        answered = threading.Event()

        def ask() -> None:
            supervisor.ready()
            supervisor.live()
            with supervisor._lock:
                supervisor.state.draining = True
            answered.set()

        threading.Thread(target=ask, daemon=True).start()
        assert answered.wait(10), "readiness and the drain waited on a /healthz field"
    finally:
        release.set()
        scrape.join(timeout=30)


def test_a_server_seen_catching_a_crash_signal_is_not_ready(supervisor: Supervisor) -> None:
    assert supervisor.ready()
    supervisor.crash_seen = lambda: True
    assert not supervisor.ready() and not supervisor.snapshot()["ready"]


@pytest.mark.parametrize("policy", ["exit", "restart"])
def test_a_crash_ends_the_wait_for_the_next_check_under_restart_only(policy: str) -> None:
    """Under ``restart`` an exited Triton, or one seen catching a crash signal, is checked
    (and so restarted) without waiting out ``check_every_s`` (an hour here)."""
    server = CountingServer()
    settings = SupervisorSettings(health_port=0, on_dead=policy, check_every_s=3600.0)  # type: ignore[arg-type]
    watcher = Supervisor(server, settings, report=lambda line: None)
    waited: list[bool] = []
    waiting = threading.Thread(target=lambda: waited.append(watcher._wait_for_next_check()))
    crashed = subprocess.Popen([sys.executable, "-c", "import os; os.abort()"])
    crashed.wait()
    server.process = crashed  # type: ignore[assignment]
    waiting.start()
    waiting.join(timeout=30 if policy == "restart" else 1)
    if policy == "restart":
        assert waited == [False]  # the check is due now
        alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            server.process = alive  # type: ignore[assignment]
            watcher.crash_seen = lambda: True  # it caught SIGSEGV and hangs
            assert watcher._wait_for_next_check() is False
            assert watcher._check_health()
            assert server.calls == ["kill", "start"] and watcher.state.server_restarts == 1
        finally:
            alive.kill()
            alive.wait()
    else:
        assert waiting.is_alive() and waited == []  # the launcher's loop handles an exit
        watcher._stop.set()
        waiting.join(timeout=30)
        assert waited == [True]
