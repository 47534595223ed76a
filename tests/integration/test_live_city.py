"""The live city against a real server: tritonserver with the decision store, and the outcome
service (`POST /v1/outcomes`, the quality gauges) on its own loopback port.

- Counts, with the simulator as oracle: every answered order has exactly one decision
  record and every reported outcome is joined to it. ``LIVE_CITY_ORDERS`` sets the size
  (600 by default; ``make live-city-full`` runs 20,000).
- Alerts: with a city's world changed from minute 30 (speeds -30 %, an unlisted barrier, 70 %
  fewer riders), the series recorded over the run (Triton's and the outcome service's
  metrics, one scrape per simulated minute) go through `promtool test rules` with
  deploy/prometheus/alerts.yml: that city's alerts fire within `STATED_MINUTES` of the change
  and no alert of the quality group fires for any other city, or before the change.

The outcome service computes its figures over the outcomes received in the last hour of its
clock. The run plays `SPEED` simulated seconds per wall second, so the service here keeps
the simulated clock (`SimClock`: each run on a day of its own, so that one run's outcomes
never enter the next one's hour) and its housekeeping runs at the end of each simulated
minute, before the scrape (at real pace it runs every 30 s, twice a minute).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from dispatch_client.client import DispatchClient
from dispatch_service.offline.live_city import (
    LiveCityConfig,
    LiveCityRun,
    parse_scenario,
    run_live_city,
    simulated_start,
)
from dispatch_service.offline.metric_series import SeriesRecorder
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from dispatch_service.outcomes.records import DecisionId
from dispatch_service.outcomes.service import OutcomeService, serve_outcomes
from dispatch_service.outcomes.sql_store import open_store
from tests.unit.deploy.live_city_cases import promtool_case

from .patience import wait_for

SPEED = 60.0  # simulated seconds per wall second
KEY = "live-city-test-outcome-key-0123456789"
# The change comes once the outcome service's hour holds over 1,000 deliveries (the first
# outcomes to arrive are the quick deliveries).
CHANGE_MINUTE = 60
# A changed city's alerts fire within this many minutes of the change: an outcome comes back
# 20-90 minutes after its decision (the slow deliveries, which a slower world makes, last),
# the figures are over the outcomes received in the last hour, and the alerts wait 10
# (quality) or 15 (drift) minutes.
STATED_MINUTES = 105
PROMTOOL = shutil.which("promtool")


class SimClock:
    """The outcome service's clock: the live city's simulated time, a day later per run."""

    def __init__(self) -> None:
        self.now = 0.0
        self.days = 0

    def __call__(self) -> float:
        return self.now + self.days * 86_400.0

    def next_run(self) -> None:
        self.days += 1


@dataclass
class Stack:
    server: TritonServer
    service: OutcomeService
    clock: SimClock
    outcomes_url: str
    store: Path

    @property
    def metrics_urls(self) -> list[str]:
        """Triton's metrics and the outcome service's (its quality gauges)."""
        return [self.server.metrics_url, f"{self.outcomes_url}/metrics"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    folder = tmp_path_factory.mktemp("live_city")
    store = folder / "outcomes.sqlite3"
    clock = SimClock()
    service = OutcomeService(str(store), KEY, clock=clock)
    port = Ports.free().http
    loop = asyncio.new_event_loop()
    app = serve_outcomes(service)
    registry = CollectorRegistry()
    registry.register(service.collector())

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    app.router.add_get("/metrics", metrics)  # as the launcher's /metrics registers it
    runner = web.AppRunner(app)

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        loop.run_forever()

    thread = threading.Thread(target=serve, name="outcome-service", daemon=True)
    thread.start()
    server = TritonServer(
        TritonRuntime.from_venv(),
        ServerOptions(ports=Ports.free(), outcome_store=str(store)),
        folder / "server.log",
    )
    try:
        with server:
            yield Stack(server, service, clock, f"http://127.0.0.1:{port}", store)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
        service.close()


def _play(
    stack: Stack, config: LiveCityConfig, ledger: Path, recorder: SeriesRecorder | None = None
) -> LiveCityRun:
    stack.clock.next_run()
    stack.clock.now = simulated_start(config, time.time())

    def minute(simulated: float) -> None:
        stack.clock.now = simulated
        stack.service.housekeep()

    with (
        DispatchClient.grpc(stack.server.grpc_url, model_name="dispatch_fused") as client,
        ledger.open("w") as lines,
    ):
        return run_live_city(
            config,
            client,
            outcomes_url=stack.outcomes_url,
            outcome_key=KEY,
            ledger=lines,
            recorder=recorder,
            on_minute=minute,
        )


def test_every_answered_order_has_one_decision_and_every_outcome_is_joined(
    stack: Stack, tmp_path: Path
) -> None:
    orders = int(os.environ.get("LIVE_CITY_ORDERS", "600"))
    store = open_store(stack.store)
    try:
        before = store.counts()
        config = LiveCityConfig(
            cities=("shanghai", "beijing", "chengdu"),
            windows_per_minute=1,
            speed=SPEED,
            orders=orders,
            max_seconds=max(600.0, orders / 5.0),
            seed=46,
        )
        run = _play(stack, config, tmp_path / "ledger.jsonl")
        assert run.orders_answered >= orders, run.to_json_dict()
        assert run.windows_answered == run.windows_sent and not run.window_errors
        # The writer records decisions off the request path: they arrive shortly after.
        wait_for(
            lambda: store.counts().decisions == before.decisions + run.orders_answered,
            f"{run.orders_answered} decision records",
            60,
        )
        ledger = [json.loads(line) for line in (tmp_path / "ledger.jsonl").read_text().splitlines()]
        ids = [DecisionId(entry["request_id"], entry["order_id"]) for entry in ledger]
        # One outcome per answered order, each stored (none refused, none lost).
        assert len(set(ids)) == len(ids) == run.orders_answered
        assert {entry["result"] for entry in ledger} == {"accepted"}
        assert run.stored == run.reported == run.orders_answered and not run.refused
        after = store.counts()
        assert after.decisions - before.decisions == run.orders_answered
        assert after.outcomes - before.outcomes == run.orders_answered
        decisions = store.decisions(ids)
        assert set(decisions) == set(ids)
        # What the store joined is what the simulator realised, outcome by outcome.
        stored = store.outcomes(ids)
        assert set(stored) == set(ids)
        for entry, key in zip(ledger, ids, strict=True):
            outcome = stored[key]
            assert str(outcome.status) == entry["status"], key
            assert outcome.delivered_at == entry.get("delivered_at"), key
            assert outcome.picked_up_at == entry.get("picked_up_at"), key
            if entry["status"] == "delivered":
                assert outcome.rider_id == entry["rider_id"] == decisions[key].assigned_rider
        assert len(store.joined()) == after.outcomes  # every stored outcome has its decision
    finally:
        store.close()


SCENARIOS = {
    # scenario, the city it changes, the alerts that must fire there
    "speeds": ("speeds-30", "chengdu", "DispatchCalibrationDecay|DispatchEtaBias"),
    "barrier": ("barrier", "chengdu", "DispatchCalibrationDecay|DispatchEtaBias"),
    "riders": ("riders-70", "beijing", "DispatchFeatureDrift"),
}


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
@pytest.mark.skipif(
    not os.environ.get("LIVE_CITY_SCENARIOS"),
    reason="about 5 minutes a scenario: make live-city-alerts (LIVE_CITY_SCENARIOS=1)",
)
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_changed_city_fires_its_alerts_and_no_other_city_does(
    stack: Stack, tmp_path: Path, name: str
) -> None:
    scenario, city, expected = SCENARIOS[name]
    cities = ("shanghai", city)
    minutes = CHANGE_MINUTE + STATED_MINUTES + 5
    config = LiveCityConfig(
        cities=cities,
        windows_per_minute=1,
        speed=SPEED,
        orders=10**9,
        minutes=minutes,
        max_seconds=1200.0,
        seed=7,
        scenarios=(parse_scenario(f"{scenario}:city={city}:from-minute={CHANGE_MINUTE}", cities),),
    )
    recorder = SeriesRecorder(stack.metrics_urls)
    run = _play(stack, config, tmp_path / "ledger.jsonl", recorder)
    case = tmp_path / "live_city.test.yml"
    case.write_text(
        promtool_case(
            recorder.input_series(),
            city=city,
            expected=expected,
            change_minute=CHANGE_MINUTE,
            stated_minutes=STATED_MINUTES,
            end_minute=minutes - 1,
        )
    )
    keep = os.environ.get("LIVE_CITY_SERIES_DIR")
    if keep:  # the recorded quality series: tests/unit/deploy/data/live_city_<name>.json
        quality = [
            s for s in recorder.input_series() if s["series"].startswith("dispatch_quality_")
        ]
        (Path(keep) / f"live_city_{name}.json").write_text(json.dumps(quality, indent=0) + "\n")
    assert run.minutes == minutes and not run.window_errors and not run.refused
    done = subprocess.run(
        [str(PROMTOOL), "test", "rules", str(case)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
