"""A live city: the simulator plays registered cities against a running server or fleet, as a
delivery platform would, and reports what became of every order.

    .venv/bin/python -m dispatch_service.offline.live_city --url 127.0.0.1:8001 \\
        --outcomes-url http://127.0.0.1:8003 --cities shanghai,chengdu --orders 2000 \\
        --scenario speeds-30:city=chengdu:from-minute=30

On a simulated clock (``--speed`` simulated seconds per wall second), every simulated minute
each city sends ``--windows-per-minute`` windows (drawn like the training windows, at that
minute) through `DispatchClient`; each answer becomes deliveries with the simulator's own
truth (`simulator.order_outcomes`: the world's speeds, barriers and noise, never the model's
predictions): an assigned order is picked up and delivered by its rider, an order left
unassigned is reassigned by the platform a minute later, a share of orders is cancelled.
Each outcome is reported (`dispatch_client.outcomes.report_outcomes`) a random delay after
it happened (exponential, mean ``--report-delay-minutes``), in batches, as the simulated
clock passes it; what is still pending when the run stops is reported at the end.

The clock runs days in the past (decision times are the windows' DISPATCH_TIME), so every
reported time lies before the server's clock however fast the run plays.

Scenarios change the world, never the server's city registry (``--scenario``, repeatable):

- ``speeds-N:city=C:from-minute=M``: from simulated minute M every vehicle in C is N %
  slower than the registry says (rain, roadworks);
- ``barrier:city=C:from-minute=M``: a railway the registry does not list cuts C east-west
  through its centre, crossable every 10 km (a stale map);
- ``riders-N:city=C:from-minute=M``: N % fewer riders per window (a supply shock: the
  inputs themselves shift).

It stops by itself at the first of ``--orders`` answered orders, ``--minutes`` simulated
minutes and ``--max-seconds`` of wall time. ``--record-metrics URL`` scrapes a metrics
endpoint once per simulated minute and ``--series-out FILE`` writes what it saw as
``promtool test rules`` input series (one step per simulated minute); ``--ledger FILE`` keeps
one JSON line per decision and its outcome (the oracle of the integration tests). The
summary (JSON on stdout) counts windows, orders and the outcome service's answers.
"""

from __future__ import annotations

import argparse
import dataclasses
import heapq
import json
import math
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import numpy as np

from dispatch_client.client import DispatchClient, DispatchResult, new_request_id
from dispatch_client.errors import DispatchError
from dispatch_client.outcomes import OutcomeReceipt, OutcomeReport, report_outcomes
from dispatch_service.domain.cities import Barrier, City, default_registry
from dispatch_service.domain.window import DispatchWindow, window_to_tensors
from dispatch_service.offline import simulator
from dispatch_service.offline.metric_series import SeriesRecorder
from dispatch_service.offline.simulator import CityConfig
from dispatch_service.offline.training.config import TrainConfig

__all__ = [
    "LiveCityConfig",
    "LiveCityRun",
    "Scenario",
    "main",
    "parse_scenario",
    "run_live_city",
    "simulated_start",
    "unlisted_barrier",
]

SCENARIO_KINDS: Final = ("speeds", "barrier", "riders")
# Simulated time starts at a local hour this many days (at least) before the wall clock.
_DAYS_BACK: Final = 2
_REASSIGN_AFTER_S: Final = 60.0  # the platform reassigns an order the service left unassigned
# An outcome refused as an unknown decision is sent again this much later, this many times:
# the server records decisions off the request path, so a fast report may come first.
_RETRY_AFTER_S: Final = 60.0
_RETRIES: Final = 3


@dataclass(frozen=True)
class Scenario:
    """A change of one city's world from a simulated minute on."""

    kind: str  # one of SCENARIO_KINDS
    city: str
    from_minute: int
    percent: float = 0.0  # speeds-N, riders-N

    def world(self, world: CityConfig) -> CityConfig:
        """``world`` as this scenario changes it (the server's registry keeps the old map)."""
        if self.kind == "speeds":
            slower = world.map.speeds_kmh * (1.0 - self.percent / 100.0)
            return dataclasses.replace(world, map=dataclasses.replace(world.map, speeds_kmh=slower))
        if self.kind == "barrier":
            barriers = (*world.map.barriers, unlisted_barrier(world.map))
            return dataclasses.replace(world, map=dataclasses.replace(world.map, barriers=barriers))
        return world

    def riders(self, count: int) -> int:
        return (
            max(1, round(count * (1.0 - self.percent / 100.0))) if self.kind == "riders" else count
        )


def unlisted_barrier(city: City) -> Barrier:
    """A railway east-west through the city's centre, 80 km long, crossable every 10 km."""
    crossings = np.array([[-35.0, 0.0], [-25.0, 0.0], [-15.0, 0.0], [-5.0, 0.0], [5.0, 0.0],
                          [15.0, 0.0], [25.0, 0.0], [35.0, 0.0]])  # fmt: skip
    return Barrier(
        id="unlisted_railway",
        kind="railway",
        course=np.array([[-40.0, 0.0], [40.0, 0.0]]),
        crossings=crossings,
    )


_SCENARIO: Final = re.compile(r"^(speeds|riders)-(\d+(?:\.\d+)?)$|^(barrier)$")


def parse_scenario(text: str, cities: Iterable[str]) -> Scenario:
    """``KIND:city=C:from-minute=M`` -> Scenario; ValueError naming the part that is wrong."""
    head, *parts = text.split(":")
    match = _SCENARIO.match(head)
    if match is None:
        raise ValueError(f"scenario {text!r}: kind must be speeds-N, riders-N or barrier")
    options: dict[str, str] = {}
    for part in parts:
        name, sep, value = part.partition("=")
        if not sep or name not in ("city", "from-minute"):
            raise ValueError(f"scenario {text!r}: {part!r} is not city=C or from-minute=M")
        options[name] = value
    if "city" not in options:
        raise ValueError(f"scenario {text!r}: city=C is required")
    if options["city"] not in set(cities):
        raise ValueError(f"scenario {text!r}: city {options['city']!r} is not played")
    try:
        minute = int(options.get("from-minute", "0"))
    except ValueError:
        raise ValueError(f"scenario {text!r}: from-minute must be an integer") from None
    if minute < 0:
        raise ValueError(f"scenario {text!r}: from-minute must be >= 0")
    kind = match.group(1) or match.group(3)
    percent = float(match.group(2)) if match.group(2) else 0.0
    if kind != "barrier" and not 0.0 < percent < 100.0:
        raise ValueError(f"scenario {text!r}: N must lie in (0, 100)")
    return Scenario(kind=kind, city=options["city"], from_minute=minute, percent=percent)


# ---- the run ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LiveCityConfig:
    cities: tuple[str, ...]
    windows_per_minute: int = 2  # per city
    speed: float = 60.0  # simulated seconds per wall second
    orders: int = 2000  # stop after this many answered orders
    minutes: int = 600  # ... or this many simulated minutes
    max_seconds: float = 600.0  # ... or this much wall time
    start_hour: float = 10.0  # local hour of the first simulated minute
    report_delay_minutes: float = 2.0  # mean delay of an outcome report after the fact
    cancel_share: float = 0.01
    seed: int = 1
    concurrency: int = 4
    scenarios: tuple[Scenario, ...] = ()
    orders_range: tuple[int, int] = TrainConfig.orders_range
    riders_range: tuple[int, int] = TrainConfig.riders_range

    def __post_init__(self) -> None:
        for name in ("windows_per_minute", "orders", "minutes", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1")
        for name in ("speed", "max_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name.replace('_', '-')} must be > 0")
        if not 0.0 <= self.cancel_share < 1.0:
            raise ValueError("cancel-share must lie in [0, 1)")
        if self.report_delay_minutes < 0:
            raise ValueError("report-delay-minutes must be >= 0")
        if not 0.0 <= self.start_hour < 24.0:
            raise ValueError("start-hour must lie in [0, 24)")


@dataclass
class LiveCityRun:
    """What a run did: counts for the summary."""

    windows_sent: int = 0
    windows_answered: int = 0
    window_errors: Counter[str] = field(default_factory=Counter)
    orders_answered: int = 0
    orders_assigned: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)  # by status
    reported: int = 0  # outcomes sent, each once (resent ones in `resent`)
    resent: int = 0
    stored: int = 0
    duplicates: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # by reason
    report_errors: Counter[str] = field(default_factory=Counter)
    per_city_orders: Counter[str] = field(default_factory=Counter)
    minutes: int = 0
    scrapes: int = 0
    wall_s: float = 0.0
    first_minute_epoch: int = 0

    def to_json_dict(self) -> dict[str, Any]:
        return {
            item.name: (dict(value) if isinstance(value, Counter) else value)
            for item in dataclasses.fields(self)
            for value in (getattr(self, item.name),)
        }


@dataclass(order=True)
class _Pending:
    due: float  # simulated unix time the platform reports it
    seq: int
    report: OutcomeReport = field(compare=False)
    city: str = field(compare=False)
    tries: int = field(default=0, compare=False)


def simulated_start(config: LiveCityConfig, now: float) -> int:
    """Unix time of the first simulated minute: ``start_hour`` in the first city's local
    time, whole days back so that the whole run and its deliveries (a day at most) lie
    before ``now``."""
    city = default_registry().get(config.cities[0])
    offset = city.utc_offset_s(int(now))
    span_s = config.minutes * 60.0 + 86_400.0
    days = _DAYS_BACK + math.ceil(span_s / 86_400.0)
    local_midnight = math.floor((now + offset) / 86_400.0) * 86_400 - offset
    return int(local_midnight - days * 86_400 + config.start_hour * 3600)


class _Play:
    """One run's state: the worlds, the clock, the pending outcomes."""

    def __init__(
        self,
        config: LiveCityConfig,
        client: DispatchClient,
        report: Callable[[list[OutcomeReport]], OutcomeReceipt],
        *,
        ledger: TextIO | None,
        recorder: SeriesRecorder | None,
        on_minute: Callable[[float], None] | None,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
    ) -> None:
        self.config = config
        self.client = client
        self.report = report
        self.ledger = ledger
        self.recorder = recorder
        self.on_minute = on_minute
        self.clock = clock
        self.sleep = sleep
        worlds = simulator.city_worlds()
        unknown = [city for city in config.cities if city not in worlds]
        if unknown:
            raise ValueError(f"cities: {', '.join(unknown)} not registered")
        self.worlds = {city: worlds[city] for city in config.cities}
        self.rng = np.random.default_rng([config.seed, 0])
        self.truth = np.random.default_rng([config.seed, 1])
        self.pending: list[_Pending] = []
        self.seq = 0
        self.run = LiveCityRun()

    def active(self, city: str, minute: int) -> list[Scenario]:
        return [s for s in self.config.scenarios if s.city == city and minute >= s.from_minute]

    def windows(self, minute: int, start: int) -> list[tuple[str, DispatchWindow, CityConfig]]:
        low, high = self.config.orders_range
        rider_low, rider_high = self.config.riders_range
        out = []
        for city in self.config.cities:
            world = self.worlds[city]
            active = self.active(city, minute)
            for scenario in active:
                world = scenario.world(world)
            for k in range(self.config.windows_per_minute):
                orders = int(self.rng.integers(low, high + 1))
                riders = int(self.rng.integers(rider_low, rider_high + 1))
                for scenario in active:
                    riders = scenario.riders(riders)
                at = start + minute * 60 + (k * 60) // self.config.windows_per_minute
                window = simulator.generate_window(self.rng, orders, riders, at, world)
                out.append((city, window, world))
        return out

    def send(self, window: DispatchWindow) -> tuple[str, DispatchResult | Exception]:
        request_id = new_request_id()
        try:
            return request_id, self.client.dispatch(
                window_to_tensors(window), request_id=request_id
            )
        except DispatchError as exc:
            return request_id, exc

    def realise(
        self, city: str, window: DispatchWindow, world: CityConfig, rid: str, result: DispatchResult
    ) -> None:
        """Turn one answer into outcomes with the world's truth, queued for reporting."""
        rider_row = {rider.decode(): row for row, rider in enumerate(window.rider_ids.tolist())}
        assigned = np.array(
            [
                -1 if order.assigned_rider_id is None else rider_row[order.assigned_rider_id]
                for order in result.orders
            ],
            dtype=np.int64,
        )
        truth = simulator.order_outcomes(window, assigned, self.truth, world)
        decided = float(window.dispatch_time)
        cancel = self.truth.random(window.num_orders) < self.config.cancel_share
        delays = self.truth.exponential(
            max(self.config.report_delay_minutes, 1e-9) * 60.0, window.num_orders
        )
        for row, order in enumerate(result.orders):
            record: OutcomeReport
            if cancel[row]:
                span = 60.0 if not truth.assigned[row] else truth.pickup_minutes_from_dispatch[row]
                at = decided + float(self.truth.uniform(0.0, 1.0)) * span * 60.0
                record = OutcomeReport.cancelled(rid, order.order_id, cancelled_at=at)
            elif truth.assigned[row]:
                at = decided + float(truth.minutes_from_dispatch[row]) * 60.0
                record = OutcomeReport.delivered(
                    rid,
                    order.order_id,
                    picked_up_at=decided + float(truth.pickup_minutes_from_dispatch[row]) * 60.0,
                    delivered_at=at,
                    rider_id=str(order.assigned_rider_id),
                )
            else:
                at = decided + _REASSIGN_AFTER_S
                record = OutcomeReport.reassigned(rid, order.order_id, reassigned_at=at)
            self.seq += 1
            heapq.heappush(self.pending, _Pending(at + float(delays[row]), self.seq, record, city))
            self.run.outcomes[str(record.status)] += 1
        self.run.orders_answered += len(result.orders)
        self.run.orders_assigned += int(truth.assigned.sum())
        self.run.per_city_orders[city] += len(result.orders)

    def flush(self, until: float) -> None:
        """Report every pending outcome due by simulated time ``until`` (inf: all)."""
        due: list[_Pending] = []
        while self.pending and self.pending[0].due <= until:
            due.append(heapq.heappop(self.pending))
        if not due:
            return
        records = [item.report for item in due]
        self.run.reported += sum(1 for item in due if item.tries == 0)
        self.run.resent += sum(1 for item in due if item.tries > 0)
        try:
            receipt = self.report(records)
        except DispatchError as exc:
            self.run.report_errors[type(exc).__name__] += len(records)
            self._write_ledger([(item, str(exc)) for item in due])
            return
        self.run.stored += receipt.stored
        self.run.duplicates += receipt.duplicates
        refused = {item.index: item.reason for item in receipt.refused}
        results: list[tuple[_Pending, str]] = []
        for index, item in enumerate(due):
            reason = refused.get(index)
            if reason == "unknown_decision" and item.tries < _RETRIES:
                again = _Pending(
                    item.due + _RETRY_AFTER_S, item.seq, item.report, item.city, item.tries + 1
                )
                heapq.heappush(self.pending, again)
                continue
            if reason is not None:
                self.run.refused[reason] += 1
            results.append((item, reason or "accepted"))
        self._write_ledger(results)

    def _write_ledger(self, results: list[tuple[_Pending, str]]) -> None:
        if self.ledger is None:
            return
        for item, result in results:
            entry = {**item.report.to_json_dict(), "city": item.city, "result": result}
            self.ledger.write(json.dumps(entry) + "\n")

    def play(self) -> LiveCityRun:
        config = self.config
        started = self.clock()
        start = simulated_start(config, time.time())
        self.run.first_minute_epoch = start
        with ThreadPoolExecutor(config.concurrency, thread_name_prefix="live-city") as pool:
            for minute in range(config.minutes):
                wall_due = started + minute * 60.0 / config.speed
                wait = wall_due - self.clock()
                if wait > 0:
                    self.sleep(wait)
                if self.clock() - started > config.max_seconds:
                    break
                batch = self.windows(minute, start)
                answers = list(pool.map(lambda item: self.send(item[1]), batch))
                for (city, window, world), (rid, answer) in zip(batch, answers, strict=True):
                    self.run.windows_sent += 1
                    if isinstance(answer, Exception):
                        self.run.window_errors[type(answer).__name__] += 1
                        continue
                    self.run.windows_answered += 1
                    self.realise(city, window, world, rid, answer)
                self.run.minutes = minute + 1
                self.flush(start + (minute + 1) * 60.0)
                if self.on_minute is not None:
                    self.on_minute(start + (minute + 1) * 60.0)
                if self.recorder is not None:
                    self.recorder.scrape()
                    self.run.scrapes = self.recorder.scrapes
                if self.run.orders_answered >= config.orders:
                    break
        while self.pending:  # the rest, now; a decision not yet recorded gets a second later
            self.flush(math.inf)
            if self.pending:
                self.sleep(1.0)
        self.run.wall_s = round(self.clock() - started, 3)
        return self.run


def run_live_city(
    config: LiveCityConfig,
    client: DispatchClient,
    *,
    outcomes_url: str,
    outcome_key: str | None = None,
    ledger: TextIO | None = None,
    recorder: SeriesRecorder | None = None,
    on_minute: Callable[[float], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> LiveCityRun:
    """Play ``config`` against the server behind ``client``, reporting outcomes to
    ``outcomes_url``; returns the counts. ``on_minute`` is told the simulated time at the
    end of each simulated minute, after its outcomes were reported and before the scrape."""

    def report(records: list[OutcomeReport]) -> OutcomeReceipt:
        return report_outcomes(records, url=outcomes_url, key=outcome_key)

    play = _Play(
        config,
        client,
        report,
        ledger=ledger,
        recorder=recorder,
        on_minute=on_minute,
        clock=clock,
        sleep=sleep,
    )
    return play.play()


def _parser() -> argparse.ArgumentParser:
    defaults = LiveCityConfig(cities=("shanghai",))
    parser = argparse.ArgumentParser(
        prog="python -m dispatch_service.offline.live_city",
        description="Play simulated cities against a running server and report the outcomes.",
    )
    parser.add_argument("--url", default="127.0.0.1:8001", help="the server's gRPC/HTTP address")
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument(
        "--model", default="dispatch_fused", help="the entry point (default dispatch_fused)"
    )
    parser.add_argument("--outcomes-url", default="http://127.0.0.1:8003")
    parser.add_argument(
        "--outcome-key-file",
        help="a file holding the outcome key (else DISPATCH_OUTCOME_KEY or "
        "DISPATCH_OUTCOME_KEY_FILE)",
    )
    parser.add_argument("--cities", default="shanghai", help="comma-separated registry ids")
    parser.add_argument("--windows-per-minute", type=int, default=defaults.windows_per_minute)
    parser.add_argument(
        "--speed", type=float, default=defaults.speed, help="simulated seconds per wall second"
    )
    parser.add_argument("--orders", type=int, default=defaults.orders)
    parser.add_argument("--minutes", type=int, default=defaults.minutes)
    parser.add_argument("--max-seconds", type=float, default=defaults.max_seconds)
    parser.add_argument("--start-hour", type=float, default=defaults.start_hour)
    parser.add_argument("--report-delay-minutes", type=float, default=defaults.report_delay_minutes)
    parser.add_argument("--cancel-share", type=float, default=defaults.cancel_share)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument(
        "--scenario",
        action="append",
        default=[],
        help="speeds-N|riders-N|barrier:city=C:from-minute=M (repeatable)",
    )
    parser.add_argument("--ledger", type=Path, help="one JSON line per reported outcome")
    parser.add_argument(
        "--record-metrics",
        action="append",
        default=[],
        help="a metrics URL scraped once per simulated minute (repeatable)",
    )
    parser.add_argument("--series-out", type=Path, help="promtool input series of the scrapes")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    cities = tuple(city for city in args.cities.split(",") if city)
    try:
        config = LiveCityConfig(
            cities=cities,
            windows_per_minute=args.windows_per_minute,
            speed=args.speed,
            orders=args.orders,
            minutes=args.minutes,
            max_seconds=args.max_seconds,
            start_hour=args.start_hour,
            report_delay_minutes=args.report_delay_minutes,
            cancel_share=args.cancel_share,
            seed=args.seed,
            concurrency=args.concurrency,
            scenarios=tuple(parse_scenario(text, cities) for text in args.scenario),
        )
        registered = set(default_registry().ids)
        unknown = [city for city in cities if city not in registered]
        if not cities or unknown:
            raise ValueError(f"cities: {', '.join(unknown) or 'none given'} not registered")
    except ValueError as exc:
        parser.error(str(exc))
    if args.series_out is not None and not args.record_metrics:
        parser.error("--series-out needs --record-metrics")
    key = Path(args.outcome_key_file).read_text().strip() if args.outcome_key_file else None
    recorder = SeriesRecorder(args.record_metrics) if args.record_metrics else None
    connect = DispatchClient.grpc if args.protocol == "grpc" else DispatchClient.http
    ledger = args.ledger.open("w") if args.ledger is not None else None
    try:
        with connect(args.url, model_name=args.model) as client:
            run = run_live_city(
                config, client, outcomes_url=args.outcomes_url, outcome_key=key,
                ledger=ledger, recorder=recorder,
            )  # fmt: skip
    finally:
        if ledger is not None:
            ledger.close()
    if recorder is not None and args.series_out is not None:
        args.series_out.write_text(json.dumps(recorder.input_series()))
    print(json.dumps(run.to_json_dict(), indent=1, sort_keys=True))
    return 0 if run.windows_answered else 1


if __name__ == "__main__":
    sys.exit(main())
