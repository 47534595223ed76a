"""The city simulator: determinism, valid windows, and the effects it claims to model."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from dispatch_contract import OrderConstraint, Vehicle
from dispatch_service.domain.features import local_time
from dispatch_service.domain.window import DispatchWindow, window_from_tensors, window_to_tensors
from dispatch_service.offline import simulator as sim

CONFIG = sim.DEFAULT_CITY
# A weekday (Monday 2024-03-04) at given local hours, as unix seconds.
MONDAY = sim.MONDAY_MIDNIGHT_LOCAL


def at_local(hour: float, day: int = 0) -> int:
    return int(MONDAY + day * 86_400 + hour * 3600)


def latlon_of(east_km: float, north_km: float) -> list[float]:
    lat0, lon0 = 31.2304, 121.4737
    lat = lat0 + np.degrees(north_km / 6371.0088)
    lon = lon0 + np.degrees(east_km / (6371.0088 * np.cos(np.radians(lat0))))
    return [float(lat), float(lon)]


def make_window(
    pickup: list[list[float]],
    dropoff: list[list[float]],
    riders: list[list[float]],
    *,
    dispatch_time: int = at_local(14.0),
    age_s: int = 0,
    promised: float = 40.0,
    constraints: int = 0,
    load: list[int] | None = None,
    capacity: list[int] | None = None,
    vehicle: list[int] | None = None,
    equipment: list[int] | None = None,
) -> DispatchWindow:
    """A hand-made window; every order shares the scalar order attributes."""
    b, r = len(pickup), len(riders)

    def ids(prefix: str, n: int) -> Any:
        out = np.empty(n, dtype=object)
        out[:] = [f"{prefix}-{i}".encode() for i in range(n)]
        return out

    return DispatchWindow(
        order_ids=ids("o", b),
        order_user_ids=ids("u", b),
        pickup=np.asarray(pickup, dtype=np.float64),
        dropoff=np.asarray(dropoff, dtype=np.float64),
        created_at=np.full(b, dispatch_time - age_s, dtype=np.int64),
        promised_minutes=np.full(b, promised, dtype=np.float32),
        constraints=np.full(b, constraints, dtype=np.int32),
        rider_ids=ids("r", r),
        rider_position=np.asarray(riders, dtype=np.float64),
        rider_load=np.asarray(load or [0] * r, dtype=np.int32),
        rider_capacity=np.asarray(capacity or [3] * r, dtype=np.int32),
        rider_vehicle=np.asarray(vehicle or [Vehicle.EBIKE] * r, dtype=np.int32),
        rider_equipment=np.asarray(equipment or [1] * r, dtype=np.int32),
        dispatch_time=dispatch_time,
    )


def one_pair(**kwargs: Any) -> DispatchWindow:
    """Rider 1 km west of a pickup 2 km south of a drop-off, in the west-bank suburbs.

    The order is 15 minutes old unless told otherwise, so the food is ready.
    """
    kwargs.setdefault("age_s", 900)
    pickup = latlon_of(-12.0, 0.0)
    return make_window([pickup], [latlon_of(-12.0, 2.0)], [latlon_of(-13.0, 0.0)], **kwargs)


def eta_of(window: DispatchWindow, **kwargs: Any) -> float:
    eta, _, _ = sim.expected_outcome(window, [0], [0], **kwargs)
    return float(eta[0])


# ------------------------------------------------------------------------------ windows


def test_same_seed_same_window_and_different_seed_different_window() -> None:
    a = sim.generate_window(np.random.default_rng(5), 20, 50)
    b = sim.generate_window(np.random.default_rng(5), 20, 50)
    c = sim.generate_window(np.random.default_rng(6), 20, 50)
    for name in DispatchWindow.__dataclass_fields__:
        assert np.array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name))), name
    assert not np.array_equal(a.pickup, c.pickup)


def test_generated_window_passes_the_request_gate() -> None:
    window = sim.generate_window(np.random.default_rng(1), 64, 300)
    parsed = window_from_tensors(window_to_tensors(window))
    assert parsed.num_orders == 64 and parsed.num_riders == 300
    np.testing.assert_array_equal(parsed.pickup, window.pickup)
    np.testing.assert_array_equal(parsed.rider_capacity, window.rider_capacity)


def test_window_fields_are_realistic() -> None:
    rng = np.random.default_rng(2)
    windows = [sim.generate_window(rng, 200, 300) for _ in range(10)]
    pickup = np.concatenate([w.pickup for w in windows])
    dropoff = np.concatenate([w.dropoff for w in windows])
    riders = np.concatenate([w.rider_position for w in windows])
    for points in (pickup, dropoff, riders):
        assert points[:, 0].min() >= 30.95 and points[:, 0].max() <= 31.45
        assert points[:, 1].min() >= 121.15 and points[:, 1].max() <= 121.80
    for w in windows:
        age = w.dispatch_time - w.created_at
        assert age.min() >= 0 and age.max() <= CONFIG.max_order_age_s
        low, high = CONFIG.promise_range_minutes
        assert w.promised_minutes.min() >= low and w.promised_minutes.max() <= high
        assert (w.rider_load >= 0).all() and (w.rider_load <= w.rider_capacity).all()
        assert w.rider_capacity.min() >= 1 and w.rider_capacity.max() <= 4
        assert len(set(w.order_ids.tolist())) == w.num_orders
        assert all(i.startswith(b"o-") for i in w.order_ids.tolist())
        assert all(i.startswith(b"r-") for i in w.rider_ids.tolist())
        assert all(i.startswith(b"u-") for i in w.order_user_ids.tolist())
    bits = np.concatenate([w.constraints for w in windows])
    for flag, rate in (
        (OrderConstraint.THERMAL_BOX, CONFIG.thermal_rate),
        (OrderConstraint.LARGE_ITEM, CONFIG.large_rate),
        (OrderConstraint.FRAGILE, CONFIG.fragile_rate),
        (OrderConstraint.PRIORITY, CONFIG.priority_rate),
    ):
        assert abs(np.mean((bits & flag) != 0) - rate) < 0.03
    promised = np.concatenate([w.promised_minutes for w in windows])
    priority = (bits & OrderConstraint.PRIORITY) != 0
    assert promised[priority].mean() < promised[~priority].mean()
    vehicle = np.concatenate([w.rider_vehicle for w in windows])
    capacity = np.concatenate([w.rider_capacity for w in windows])
    assert capacity[vehicle == Vehicle.CAR].mean() > capacity[vehicle == Vehicle.EBIKE].mean()
    box = np.concatenate([w.rider_equipment for w in windows]) & 1
    assert abs(box.mean() - CONFIG.thermal_box_rate) < 0.05
    # Drop-offs lie within a few km of their pickups.
    trip = np.hypot(*(sim.to_plane(dropoff) - sim.to_plane(pickup)).T)
    assert np.median(trip) < 5.0 and trip.max() <= CONFIG.dropoff_max_km + 0.01


def test_dispatch_times_cover_many_hours_and_days() -> None:
    rng = np.random.default_rng(3)
    times = [sim.generate_window(rng, 1, 1).dispatch_time for _ in range(200)]
    hours = {int(local_time(t, CONFIG.map)[0]) for t in times}
    days = {(t - MONDAY) // 86_400 for t in times}
    assert len(hours) >= 18
    assert len(days) >= 10 and min(days) >= 0 and max(days) < 7 * CONFIG.weeks
    weekend = [local_time(t, CONFIG.map)[1] for t in times]
    assert any(weekend) and not all(weekend)


def test_explicit_dispatch_time_is_kept() -> None:
    window = sim.generate_window(np.random.default_rng(4), 3, 3, dispatch_time=at_local(9.0))
    assert window.dispatch_time == at_local(9.0)
    assert local_time(window.dispatch_time, CONFIG.map)[0] == pytest.approx(9.0)


# ---------------------------------------------------------------------------- geography


def river_east_km(north: float) -> float:
    """Where the Huangpu runs at ``north`` km, from the registry's course."""
    course = CONFIG.map.barriers[0].course
    return float(np.interp(north, course[:, 1], course[:, 0]))


def test_river_crossing_detours_through_a_crossing() -> None:
    north = 10.0  # between the crossings at 6 and 14 km north
    river = river_east_km(north)
    west = np.asarray([[river - 1.0, north]])
    east = np.asarray([[river + 1.0, north]])
    further_west = np.asarray([[river - 3.0, north]])
    vehicle = np.asarray([Vehicle.CAR])
    across = sim.travel_leg(west, east, vehicle, 0, hour=14.0, weekend=False)
    same_bank = sim.travel_leg(west, further_west, vehicle, 0, hour=14.0, weekend=False)
    assert across.crossings[0] == 1 and same_bank.crossings[0] == 0
    assert across.road_km[0] > 3.0 * same_bank.road_km[0]  # via the 6 km crossing
    assert across.minutes[0] > 2.0 * same_bank.minutes[0]


def test_crossing_trip_takes_longer_than_a_same_bank_trip_of_equal_length() -> None:
    north = 10.0
    river = river_east_km(north)
    pickup = latlon_of(river - 0.5, north)
    window = make_window(
        [pickup, pickup],
        [latlon_of(river + 1.5, north), latlon_of(river - 2.5, north)],
        [latlon_of(river - 1.0, north)],
    )
    eta, ontime, cost = sim.expected_outcome(window, [0, 1], [0, 0])
    assert eta[0] > eta[1] + 10.0
    assert ontime[0] < ontime[1]
    assert cost[0] > cost[1]


def test_every_registered_city_has_a_world_inside_its_area() -> None:
    worlds = sim.city_worlds()
    assert set(worlds) == {"shanghai", "beijing", "shenzhen", "chengdu"}
    for name, world in worlds.items():
        corners = np.array(
            [[lat, lon] for lat in world.lat_range for lon in world.lon_range], dtype=np.float64
        )
        assert world.map.contains(corners).all(), name
        assert world.map.contains(np.asarray([s[:2] for s in world.hot_spots])).all(), name


def test_a_regime_changes_the_world_it_is_given() -> None:
    beijing = sim.city_worlds()["beijing"]
    long = sim.REGIMES["long_distance"].world(beijing)
    assert long.map is beijing.map and long.dropoff_max_km == 15.0
    assert sim.REGIMES["default"].world(beijing) is beijing


# --------------------------------------------------------------------------------- effects


def test_rush_hour_is_slower_than_night_and_cars_suffer_more() -> None:
    def ratio(vehicle: Vehicle) -> float:
        rush = eta_of(one_pair(dispatch_time=at_local(8.5), vehicle=[vehicle]))
        night = eta_of(one_pair(dispatch_time=at_local(3.0), vehicle=[vehicle]))
        assert rush > night
        return rush / night

    assert ratio(Vehicle.CAR) > ratio(Vehicle.MOTORBIKE) > ratio(Vehicle.EBIKE)
    assert sim.hour_level(18.5, False) > sim.hour_level(13.0, False) > sim.hour_level(3.0, False)
    assert sim.hour_level(8.5, True) < sim.hour_level(8.5, False)  # milder weekend rush


def test_congestion_is_heavier_in_the_centre() -> None:
    centre = sim.congestion(np.asarray([[0.0, 0.0]]), 18.5, False)
    suburb = sim.congestion(np.asarray([[-25.0, -20.0]]), 18.5, False)
    assert centre[0] > suburb[0] > 1.0


def test_car_is_faster_than_ebike_at_night() -> None:
    car = eta_of(one_pair(dispatch_time=at_local(3.0), vehicle=[Vehicle.CAR]))
    ebike = eta_of(one_pair(dispatch_time=at_local(3.0), vehicle=[Vehicle.EBIKE]))
    assert car < ebike


def test_each_carried_order_slows_the_rider() -> None:
    etas = [eta_of(one_pair(load=[n], capacity=[4])) for n in range(4)]
    assert all(b - a >= CONFIG.load_stop_minutes for a, b in itertools.pairwise(etas))
    assert eta_of(one_pair(load=[1], capacity=[4]), extra_load=[1]) == pytest.approx(etas[2])


def test_constraint_effects() -> None:
    plain = eta_of(one_pair())
    assert eta_of(one_pair(constraints=int(OrderConstraint.FRAGILE))) > plain + 2.0
    # Hard constraints: broken ones cost a hand-over, kept ones do not.
    no_box = eta_of(one_pair(constraints=int(OrderConstraint.THERMAL_BOX), equipment=[0]))
    with_box = eta_of(one_pair(constraints=int(OrderConstraint.THERMAL_BOX), equipment=[1]))
    assert no_box >= with_box + CONFIG.violation_minutes - 1e-9
    large = int(OrderConstraint.LARGE_ITEM)
    on_bike = eta_of(one_pair(constraints=large, vehicle=[Vehicle.EBIKE]))
    in_car = eta_of(one_pair(constraints=large, vehicle=[Vehicle.CAR]))
    assert on_bike > in_car + CONFIG.violation_minutes - 5.0
    full = eta_of(one_pair(load=[2], capacity=[2]))
    assert full > eta_of(one_pair(load=[2], capacity=[3])) + CONFIG.violation_minutes - 1e-9


def test_early_rider_waits_for_the_kitchen() -> None:
    fresh = eta_of(one_pair(age_s=0))  # the kitchen needs the full preparation time
    old = eta_of(one_pair(age_s=int(CONFIG.prep_minutes * 60)))  # food is ready
    assert fresh > old
    assert fresh >= CONFIG.prep_minutes  # never delivered before the food exists


def test_expected_outcome_matches_the_noisy_samples() -> None:
    window = sim.generate_window(np.random.default_rng(8), 6, 12, dispatch_time=at_local(12.0))
    orders = np.repeat(np.arange(6), 12)
    riders = np.tile(np.arange(12), 6)
    eta, ontime, cost = sim.expected_outcome(window, orders, riders)
    draws = 4000
    minutes, on_time, realised_cost = sim.sample_outcome(
        window, np.repeat(orders, draws), np.repeat(riders, draws), np.random.default_rng(9)
    )
    np.testing.assert_allclose(minutes.reshape(-1, draws).mean(axis=1), eta, rtol=0.02)
    np.testing.assert_allclose(on_time.reshape(-1, draws).mean(axis=1), ontime, atol=0.035)
    np.testing.assert_allclose(realised_cost.reshape(-1, draws).mean(axis=1), cost, rtol=0.02)
    assert ((ontime >= 0.0) & (ontime <= 1.0)).all()
    assert (cost > 0).all()


def test_sample_outcome_is_seeded() -> None:
    window = sim.generate_window(np.random.default_rng(10), 4, 8)
    a = sim.sample_outcome(window, [0, 1, 2], [0, 1, 2], np.random.default_rng(1))
    b = sim.sample_outcome(window, [0, 1, 2], [0, 1, 2], np.random.default_rng(1))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


# ------------------------------------------------------------------------------ evaluation


def test_sequential_extra_load_follows_creation_order() -> None:
    window = make_window(
        [latlon_of(0, 0)] * 4, [latlon_of(0, 1)] * 4, [latlon_of(0, 0)] * 2, capacity=[4, 4]
    )
    window = DispatchWindow(
        **{
            **{n: getattr(window, n) for n in DispatchWindow.__dataclass_fields__},
            "created_at": window.created_at - np.asarray([0, 60, 0, 120]),
        }
    )
    extra = sim.sequential_extra_load(window, np.asarray([0, 0, -1, 0]))
    # Rider 0 carries orders 3 (oldest), 1, 0 in that sequence.
    np.testing.assert_array_equal(extra, [2, 1, 0, 0])


def test_evaluate_assignment_counts_unassigned_orders_as_late() -> None:
    window = sim.generate_window(np.random.default_rng(11), 10, 40, dispatch_time=at_local(3.0))
    nobody = sim.evaluate_assignment(window, np.full(10, -1), np.random.default_rng(0))
    assert nobody["ontime_rate"] == 0.0 and nobody["assigned_share"] == 0.0
    assert np.isnan(nobody["mean_delivery_minutes"])
    some = np.full(10, -1)
    some[:5] = np.arange(5)
    half = sim.evaluate_assignment(window, some, np.random.default_rng(0))
    assert half["assigned_share"] == 0.5 and half["ontime_rate"] <= 0.5
    age = (window.dispatch_time - window.created_at[:5]) / 60.0
    assert half["mean_delivery_minutes"] > float(np.mean(age))


def test_evaluate_assignment_shares_noise_per_order() -> None:
    window = sim.generate_window(np.random.default_rng(12), 8, 40)
    assigned = np.arange(8)
    a = sim.evaluate_assignment(window, assigned, np.random.default_rng(3))
    b = sim.evaluate_assignment(window, assigned, np.random.default_rng(3))
    assert a == b
    with pytest.raises(ValueError, match="one rider index per order"):
        sim.evaluate_assignment(window, assigned[:3], np.random.default_rng(3))
    with pytest.raises(ValueError, match="within the window"):
        sim.evaluate_assignment(window, np.full(8, 40), np.random.default_rng(3))


def test_regimes_keep_their_shape() -> None:
    """Each regime draws what it says: hours, sizes, and spare capacity close to the orders."""
    for name, regime in sim.REGIMES.items():
        window = sim.generate_regime_window(np.random.default_rng(3), regime)
        assert window.num_orders == regime.num_orders, name
        spare = int(np.maximum(window.rider_capacity - window.rider_load, 0).sum())
        if regime.scarce:
            # Riders are kept until their spare capacity first reaches the orders, so the
            # total overshoots by less than one rider's largest spare (4).
            assert window.num_orders <= spare < window.num_orders + 4, name
        else:
            assert window.num_riders == regime.num_riders, name
        if regime.hours is not None:
            hour, weekend = local_time(window.dispatch_time, CONFIG.map)
            assert regime.hours[0] <= hour <= regime.hours[1], name
            assert not weekend, name


def test_pickup_comes_before_delivery_in_the_simulated_truth() -> None:
    rng = np.random.default_rng(5)
    world = sim.city_worlds()["shanghai"]
    window = sim.generate_window(rng, 20, 60, config=world)
    assigned = np.array([i % 7 if i % 5 else -1 for i in range(20)])
    truth = sim.order_outcomes(window, assigned, rng, world)
    rows = truth.assigned
    assert (truth.pickup_minutes_from_dispatch[rows] > 0).all()
    assert (truth.pickup_minutes_from_dispatch[rows] < truth.minutes_from_dispatch[rows]).all()
    assert np.isnan(truth.pickup_minutes_from_dispatch[~rows]).all()


def _new_city() -> Any:
    """A city the simulator has no knobs for: an L-shaped area (about 50 x 50 km less a
    quarter) near Guilin, a river north to south through it crossed at two bridges."""
    from dispatch_service.domain.cities import registry_from_dict
    from dispatch_service.domain.registry_file import BarrierEntry, CityEntry, registry_document

    ring = [(25.05, 110.05), (25.05, 110.55), (25.30, 110.55), (25.30, 110.30), (25.50, 110.30),
            (25.50, 110.05), (25.05, 110.05)]  # fmt: skip
    entry = CityEntry(
        id="guilin",
        name="Guilin",
        aliases=(),
        timezone="Asia/Shanghai",
        centre=(25.20, 110.25),
        area=np.array(ring),
        speeds_kmh={"ebike": 14.0, "motorbike": 21.0, "car": 26.0},
        road_circuity=1.8,
        barriers=(
            BarrierEntry(
                id="li_river",
                kind="river",
                course=np.array([[25.00, 110.20], [25.55, 110.20]]),
                crossings=np.array([[25.15, 110.20], [25.40, 110.20]]),
            ),
        ),
    )
    return registry_from_dict(registry_document([entry]))


def test_a_city_known_by_its_entry_alone_gets_a_world_drawn_from_its_shape() -> None:
    from dispatch_service.domain import roads

    registry = _new_city()
    city = registry.get("guilin")
    world = sim.city_world(city)
    assert world.map is city
    corners = np.array([[lat, lon] for lat in world.lat_range for lon in world.lon_range])
    assert city.contains(corners).all()
    spots = np.asarray([s[:2] for s in world.hot_spots])
    # ~1,900 km² of area: one centre per 120 km², at most 10; all inside, none twice
    assert len(spots) == 10 and city.contains(spots).all()
    assert len({tuple(np.round(spot, 4)) for spot in spots}) == 10
    assert world.hot_spots[0] == (25.20, 110.25, 1.5)
    # demand on both banks: some centres are across the river from the city centre
    centre = np.zeros((len(spots), 2))
    crossed = roads.leg_roads(city, centre, city.plane(spots)).crossings
    assert 0 < int(crossed.sum()) < len(spots)
    # sizes scaled to the city (equivalent radius about 25 km), not Shanghai's
    assert world.order_spot_spread_km == 2.0 and world.rider_spot_spread_km == 4.0
    assert 9.0 < world.zone_centre_sigma_km < 11.0
    # promises for its roads: Shanghai's 3.2 min a straight km x (1.8 / 21) / (1.3 / 24)
    assert world.promise_per_km == pytest.approx(5.0637, abs=1e-4)


@pytest.mark.parametrize("regime", sorted(sim.REGIMES))
def test_every_window_of_a_new_citys_world_lies_in_that_city(regime: str) -> None:
    registry = _new_city()
    world = sim.city_world(registry.get("guilin"))
    rng = np.random.default_rng(7)
    for _ in range(6):
        window = sim.generate_regime_window(rng, sim.REGIMES[regime], world)
        assert registry.locate(window).id == "guilin"
