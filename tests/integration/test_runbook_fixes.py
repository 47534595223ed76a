"""docs/runbook.md's fixes, done as written against a real launcher, scraped by a real
Prometheus as compose's Prometheus does (jobs `dispatch-launcher` and `triton`).

Each test raises an alert's condition, reads it through the alert's own expression
(deploy/prometheus/alerts.yml, its `for` left out), applies the entry's **Do** (the same
`dispatch-admin` commands) and sees the expression come back empty, and claims the alert with
``@pytest.mark.runbook_fix`` (tests/unit/deploy/test_runbook_coverage.py requires one claim
per alert). An alert over a rate or an increase is read over a window that starts at the
burst that raised it, and after the fix over a window that starts after the fix: the alert's
own window (5 to 30 minutes) reads the same once it has moved past the fix. The fleet and
routing entries are tested with the fleet (test_fleet.py).

One launcher serves every test, as the images run it: verified (`--trusted-keys`), following
its fleet store (`--state-store`, a fleet of one), restarting a dead server (`--on-dead
restart`); its repository holds a deliberately worse scoring version 3 and its encoder calls
a loopback geocoding server as both providers. The tests that stop Triton or the launcher
run last.
"""

from __future__ import annotations

import io
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from launcher_helpers import Launcher, free_port, signed_repository, status, worse_version
from patience import patience, wait_for
from prometheus_helpers import Prometheus, alert_expr, running_prometheus
from tritonclient.utils import InferenceServerException

from dispatch_client import DispatchClient
from dispatch_client.outcomes import OutcomeReport
from dispatch_contract import ORDER_FIELD_COLUMNS
from dispatch_service.core.repository_layout import ENCODER_MODEL, model_layout
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer
from dispatch_service.offline import gazetteer_build
from dispatch_service.offline.geocoding_server import GeocodingServer, use_as_providers
from dispatch_service.offline.simulator import generate_window
from dispatch_service.ops import admin
from dispatch_service.ops.model_control import (
    load_model,
    model_config,
    ready_versions,
    unload_model,
    with_versions,
)
from dispatch_service.ops.server import Ports
from dispatch_service.ops.stubs import stub_versions
from triton_helpers import ROUTED_OUTPUT_NAMES, infer_grpc, sim_window

Arrays = dict[str, np.ndarray[Any, Any]]
STABLE, CANARY, WORSE = 1, 2, 3
GEOCODER_KEY = "runbook-geocoder-key"
# A provider answer may take 800 ms (the window waits up to 1 s): a slow provider then holds
# address windows without failing, the case of DispatchLatencyHigh; a failing one opens the
# breaker after 5 failures, as shipped.
GEOCODER_SETTINGS = {"geocoder_deadline_ms": "1000", "geocoder_attempt_timeout_ms": "800"}
SLOW_PROVIDER_MS = 600
PICKUP_LAT, CREATED_AT, PROMISED = (
    ORDER_FIELD_COLUMNS.index(c) for c in ("pickup_lat", "created_at", "promised_minutes")
)


@dataclass
class Served:
    folder: Path
    repository: Path
    trusted: Path
    signing_key: Path
    store: Path
    geocoder: GeocodingServer
    addresses: gazetteer_build.AddressBook
    ports: Ports
    health_port: int
    launchers: list[Launcher] = field(default_factory=list)

    @property
    def launcher(self) -> Launcher:
        return self.launchers[-1]

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def admin_key(self) -> str:
        return (self.folder / "keys" / "admin.key").read_text().strip()

    def start(self) -> None:
        """The launcher as the images run it, on this module's ports (what a process manager
        does when it restarts one)."""
        launcher = Launcher(
            self.ports,
            self.folder / "server.log",
            self.folder / "keys",
            *("--health-port", str(self.health_port)),
            *("--model-repository", str(self.repository)),
            *("--trusted-keys", str(self.trusted)),
            *("--state-store", str(self.store)),
            *("--on-dead", "restart"),
            # The reloads here leave stale stubs (2.51 never ends them); the launcher's clean
            # restart that releases them, after 120 s by default, would fall into another
            # test's window as a DispatchServerRestarts of its own.
            *("--stub-leak-max-age", "3600"),
        )
        self.launchers.append(launcher)
        assert launcher.read_until("ready:", patience(240)), "\n".join(launcher.lines)
        # its later events are read too, so a full pipe never blocks it
        threading.Thread(target=launcher.read_until, args=("\0", 3600), daemon=True).start()

    def tritonserver(self) -> int:
        (pid,) = self.launcher.children("tritonserver")
        return pid

    def dispatch_admin(self, command: str, *argv: str) -> str:
        """`dispatch-admin COMMAND ARGV`, with this fleet's store, keys and repository (what
        `make serve`'s defaults and DISPATCH_* give an operator); asserts exit 0."""
        out = io.StringIO()
        fleet = ("--state-store", str(self.store), "--trusted-keys", str(self.trusted))
        signing = ("--key", str(self.signing_key), "--model-repository", str(self.repository))
        code = admin.main([command, *argv, *fleet, *signing], out)
        assert code == 0, out.getvalue()
        return out.getvalue()

    def send(self, tensors: Arrays, model: str = "dispatch") -> Arrays:
        with grpcclient.InferenceServerClient(self.grpc_url) as client:
            return infer_grpc(client, tensors, model, output_names=ROUTED_OUTPUT_NAMES)

    def address_window(self, seed: int) -> Arrays:
        """A window whose every order gives its pickup and drop-off as a typed address (a
        new seed: addresses the encoder has not cached)."""
        window = generate_window(np.random.default_rng(seed), 4, 12)
        return dict(window_to_wire(gazetteer_build.window_with_addresses(window, self.addresses)))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("runbook")
    gazetteer, recogniser = Gazetteer.load(), AdminRecogniser()
    with GeocodingServer(GEOCODER_KEY, gazetteer, recogniser) as geocoder:
        repository, trusted, signing_key = signed_repository(folder)
        use_as_providers(
            repository, geocoder.url, GEOCODER_KEY, GEOCODER_SETTINGS, folder / "geocoder.key"
        )
        worse_version(repository, signing_key, WORSE)  # signs the repository again
        running = Served(
            folder,
            repository,
            trusted,
            signing_key,
            folder / "fleet",
            geocoder,
            gazetteer_build.AddressBook(gazetteer, recogniser),
            Ports.free(),
            free_port(),
        )
        try:
            running.start()
            yield running
        finally:
            for launcher in running.launchers:
                launcher.stop()


@pytest.fixture(scope="module")
def prometheus(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    targets = {
        "dispatch-launcher": f"{served.health_url}/metrics",
        "triton": f"http://127.0.0.1:{served.ports.metrics}/metrics",
    }
    with running_prometheus(tmp_path_factory.mktemp("prometheus"), targets) as server:
        wait_for(lambda: server.value("up") == 2.0, "both ports scraped", 45, 0.25)
        yield server


def firing(prometheus: Prometheus, alert: str, since: float | None = None) -> list[dict[str, str]]:
    """The series for which ``alert``'s condition holds now (their labels); with ``since``
    (a `time.time()`), its ranges read the seconds since then."""
    window = None if since is None else time.time() - since
    return [sample["metric"] for sample in prometheus.query(alert_expr(alert, window))]


def wait_until_clear(prometheus: Prometheus, *alerts: str, within_s: float = 120) -> None:
    for alert in alerts:
        wait_for(lambda a=alert: not firing(prometheus, a), f"{alert} clear", within_s, 0.5)  # type: ignore[misc]


def wait_until_raised(
    prometheus: Prometheus, alert: str, since: float | None = None, within_s: float = 60
) -> list[dict[str, str]]:
    found: list[dict[str, str]] = []

    def raised() -> bool:
        found[:] = firing(prometheus, alert, since)
        return bool(found)

    wait_for(raised, f"{alert}'s condition", within_s, 0.5)
    return found


def clear_since_the_fix(
    prometheus: Prometheus, alerts: tuple[str, ...], fixed_at: float, traffic: str
) -> None:
    """Each alert's condition, read over the seconds since ``fixed_at``, is empty while
    ``traffic`` (a PromQL sum over the same window, ``{w}`` in its range) is above 0: the
    expression is read over served requests, not over silence."""

    def clear() -> bool:
        window = time.time() - fixed_at
        seen = prometheus.value(traffic.replace("{w}", f"{math.ceil(window)}s"))
        return seen > 0 and not any(firing(prometheus, a, fixed_at) for a in alerts)

    wait_for(clear, f"{', '.join(alerts)} clear since the fix, with traffic", 60, 0.5)


def after_the_fix() -> float:
    """A window's start after a fix: what was counted before it has reached the metrics
    ports (the models flush every 50 ms) and been scraped (every second)."""
    time.sleep(2.5)
    return time.time()


def invalid_window(seed: int) -> Arrays:
    window = sim_window(seed, 6, 20)
    fields = window["ORDER_FIELDS"].copy()
    fields[0, PICKUP_LAT] = np.nan
    window["ORDER_FIELDS"] = fields
    return window


@pytest.mark.runbook_fix("DispatchValidationRejections", "DispatchRequestFailures")
def test_invalid_windows_clear_once_the_client_sends_valid_ones(
    served: Served, prometheus: Prometheus
) -> None:
    """A client sends invalid windows (a NaN pickup): DispatchValidationRejections and
    DispatchRequestFailures. **Do**: the client's owners fix their windows; both clear."""
    burst = time.time()
    for n in range(40):
        with pytest.raises(InferenceServerException, match="ORDER_FIELDS"):
            served.send(invalid_window(n))
        time.sleep(0.1)  # a burst over several scrapes: the rate sees its increase
    (rejected,) = wait_until_raised(prometheus, "DispatchValidationRejections", burst)
    assert rejected["tensor"].startswith("ORDER_FIELDS"), rejected
    failing = wait_until_raised(prometheus, "DispatchRequestFailures", burst)
    assert {labels["model"] for labels in failing} == {"dispatch"}
    fixed = after_the_fix()
    for n in range(20):
        served.send(sim_window(n, 6, 20))
        time.sleep(0.1)
    clear_since_the_fix(
        prometheus,
        ("DispatchValidationRejections", "DispatchRequestFailures"),
        fixed,
        'sum(rate(nv_inference_request_success{model="dispatch"}[{w}]))',
    )


@pytest.mark.runbook_fix("DispatchModelFallback")
def test_model_fallback_clears_with_a_rollback_that_unloads_the_canary(
    served: Served, prometheus: Prometheus
) -> None:
    """Every user on canary version 2, which then fails (unloaded behind the fleet's back):
    the stable retry answers (level 1), DispatchModelFallback. **Do**: `dispatch-admin
    rollback --unload-canary --key KEY`."""
    served.dispatch_admin(
        "deploy", "--version", str(CANARY), "--canary-percent", "100", "--wait-s", "60"
    )
    config = model_config(served.health_url, "dispatch_model")
    load_model(
        served.health_url, "dispatch_model", with_versions(config, [STABLE]), served.admin_key
    )
    burst = time.time()
    for n in range(10):
        levels = served.send(sim_window(n, 6, 20))["ORDER_FALLBACK_LEVEL"]
        assert levels.tolist() == [1] * 6
        time.sleep(0.3)
    assert wait_until_raised(prometheus, "DispatchModelFallback", burst)
    served.dispatch_admin("rollback", "--unload-canary", "--wait-s", "60")
    assert ready_versions(served.health_url, "dispatch_model", served.admin_key) == (STABLE,)
    fixed = after_the_fix()
    for n in range(10):
        assert served.send(sim_window(n, 6, 20))["ORDER_FALLBACK_LEVEL"].tolist() == [0] * 6
        time.sleep(0.3)
    clear_since_the_fix(
        prometheus,
        ("DispatchModelFallback",),
        fixed,
        "sum(rate(dispatch_router_orders_total[{w}]))",
    )


@pytest.mark.runbook_fix("DispatchShadowDisagreement")
def test_shadow_disagreement_clears_when_the_worse_candidate_is_rolled_back(
    served: Served, prometheus: Prometheus
) -> None:
    """Version 3 (its objectives turned upside down) shadow-scores every request: it agrees
    with version 1 on the best rider for few orders, DispatchShadowDisagreement. **Do**:
    roll back the worse candidate, `dispatch-admin rollback --key KEY` (no shadow)."""
    served.dispatch_admin("shadow", "--version", str(WORSE), "--percent", "100", "--wait-s", "60")
    burst = time.time()
    for n in range(10):
        served.send(sim_window(100 + n, 12, 40))
        time.sleep(0.3)
    (pair,) = wait_until_raised(prometheus, "DispatchShadowDisagreement", burst)
    assert (pair["primary"], pair["shadow"]) == (str(STABLE), str(WORSE))
    served.dispatch_admin("rollback", "--unload-canary", "--wait-s", "60")
    fixed = after_the_fix()
    for n in range(10):
        served.send(sim_window(100 + n, 12, 40))
        time.sleep(0.3)
    clear_since_the_fix(
        prometheus,
        ("DispatchShadowDisagreement",),
        fixed,
        "sum(rate(dispatch_router_orders_total[{w}]))",
    )
    since = math.ceil(time.time() - fixed)
    assert prometheus.value(f"sum(increase(dispatch_shadow_orders_total[{since}s]))") == 0


@pytest.mark.runbook_fix("DispatchDegraded")
def test_degraded_clears_once_a_rollback_loads_the_scoring_model_again(
    served: Served, prometheus: Prometheus
) -> None:
    """The scoring model unloaded: every entry point answers through the rule-based
    fallback, DispatchDegraded. **Do** (as for DispatchRuleBasedDispatch): `dispatch-admin
    rollback --key KEY`."""
    wait_until_clear(prometheus, "DispatchDegraded")
    unload_model(served.health_url, "dispatch_model", served.admin_key, 120)
    degraded = wait_until_raised(prometheus, "DispatchDegraded")
    assert "dispatch" in {labels["entry_point"] for labels in degraded}
    served.dispatch_admin("rollback", "--wait-s", "60")
    assert ready_versions(served.health_url, "dispatch_model", served.admin_key) == (STABLE,)
    wait_until_clear(prometheus, "DispatchDegraded")
    assert served.send(sim_window(1, 6, 20))["ORDER_FALLBACK_LEVEL"].tolist() == [0] * 6


@pytest.mark.runbook_fix("DispatchGeocoderBreakerOpen")
def test_geocoder_breaker_clears_once_the_provider_answers_again(
    served: Served, prometheus: Prometheus
) -> None:
    """Both providers answer errors: their breakers open after 5 failures (the gazetteer
    locates the addresses), DispatchGeocoderBreakerOpen. **Do**: the provider fixed; the
    breaker's next trial call succeeds and closes it."""
    wait_until_clear(prometheus, "DispatchGeocoderBreakerOpen")
    for kind in ("amap", "baidu"):
        served.geocoder.set_mode(kind, failure="error_status")
    seed = 1000
    try:
        while len(firing(prometheus, "DispatchGeocoderBreakerOpen")) < 2 and seed < 1030:
            served.send(served.address_window(seed))
            seed += 1
            time.sleep(0.3)
        providers = {
            labels["provider"] for labels in firing(prometheus, "DispatchGeocoderBreakerOpen")
        }
        assert providers == {"primary", "secondary"}
    finally:
        for kind in ("amap", "baidu"):
            served.geocoder.set_mode(kind)

    def closed() -> bool:
        nonlocal seed
        served.send(served.address_window(seed))
        seed += 1
        return not firing(prometheus, "DispatchGeocoderBreakerOpen")

    wait_for(closed, "DispatchGeocoderBreakerOpen clear once the provider answers", 90, 1.0)


@pytest.mark.runbook_fix("DispatchLatencyHigh", "DispatchQueueTimeHigh")
def test_latency_clears_once_the_slow_provider_is_fast_again(
    served: Served, prometheus: Prometheus
) -> None:
    """The geocoding providers answer in 600 ms: address windows wait for them (in the
    encoder's instances, so others queue behind), DispatchLatencyHigh and
    DispatchQueueTimeHigh. **Do**: the provider fixed; both clear."""
    for kind in ("amap", "baidu"):
        served.geocoder.set_mode(kind, latency_ms=SLOW_PROVIDER_MS)
    burst = time.time()
    try:
        senders = [
            threading.Thread(target=lambda s=seed: served.send(served.address_window(s)))
            for seed in range(2000, 2012)
        ]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(timeout=patience(60))
        latency = wait_until_raised(prometheus, "DispatchLatencyHigh", burst)
        assert {labels["model"] for labels in latency} == {"dispatch"}
        assert wait_until_raised(prometheus, "DispatchQueueTimeHigh", burst)
    finally:
        for kind in ("amap", "baidu"):
            served.geocoder.set_mode(kind)
    fixed = after_the_fix()
    for seed in range(2100, 2112):
        served.send(served.address_window(seed))
    clear_since_the_fix(
        prometheus,
        ("DispatchLatencyHigh", "DispatchQueueTimeHigh"),
        fixed,
        'sum(rate(nv_inference_request_success{model="dispatch"}[{w}]))',
    )


KILLED_STUBS = 4  # DispatchStubRestarts: more than 3 deaths of one model's stubs


@pytest.mark.runbook_fix("DispatchStubRestarts")
def test_stub_restarts_clear_once_the_deaths_stop(served: Served, prometheus: Prometheus) -> None:
    """Four stubs of the scoring model killed in turn (as the OOM killer would), each
    healed (the router's fallback answers meanwhile): DispatchStubRestarts. **Do**: the
    cause removed (here: no more kills); no death since, so the condition over the time
    since is clear, and the alert's 30 minutes follow."""
    model = "dispatch_model"

    def restarts() -> int:
        return int(prometheus.value(f'dispatch_launcher_stub_restarts_total{{model="{model}"}}'))

    before = restarts()
    for n in range(KILLED_STUBS):
        stubs = [
            pid for pid, (name, _) in stub_versions(served.tritonserver()).items() if name == model
        ]
        os.kill(max(stubs), signal.SIGKILL)
        try:
            wait_for(lambda n=n: restarts() > before + n, f"death {n + 1} counted", 90, 0.5)  # type: ignore[misc]
            wait_for(lambda: status(f"{served.health_url}/readyz") == 200, "healed", 90, 0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n" + "\n".join(served.launcher.lines[-15:])) from None
    (raised,) = wait_until_raised(prometheus, "DispatchStubRestarts")
    assert raised["model"] == model
    fixed = after_the_fix()
    for n in range(10):
        served.send(sim_window(n, 6, 20))
        time.sleep(0.3)
    clear_since_the_fix(
        prometheus,
        ("DispatchStubRestarts",),
        fixed,
        'sum(rate(nv_inference_request_success{model="dispatch"}[{w}]))',
    )


@pytest.mark.runbook_fix("DispatchRolloutControllerAbsent")
def test_controller_absent_clears_when_the_controller_runs_again(
    served: Served, prometheus: Prometheus
) -> None:
    """A rollout started whose controller's lease ran out (no `rollout run`):
    DispatchRolloutControllerAbsent. **Do**: `dispatch-admin rollout run --trusted-keys DIR
    --key FILE`; it clears once that controller holds the lease. Then `rollout abort` from
    another process while the controller holds the lease (the operator needs none), which
    ends the controller too; the controller gives up its lease as it exits."""
    outcomes = ("--outcome-store", str(served.folder / "outcomes.sqlite3"))
    served.dispatch_admin(
        "rollout",
        "start",
        "--version",
        str(CANARY),
        "--steps",
        "10,100",
        "--lease-s",
        "2",
        *outcomes,
    )
    wait_until_raised(prometheus, "DispatchRolloutControllerAbsent")
    fleet = ("--state-store", str(served.store), "--trusted-keys", str(served.trusted))
    signing = ("--key", str(served.signing_key), "--model-repository", str(served.repository))
    holder = ("--holder", "runbook-controller")  # its name in the lease
    run = ["rollout", "run", *fleet, *signing, *outcomes, *holder]
    controller = subprocess.Popen(
        [sys.executable, "-m", "dispatch_service.ops.admin", *run],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until_clear(prometheus, "DispatchRolloutControllerAbsent", within_s=60)
        served.dispatch_admin("rollout", "abort", *outcomes)
        assert controller.wait(timeout=patience(60)) == 0
        lease = served.store / "rollout" / "lease.json"
        assert not lease.exists()
    finally:
        if controller.poll() is None:
            controller.kill()
            controller.wait()
        if controller.stderr is not None:
            controller.stderr.close()


@pytest.mark.runbook_fix("DispatchRolloutRolledBack")
def test_a_rolled_back_rollout_needs_nothing_on_the_fleet(
    served: Served, prometheus: Prometheus
) -> None:
    """Version 2 rolled out at 50 %, and the platform reports its orders delivered 20
    minutes past their promise (version 1's on time): the controller rolls it back on the
    `late` guardrail, DispatchRolloutRolledBack. **Do**: nothing on the fleet (every order is
    on version 1 already); no rollback since, so the condition over the time since is clear,
    and the alert's hour follows."""
    outcomes = ("--outcome-store", str(served.folder / "outcomes.sqlite3"))
    holder = ("--holder", "runbook-controller")
    judged = ("--min-outcomes", "20", "--min-seconds", "0", "--maturity-s", "0")
    served.dispatch_admin(
        "rollout", "start", "--version", str(CANARY), "--steps", "50,100", "--guardrails",
        "late", *judged, *outcomes, *holder,
    )  # fmt: skip
    outcome_key = (served.folder / "keys" / "outcome.key").read_text().strip()
    reports: dict[bool, list[OutcomeReport]] = {True: [], False: []}  # late (canary) or not
    with DispatchClient.grpc(served.grpc_url) as client:
        # Windows until each arm has 30 deliveries (40 orders a window, half canary users):
        # those before the replica routes by the rollout's revision (its next look at the
        # store, later on a loaded host) are all stable's, so the count is bounded by time.
        deadline = time.monotonic() + patience(60)
        seed = 0
        while min(len(arm) for arm in reports.values()) < 30 and time.monotonic() < deadline:
            seed += 1
            window = sim_window(1000 + seed, 40, 60)
            result = client.dispatch(window, request_id=f"rollout-window-{seed}")
            decided_at = float(window["WINDOW_FIELDS"][0])
            for fields, order in zip(window["ORDER_FIELDS"], result.orders, strict=True):
                if order.assigned_rider_id is None or order.fallback_level != 0:
                    continue
                late = order.model_version == CANARY
                promised_at = float(fields[CREATED_AT]) + float(fields[PROMISED]) * 60
                reports[late].append(
                    OutcomeReport.delivered(
                        f"rollout-window-{seed}",
                        order.order_id,
                        picked_up_at=decided_at + 60,
                        delivered_at=promised_at + 20 * 60 if late else decided_at + 120,
                        rider_id=order.assigned_rider_id,
                    )
                )
        sent = [*reports[True], *reports[False]]
        assert min(len(arm) for arm in reports.values()) >= 30, {
            k: len(v) for k, v in reports.items()
        }

        def stored() -> bool:  # the decisions are recorded off the request path
            receipt = client.report_outcomes(sent, url=served.health_url, key=outcome_key)
            return receipt.stored + receipt.duplicates == len(sent)

        wait_for(stored, "every outcome joined to its decision", 60, 1.0)

    said: list[str] = []

    def rolled_back() -> bool:
        said.append(served.dispatch_admin("rollout", "run", "--once", *outcomes, *holder))
        return bool(firing(prometheus, "DispatchRolloutRolledBack"))

    try:
        wait_for(rolled_back, "the controller rolls back: DispatchRolloutRolledBack", 60, 1.0)
    except AssertionError as exc:
        status = served.dispatch_admin("rollout", "status", *outcomes)
        raise AssertionError(f"{exc}\n{said[-1:]}\n{status[-3000:]}") from None
    # The replica follows the controller's rollback revision at its next look at the store.
    with DispatchClient.grpc(served.grpc_url) as client:

        def on_stable_only() -> bool:
            answer = client.dispatch(sim_window(400, 40, 60))
            return {order.model_version for order in answer.orders} == {STABLE}

        wait_for(on_stable_only, "every order on version 1 after the rollback", 30, 0.5)
    fixed = after_the_fix()
    for n in range(5):
        served.send(sim_window(n, 6, 20))
        time.sleep(0.5)
    clear_since_the_fix(
        prometheus,
        ("DispatchRolloutRolledBack",),
        fixed,
        'sum(rate(nv_inference_request_success{model="dispatch"}[{w}]))',
    )


@pytest.mark.runbook_fix("DispatchModelUnhealed", "DispatchNotReady")
def test_model_unhealed_clears_once_the_changed_signed_file_is_restored(
    served: Served, prometheus: Prometheus
) -> None:
    """DispatchModelUnhealed (and DispatchNotReady meanwhile): a stub died and its model's
    files changed since they were signed, so the reload is refused. **Do**: restore the
    changed signed files (`dispatch-admin verify` names them)."""
    wait_until_clear(prometheus, "DispatchModelUnhealed", "DispatchNotReady")
    model_py = model_layout(served.repository, ENCODER_MODEL).python_model(1)
    signed = model_py.read_bytes()  # the release's copy
    model_py.write_bytes(signed + b"\n# changed after signing\n")
    stubs = [
        pid
        for pid, (name, _) in stub_versions(served.tritonserver()).items()
        if name == ENCODER_MODEL
    ]
    os.kill(stubs[0], signal.SIGKILL)
    wait_for(
        lambda: (
            [s.get("model") for s in firing(prometheus, "DispatchModelUnhealed")] == [ENCODER_MODEL]
        ),
        "DispatchModelUnhealed's condition for feature_encoder",
        90,
        0.5,
    )
    assert firing(prometheus, "DispatchNotReady")
    # The runbook's check names the file ...
    out = io.StringIO()
    code = admin.main(
        ["verify", "--trusted-keys", str(served.trusted), str(served.repository)], out
    )
    assert code == 1
    named = [line for line in out.getvalue().splitlines() if ENCODER_MODEL in line]
    assert named and "model.py" in " ".join(named), out.getvalue()
    # ... and its fix: the signed file back. The launcher's next retry heals the model.
    model_py.write_bytes(signed)
    wait_until_clear(prometheus, "DispatchModelUnhealed", "DispatchNotReady")
    assert status(f"{served.health_url}/readyz") == 200


@pytest.mark.runbook_fix("DispatchTritonDown", "DispatchServerRestarts")
def test_triton_down_clears_on_the_launchers_restart(
    served: Served, prometheus: Prometheus
) -> None:
    """DispatchTritonDown: Triton crashed (here SIGKILL, as the OOM killer sends). **Do**:
    the launcher's restart (`--on-dead restart`, the images' policy) clears it. The restart
    raises DispatchServerRestarts, and the crash is counted with its signal; with no
    restart since, the condition over the time since is clear (the alert's 30 minutes
    follow)."""
    wait_until_clear(prometheus, "DispatchTritonDown", "DispatchNotReady")
    os.kill(served.tritonserver(), signal.SIGKILL)
    wait_for(
        lambda: firing(prometheus, "DispatchTritonDown"), "DispatchTritonDown's condition", 30, 0.25
    )
    wait_until_clear(prometheus, "DispatchTritonDown", "DispatchNotReady", within_s=240)
    assert status(f"{served.health_url}/readyz") == 200
    wait_until_raised(prometheus, "DispatchServerRestarts", within_s=30)
    assert prometheus.value('dispatch_launcher_server_crashes_total{signal="SIGKILL"}') >= 1
    fixed = after_the_fix()
    for n in range(5):
        served.send(sim_window(n, 6, 20))
        time.sleep(0.5)
    clear_since_the_fix(
        prometheus,
        ("DispatchServerRestarts",),
        fixed,
        'sum(rate(nv_inference_request_success{model="dispatch"}[{w}]))',
    )


@pytest.mark.runbook_fix("DispatchLauncherDown")
def test_launcher_down_clears_when_the_process_manager_restarts_it(
    served: Served, prometheus: Prometheus
) -> None:
    """DispatchLauncherDown: the launcher and its server are gone. **Do**: let the process
    manager restart it (here: the same command line again)."""
    wait_until_clear(prometheus, "DispatchLauncherDown")
    assert served.launcher.stop() == 0  # drained and stopped
    wait_for(
        lambda: firing(prometheus, "DispatchLauncherDown"),
        "DispatchLauncherDown's condition",
        30,
        0.25,
    )
    served.start()
    wait_until_clear(prometheus, "DispatchLauncherDown", "DispatchTritonDown", "DispatchNotReady")
