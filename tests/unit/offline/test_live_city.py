"""The live city's parts that need no server: scenarios, the clock, the recorded series.
The run itself against a real server: tests/integration/test_live_city.py."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from dispatch_service.domain import roads
from dispatch_service.offline import live_city, simulator
from dispatch_service.offline.live_city import LiveCityConfig, Scenario, parse_scenario
from dispatch_service.offline.metric_series import SeriesRecorder

CITIES = ("shanghai", "chengdu")


def test_a_scenario_is_parsed_with_its_city_and_minute() -> None:
    assert parse_scenario("speeds-30:city=chengdu:from-minute=45", CITIES) == Scenario(
        "speeds", "chengdu", 45, 30.0
    )
    assert parse_scenario("barrier:city=shanghai", CITIES) == Scenario("barrier", "shanghai", 0)
    assert parse_scenario("riders-50:from-minute=3:city=chengdu", CITIES).percent == 50.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rain:city=chengdu", "kind must be speeds-N, riders-N or barrier"),
        ("speeds-30", "city=C is required"),
        ("speeds-30:city=beijing", "city 'beijing' is not played"),
        ("speeds-30:city=chengdu:from-minute=x", "from-minute must be an integer"),
        ("speeds-30:city=chengdu:from-minute=-1", "from-minute must be >= 0"),
        ("speeds-130:city=chengdu", r"N must lie in \(0, 100\)"),
        ("speeds-30:town=chengdu", "'town=chengdu' is not city=C or from-minute=M"),
    ],
)
def test_a_bad_scenario_is_refused_naming_the_part(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_scenario(text, CITIES)


def test_speeds_minus_30_makes_travel_take_1_over_0_7_as_long() -> None:
    world = simulator.city_worlds()["chengdu"]
    slower = Scenario("speeds", "chengdu", 0, 30.0).world(world)
    start, end = np.array([[0.0, 0.0]]), np.array([[3.0, 1.0]])
    vehicle = np.array([0])
    base = simulator.travel_leg(start, end, vehicle, [0], hour=3.0, weekend=False, config=world)
    slow = simulator.travel_leg(start, end, vehicle, [0], hour=3.0, weekend=False, config=slower)
    assert slow.minutes[0] == pytest.approx(base.minutes[0] / 0.7)
    assert world.map.speeds_kmh.tolist() != slower.map.speeds_kmh.tolist()  # the world only


def test_the_unlisted_barrier_sends_a_leg_through_the_crossing_at_5_km() -> None:
    world = simulator.city_worlds()["chengdu"]
    cut = Scenario("barrier", "chengdu", 0).world(world)
    start, end = np.array([[0.5, -1.0]]), np.array([[0.5, 1.0]])
    before = roads.leg_roads(world.map, start, end).road_km(world.map)[0]
    after = roads.leg_roads(cut.map, start, end).road_km(cut.map)[0]
    # Best crossing (5, 0): 2 * sqrt(4.5^2 + 1) km instead of 2 km, times the circuity.
    detour = (2.0 * math.sqrt(4.5**2 + 1.0) - 2.0) * world.map.road_circuity
    assert after - before == pytest.approx(detour)
    assert len(cut.map.barriers) == len(world.map.barriers) + 1


def test_fewer_riders_from_the_scenario() -> None:
    assert Scenario("riders", "chengdu", 0, 50.0).riders(201) == 100
    assert Scenario("speeds", "chengdu", 0, 50.0).riders(201) == 201


def test_the_simulated_clock_runs_days_before_the_wall_clock_at_the_start_hour() -> None:
    now = 1_765_000_000.0
    config = LiveCityConfig(cities=("shanghai",), minutes=600, start_hour=10.0)
    start = live_city.simulated_start(config, now)
    assert (start + 8 * 3600) % 86_400 == 10 * 3600  # 10:00 in UTC+8
    # The last window and a day of deliveries after it still lie before the wall clock.
    assert start + 600 * 60 + 86_400 < now


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"orders": 0}, "orders must be >= 1"),
        ({"speed": 0.0}, "speed must be > 0"),
        ({"cancel_share": 1.0}, r"cancel-share must lie in \[0, 1\)"),
        ({"start_hour": 24.0}, r"start-hour must lie in \[0, 24\)"),
    ],
)
def test_bad_run_settings_are_refused_by_name(changes: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LiveCityConfig(cities=("shanghai",), **changes)  # type: ignore[arg-type]


@pytest.fixture
def exposition() -> Iterator[list[str]]:
    """A metrics endpoint on 127.0.0.1 answering the texts queued in the list, in turn."""
    texts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = texts.pop(0).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    texts.append(f"http://127.0.0.1:{server.server_address[1]}/metrics")
    try:
        yield texts
    finally:
        server.shutdown()
        server.server_close()


def test_recorded_series_are_promtool_input_with_gaps(exposition: list[str]) -> None:
    url = exposition.pop(0)
    exposition += [
        "# TYPE dispatch_drift_bin_pairs_total counter\n"
        'dispatch_drift_bin_pairs_total{city="chengdu",bin="0"} 3\n'
        "other_metric 1\n",
        "# TYPE dispatch_drift_bin_pairs_total counter\n"
        'dispatch_drift_bin_pairs_total{city="chengdu",bin="0"} 5\n'
        'dispatch_drift_bin_pairs_total{city="chengdu",bin="1"} 2\n',
    ]
    recorder = SeriesRecorder([url])
    recorder.scrape()
    recorder.scrape()
    assert recorder.input_series() == [
        {"series": 'dispatch_drift_bin_pairs_total{bin="0",city="chengdu"}', "values": "3.0 5.0"},
        {"series": 'dispatch_drift_bin_pairs_total{bin="1",city="chengdu"}', "values": "_ 2.0"},
    ]
