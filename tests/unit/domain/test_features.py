"""Behaviour of dispatch_service.domain.features: candidate selection and the pair features."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import (
    MAX_CANDIDATES,
    NUM_PAIR_FEATURES,
    PAIR_FEATURE_NAMES,
    OrderConstraint,
    Vehicle,
)
from dispatch_service.domain import features, geo
from dispatch_service.domain.cities import DEFAULT_REGISTRY, default_registry, registry_from_dict
from dispatch_service.domain.features import EncodedWindow, EncoderSettings
from dispatch_service.domain.resolver import resolve
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.offline.baseline import distance_matching_assignment
from dispatch_service.offline.simulator import REGIMES, generate_regime_window

THERMAL = int(OrderConstraint.THERMAL_BOX)
LARGE = int(OrderConstraint.LARGE_ITEM)
FRAGILE = int(OrderConstraint.FRAGILE)
PRIORITY = int(OrderConstraint.PRIORITY)
COLUMN = {name: j for j, name in enumerate(PAIR_FEATURE_NAMES)}
SHANGHAI_TZ = timezone(timedelta(hours=8))
# Saturday 2024-06-01 12:00 in Shanghai.
SATURDAY_NOON = int(datetime(2024, 6, 1, 12, 0, tzinfo=SHANGHAI_TZ).timestamp())
SHANGHAI = default_registry().get("shanghai")


def make_window(
    *,
    pickup: ArrayLike,
    rider_position: ArrayLike,
    dropoff: ArrayLike | None = None,
    created_at: ArrayLike | None = None,
    promised_minutes: ArrayLike | None = None,
    constraints: ArrayLike | None = None,
    rider_load: ArrayLike | None = None,
    rider_capacity: ArrayLike | None = None,
    rider_vehicle: ArrayLike | None = None,
    rider_equipment: ArrayLike | None = None,
    dispatch_time: int = SATURDAY_NOON,
) -> DispatchWindow:
    """A DispatchWindow with permissive defaults for whatever the test leaves out."""
    pick = np.asarray(pickup, dtype=np.float64).reshape(-1, 2)
    riders = np.asarray(rider_position, dtype=np.float64).reshape(-1, 2)
    b, r = pick.shape[0], riders.shape[0]

    def col(value: ArrayLike | None, default: Any, n: int, dtype: type[np.generic]) -> Any:
        if value is None:
            return np.full(n, default, dtype=dtype)
        return np.asarray(value, dtype=dtype).reshape(n)

    return DispatchWindow(
        order_ids=np.array([f"order-{i}".encode() for i in range(b)], dtype=object),
        order_user_ids=np.array([b"user"] * b, dtype=object),
        pickup=pick,
        dropoff=pick + 0.01 if dropoff is None else np.asarray(dropoff, np.float64).reshape(-1, 2),
        created_at=col(created_at, dispatch_time - 300, b, np.int64),
        promised_minutes=col(promised_minutes, 30.0, b, np.float32),
        constraints=col(constraints, 0, b, np.int32),
        rider_ids=np.array([f"rider-{i}".encode() for i in range(r)], dtype=object),
        rider_position=riders,
        rider_load=col(rider_load, 0, r, np.int32),
        rider_capacity=col(rider_capacity, 3, r, np.int32),
        rider_vehicle=col(rider_vehicle, int(Vehicle.CAR), r, np.int32),
        rider_equipment=col(rider_equipment, 1, r, np.int32),
        dispatch_time=dispatch_time,
    )


def random_window(
    rng: np.random.Generator, num_orders: int, num_riders: int, spots: int | None = None
) -> DispatchWindow:
    """Random city window; with ``spots`` riders share few positions, forcing exact ties."""
    centre = np.array(SHANGHAI.centre)
    pickup = centre + rng.normal(0.0, 0.05, (num_orders, 2))
    if spots is None:
        riders = centre + rng.normal(0.0, 0.05, (num_riders, 2))
    else:
        pool = centre + rng.normal(0.0, 0.05, (spots, 2))
        riders = pool[rng.integers(0, spots, num_riders)]
        pickup[: num_orders // 2] = pool[rng.integers(0, spots, num_orders // 2)]
    capacity = rng.integers(0, 4, num_riders)
    return make_window(
        pickup=pickup,
        dropoff=centre + rng.normal(0.0, 0.05, (num_orders, 2)),
        rider_position=riders,
        created_at=SATURDAY_NOON - rng.integers(-200, 3600, num_orders),
        promised_minutes=rng.uniform(10.0, 90.0, num_orders),
        constraints=rng.integers(0, 16, num_orders),
        rider_load=np.minimum(rng.integers(0, 4, num_riders), capacity),
        rider_capacity=capacity,
        rider_vehicle=rng.integers(0, 3, num_riders),
        rider_equipment=rng.integers(0, 2, num_riders),
    )


def brute_force_candidates(window: DispatchWindow, n: int) -> NDArray[np.int32]:
    """The definition, one order and one rider at a time: nearest first, ties by rider id."""
    n_eff = min(n, window.num_riders)
    out = np.full((window.num_orders, n_eff), -1, dtype=np.int32)
    for b in range(window.num_orders):
        bits = int(window.constraints[b])
        eligible: list[tuple[float, bytes, int]] = []
        for r in range(window.num_riders):
            if window.rider_capacity[r] - window.rider_load[r] <= 0:
                continue
            if bits & THERMAL and not window.rider_equipment[r] & 1:
                continue
            if bits & LARGE and window.rider_vehicle[r] != Vehicle.CAR:
                continue
            distance = float(
                geo.haversine_km(
                    window.rider_position[r, 0],
                    window.rider_position[r, 1],
                    window.pickup[b, 0],
                    window.pickup[b, 1],
                )
            )
            eligible.append((distance, window.rider_ids[r], r))
        best = [r for *_, r in sorted(eligible)[:n_eff]]
        out[b, : len(best)] = best
    return out


# ----------------------------------------------------------------------------- layout


def test_layout_matches_contract() -> None:
    assert len(PAIR_FEATURE_NAMES) == NUM_PAIR_FEATURES
    assert len(set(PAIR_FEATURE_NAMES)) == NUM_PAIR_FEATURES
    window = random_window(np.random.default_rng(0), 3, 5)
    encoded = features.encode_window(window, SHANGHAI, EncoderSettings(candidates_per_order=4))
    assert encoded.pair_features.shape == (3 * 4, NUM_PAIR_FEATURES)
    assert encoded.pair_features.dtype == np.float32
    assert encoded.candidate_rider_index.shape == (3, 4)
    assert encoded.candidate_rider_index.dtype == np.int32


def test_settings_are_validated() -> None:
    assert EncoderSettings() == EncoderSettings(16, 7)
    EncoderSettings(candidates_per_order=MAX_CANDIDATES)
    for bad in (
        {"candidates_per_order": 0},
        {"candidates_per_order": MAX_CANDIDATES + 1},
        {"zone_precision": 0},
        {"zone_precision": 13},
    ):
        with pytest.raises(ValueError):
            EncoderSettings(**bad)


# ---------------------------------------------------------------- candidate selection


@pytest.mark.parametrize("seed", range(40))
def test_selection_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    spots = int(rng.integers(2, 10)) if seed % 3 == 0 else None
    window = random_window(rng, int(rng.integers(1, 25)), int(rng.integers(1, 80)), spots)
    n = int(rng.integers(1, 13))
    got = features.select_candidates(window, n)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, brute_force_candidates(window, n))


def test_selection_is_exact_with_many_colocated_riders() -> None:
    """Exact ties across the pre-selection cut still resolve by the lower rider id."""
    rng = np.random.default_rng(100)
    window = random_window(rng, 30, 400, spots=3)
    got = features.select_candidates(window, 5)
    np.testing.assert_array_equal(got, brute_force_candidates(window, 5))
    again = features.select_candidates(window, 5)
    np.testing.assert_array_equal(got, again)


def test_selection_skips_infeasible_riders_and_pads() -> None:
    pickup = [31.23, 121.47]
    # Riders get farther from the pickup with their row.
    riders = [[31.23 + 0.001 * (i + 1), 121.47] for i in range(6)]
    window = make_window(
        pickup=[pickup, pickup, pickup, pickup],
        rider_position=riders,
        constraints=[0, THERMAL, LARGE, THERMAL | LARGE | FRAGILE | PRIORITY],
        rider_load=[2, 0, 0, 1, 0, 0],
        rider_capacity=[2, 1, 0, 2, 1, 5],  # rider 0 full, rider 2 has no capacity
        rider_vehicle=[Vehicle.CAR, Vehicle.EBIKE, Vehicle.CAR, Vehicle.CAR, Vehicle.MOTORBIKE, 2],
        rider_equipment=[1, 1, 1, 0, 1, 3],
    )
    got = features.select_candidates(window, 4)
    np.testing.assert_array_equal(
        got,
        [
            [1, 3, 4, 5],  # any rider with spare capacity
            [1, 4, 5, -1],  # thermal box: not rider 3
            [3, 5, -1, -1],  # car only
            [5, -1, -1, -1],  # both
        ],
    )


def test_selection_orders_by_distance_then_id() -> None:
    here = [31.2, 121.4]
    window = make_window(
        pickup=[here],
        rider_position=[[31.21, 121.4], [31.2, 121.4], [31.19, 121.4], [31.2, 121.4]],
    )
    # Rows 1 and 3 sit on the pickup (a tie, lower id first); rows 0 and 2 are 1.1 km
    # away north and south: equal up to rounding, so only assert they come last.
    got = features.select_candidates(window, 3)
    assert got[0, :2].tolist() == [1, 3]
    assert got[0, 2] in (0, 2)


def test_selection_width_is_capped_by_rider_count() -> None:
    window = random_window(np.random.default_rng(1), 4, 3)
    assert features.select_candidates(window, 16).shape == (4, 3)
    with pytest.raises(ValueError):
        features.select_candidates(window, 0)


def test_no_feasible_rider_gives_all_padding() -> None:
    window = make_window(
        pickup=[[31.2, 121.4]],
        rider_position=[[31.2, 121.4]] * 2,
        rider_capacity=[0, 1],
        rider_load=[0, 1],
    )
    np.testing.assert_array_equal(features.select_candidates(window, 2), [[-1, -1]])
    encoded = features.encode_window(window, SHANGHAI, EncoderSettings(candidates_per_order=2))
    assert not encoded.pair_features.any()


def test_feasible_mask() -> None:
    window = make_window(
        pickup=[[31.2, 121.4]] * 3,
        rider_position=[[31.2, 121.4]] * 3,
        constraints=[0, THERMAL, LARGE],
        rider_capacity=[1, 1, 1],
        rider_load=[0, 0, 1],
        rider_vehicle=[Vehicle.CAR, Vehicle.EBIKE, Vehicle.CAR],
        rider_equipment=[0, 1, 1],
    )
    np.testing.assert_array_equal(
        features.feasible_mask(window),
        [[True, True, False], [False, True, False], [True, False, False]],
    )


# --------------------------------------------------------------------------- features


def _hand_window(**overrides: Any) -> DispatchWindow:
    """One order; rider 0 is 0.01 deg north of the pickup, rider 1 is full."""
    pickup = [31.2304, 121.4737]
    fields: dict[str, Any] = {
        "pickup": [pickup],
        "dropoff": [[31.2304, 121.5237]],  # 0.05 deg due east
        "rider_position": [[31.2404, 121.4737], [31.2304, 121.4738]],
        "created_at": [SATURDAY_NOON - 600],
        "promised_minutes": [30.0],
        "constraints": [THERMAL | PRIORITY],
        "rider_load": [1, 2],
        "rider_capacity": [3, 2],
        "rider_vehicle": [Vehicle.MOTORBIKE, Vehicle.CAR],
        "rider_equipment": [1, 1],
    }
    fields.update(overrides)
    return make_window(**fields)


def _zone(lat: float, lon: float) -> tuple[float, float]:
    """Zone position through the string path (encode, decode), independent of the encoder."""
    precision = EncoderSettings().zone_precision
    c_lat, c_lon = geo.geohash_decode_centre(geo.geohash_encode([lat], [lon], precision))
    east, north = geo.en_offset_km(c_lat, c_lon, SHANGHAI.centre)
    return float(east[0]), float(north[0])


def test_features_of_a_hand_made_window() -> None:
    window = _hand_window()
    encoded = features.encode_window(window, SHANGHAI, EncoderSettings(candidates_per_order=3))
    assert isinstance(encoded, EncodedWindow)
    np.testing.assert_array_equal(encoded.candidate_rider_index, [[0, -1]])
    assert encoded.pair_features.shape == (2, NUM_PAIR_FEATURES)
    row = dict(zip(PAIR_FEATURE_NAMES, encoded.pair_features[0].tolist(), strict=True))

    assert row["pickup_distance_km"] == pytest.approx(1.11195, abs=1e-4)
    assert row["trip_distance_km"] == pytest.approx(5.55975 * np.cos(np.radians(31.2304)), rel=1e-4)
    # Rider is due north, so it approaches heading south; the trip heads east.
    assert row["approach_bearing_sin"] == pytest.approx(0.0, abs=1e-6)
    assert row["approach_bearing_cos"] == pytest.approx(-1.0, abs=1e-6)
    assert row["trip_bearing_sin"] == pytest.approx(1.0, abs=1e-4)
    assert row["trip_bearing_cos"] == pytest.approx(0.0, abs=2e-2)
    for prefix, (lat, lon) in {
        "rider": (31.2404, 121.4737),
        "pickup": (31.2304, 121.4737),
        "dropoff": (31.2304, 121.5237),
    }.items():
        east, north = _zone(lat, lon)
        assert row[f"{prefix}_zone_east_km"] == pytest.approx(east, abs=1e-4)
        assert row[f"{prefix}_zone_north_km"] == pytest.approx(north, abs=1e-4)
    # Zones are geohash-7 cells (~150 m): the pickup at the city centre has its zone centre
    # within a cell of it.
    assert abs(row["pickup_zone_east_km"]) < 0.16
    assert abs(row["pickup_zone_north_km"]) < 0.16
    # Noon local time on a Saturday.
    assert row["hour_sin"] == pytest.approx(0.0, abs=1e-6)
    assert row["hour_cos"] == pytest.approx(-1.0)
    assert row["is_weekend"] == 1.0
    assert row["order_age_minutes"] == pytest.approx(10.0)
    assert row["promised_minutes"] == pytest.approx(30.0)
    assert row["slack_minutes"] == pytest.approx(20.0)
    assert (row["needs_thermal_box"], row["large_item"], row["fragile"], row["priority"]) == (
        1.0,
        0.0,
        0.0,
        1.0,
    )
    assert row["rider_load"] == 1.0
    assert row["rider_capacity"] == 3.0
    assert row["rider_load_ratio"] == pytest.approx(1.0 / 3.0)
    assert (row["vehicle_ebike"], row["vehicle_motorbike"], row["vehicle_car"]) == (0.0, 1.0, 0.0)
    # The map: the rider 1.1 km north stays west of the Huangpu; the trip 4.76 km due east
    # crosses it, best through the crossing at (east 1.6, north 1.0) km (cities.geojson), and a
    # motorbike runs 24 km/h on roads 1.3 times the straight line.
    trip_km = 4.7557
    detour = np.hypot(1.6, 1.0) + np.hypot(trip_km - 1.6, 1.0) - trip_km
    assert (row["approach_barrier_crossings"], row["approach_detour_km"]) == (0.0, 0.0)
    assert row["trip_barrier_crossings"] == 1.0
    assert row["trip_detour_km"] == pytest.approx(detour, abs=2e-3)
    assert row["approach_route_minutes"] == pytest.approx(1.11195 * 1.3 / 24 * 60, rel=1e-3)
    assert row["trip_route_minutes"] == pytest.approx((trip_km + detour) * 1.3 / 24 * 60, rel=1e-3)
    # The padded slot is an all-zero row.
    assert not encoded.pair_features[1].any()


def _city_in(timezone_name: str) -> Any:
    """Shanghai's registry entry under another time zone."""
    document = json.loads(DEFAULT_REGISTRY.read_text())
    features = [f for f in document["features"] if f["properties"]["city"] == "shanghai"]
    features[0]["properties"]["timezone"] = timezone_name  # the service area comes first
    return registry_from_dict({**document, "features": features}).cities[0]


def test_time_features_follow_the_citys_time_zone_and_weekday() -> None:
    window = _hand_window()
    utc = features.encode_window(window, _city_in("Etc/UTC")).pair_features[0]
    # 04:00 UTC on the same Saturday.
    assert utc[COLUMN["hour_sin"]] == pytest.approx(np.sin(2 * np.pi * 4 / 24), abs=1e-6)
    assert utc[COLUMN["hour_cos"]] == pytest.approx(np.cos(2 * np.pi * 4 / 24), abs=1e-6)
    assert utc[COLUMN["is_weekend"]] == 1.0

    monday = int(datetime(2024, 6, 3, 0, 30, tzinfo=SHANGHAI_TZ).timestamp())
    row = features.encode_window(
        _hand_window(dispatch_time=monday, created_at=[monday - 60]), SHANGHAI
    ).pair_features[0]
    assert row[COLUMN["is_weekend"]] == 0.0
    assert row[COLUMN["hour_sin"]] == pytest.approx(np.sin(2 * np.pi * 0.5 / 24), abs=1e-6)
    # Sunday 23:59 Shanghai is still the weekend, though Monday in UTC+9.
    sunday = int(datetime(2024, 6, 2, 23, 59, tzinfo=SHANGHAI_TZ).timestamp())
    row = features.encode_window(
        _hand_window(dispatch_time=sunday, created_at=[sunday]), SHANGHAI
    ).pair_features[0]
    assert row[COLUMN["is_weekend"]] == 1.0


def test_order_created_after_dispatch_time_has_zero_age() -> None:
    window = _hand_window(created_at=[SATURDAY_NOON + 120], promised_minutes=[45.0])
    row = features.encode_window(window, SHANGHAI).pair_features[0]
    assert row[COLUMN["order_age_minutes"]] == 0.0
    assert row[COLUMN["slack_minutes"]] == pytest.approx(45.0)


def test_encode_pairs_handles_zero_capacity_and_given_candidates() -> None:
    window = _hand_window(rider_capacity=[0, 2], rider_load=[0, 2])
    candidates = np.array([[1, 0, -1]], dtype=np.int32)
    out = features.encode_pairs(window, candidates, EncoderSettings(), SHANGHAI)
    assert out.shape == (3, NUM_PAIR_FEATURES)
    assert out[0, COLUMN["rider_load_ratio"]] == 1.0
    assert out[0, COLUMN["vehicle_car"]] == 1.0
    assert out[1, COLUMN["rider_capacity"]] == 0.0
    assert out[1, COLUMN["rider_load_ratio"]] == 0.0
    assert not out[2].any()
    with pytest.raises(ValueError):
        features.encode_pairs(window, np.array([[2]], dtype=np.int32), EncoderSettings(), SHANGHAI)
    with pytest.raises(ValueError):
        features.encode_pairs(window, np.array([0, 1], dtype=np.int32), EncoderSettings(), SHANGHAI)


@pytest.mark.parametrize("seed", range(5))
def test_rows_follow_candidates_on_random_windows(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    window = random_window(rng, 40, 120)
    settings = EncoderSettings(candidates_per_order=8)
    encoded = features.encode_window(window, SHANGHAI, settings)
    cand = encoded.candidate_rider_index
    np.testing.assert_array_equal(cand, features.select_candidates(window, 8))
    table = encoded.pair_features.reshape(40, 8, NUM_PAIR_FEATURES)
    assert np.isfinite(table).all()
    valid = cand >= 0
    assert not table[~valid].any()
    b_idx, j_idx = np.nonzero(valid)
    r_idx = cand[valid]
    expected = geo.haversine_km(
        window.rider_position[r_idx, 0],
        window.rider_position[r_idx, 1],
        window.pickup[b_idx, 0],
        window.pickup[b_idx, 1],
    )
    np.testing.assert_allclose(
        table[b_idx, j_idx, COLUMN["pickup_distance_km"]], expected, rtol=1e-6
    )
    # Nearest first within each order.
    distance = table[:, :, COLUMN["pickup_distance_km"]]
    both = valid[:, 1:]  # padding only trails, so the slot before a valid one is valid
    assert np.all((distance[:, 1:] >= distance[:, :-1])[both])
    np.testing.assert_array_equal(
        table[b_idx, j_idx, COLUMN["rider_load"]], window.rider_load[r_idx]
    )
    one_hot = table[valid][
        :, [COLUMN["vehicle_ebike"], COLUMN["vehicle_motorbike"], COLUMN["vehicle_car"]]
    ]
    np.testing.assert_array_equal(one_hot.sum(axis=1), 1.0)
    np.testing.assert_array_equal(one_hot.argmax(axis=1), window.rider_vehicle[r_idx])
    np.testing.assert_array_equal(
        table[b_idx, j_idx, COLUMN["large_item"]], (window.constraints[b_idx] & LARGE) != 0
    )
    # Encoding is deterministic.
    again = features.encode_window(window, SHANGHAI, settings)
    np.testing.assert_array_equal(again.pair_features, encoded.pair_features)


@pytest.mark.parametrize("seed", range(5))
def test_pair_geometry_is_bitwise_the_geo_functions(seed: int) -> None:
    """The encoder's shared passes give exactly what the per-quantity geo calls give."""
    rng = np.random.default_rng(300 + seed)
    window = random_window(rng, int(rng.integers(1, 20)), int(rng.integers(1, 60)), None)
    candidates = features.select_candidates(window, 6)
    padded = candidates.copy()
    padded[:, -1] = -1  # some padding: the scattered-rows path
    for table in (candidates, padded):
        got = features.encode_pairs(window, table, EncoderSettings(), SHANGHAI)
        order, slot = np.nonzero(table >= 0)
        rider = table[order, slot]
        rows = got[order * table.shape[1] + slot]
        r_lat, r_lon = window.rider_position[rider, 0], window.rider_position[rider, 1]
        p_lat, p_lon = window.pickup[order, 0], window.pickup[order, 1]
        d_lat, d_lon = window.dropoff[order, 0], window.dropoff[order, 1]
        precision = EncoderSettings().zone_precision
        zone = geo.en_offset_km(*geo.geohash_cell_centre(r_lat, r_lon, precision), SHANGHAI.centre)
        dropoff_zone = geo.en_offset_km(
            *geo.geohash_cell_centre(d_lat, d_lon, precision), SHANGHAI.centre
        )
        expected = {
            "pickup_distance_km": geo.haversine_km(r_lat, r_lon, p_lat, p_lon),
            "approach_bearing_sin": np.sin(geo.bearing_rad(r_lat, r_lon, p_lat, p_lon)),
            "trip_distance_km": geo.haversine_km(p_lat, p_lon, d_lat, d_lon),
            "trip_bearing_cos": np.cos(geo.bearing_rad(p_lat, p_lon, d_lat, d_lon)),
            "rider_zone_east_km": zone[0],
            "dropoff_zone_north_km": dropoff_zone[1],
        }
        for name, value in expected.items():
            column = rows[:, COLUMN[name]]
            assert column.tobytes() == value.astype(np.float32).tobytes(), name
        assert not got[(table < 0).reshape(-1)].any()


def test_ranking_large_windows_on_threads_gives_the_same_candidates() -> None:
    from dispatch_service.offline.simulator import generate_window

    window = generate_window(np.random.default_rng(12), 700, 3000)  # three blocks of orders
    one = features.select_candidates(window, 16)
    for threads in (2, 3, 8):
        np.testing.assert_array_equal(features.select_candidates(window, 16, threads), one)
    encoded = features.encode_window(window, SHANGHAI, threads=2)
    np.testing.assert_array_equal(encoded.candidate_rider_index, one)


@pytest.mark.parametrize("threads", [0, 65])
def test_selection_threads_must_be_sane(threads: int) -> None:
    with pytest.raises(ValueError, match="selection_threads"):
        features.EncoderThreads(selection_threads=threads)


def _served(window: DispatchWindow, candidates: NDArray[np.int32], seed: int) -> int:
    """Orders the resolver assigns over ``candidates`` with arbitrary (seeded) objectives."""
    rng = np.random.default_rng(seed)
    objectives = np.column_stack(
        (
            rng.uniform(1.0, 30.0, candidates.size),
            rng.uniform(0.0, 1.0, candidates.size),
            rng.uniform(1.0, 30.0, candidates.size),
        )
    ).astype(np.float32)
    resolution = resolve(
        objectives,
        candidates,
        rider_ids=window.rider_ids,
        rider_load=window.rider_load,
        rider_capacity=window.rider_capacity,
        weights=np.ones(3, dtype=np.float32),
    )
    return int(np.count_nonzero(resolution.assigned_rider_index >= 0))


@pytest.mark.parametrize("regime", ["scarcity", "peak_scarcity"])
def test_scarce_windows_serve_as_many_orders_as_the_exact_optimum(regime: str) -> None:
    # The exact optimum: scipy's maximum-cardinality assignment over every feasible pair.
    # Any scores will do: the resolver maximises the count first.
    rng = np.random.default_rng(20261201)
    short_without_coverage = 0
    for seed in range(12):
        window = generate_regime_window(rng, REGIMES[regime])
        optimum = int(np.count_nonzero(distance_matching_assignment(window) >= 0))
        candidates = features.encode_window(window, SHANGHAI).candidate_rider_index
        assert _served(window, candidates, seed) == optimum
        nearest = features.select_candidates(window, EncoderSettings().candidates_per_order)
        short_without_coverage += _served(window, nearest, seed) < optimum
    # The windows are scarce enough that the plain nearest lists do lose orders.
    assert short_without_coverage > 0


def test_a_windows_rows_do_not_depend_on_the_windows_batched_with_it() -> None:
    # encode_pairs_batch builds several windows' features in one pass (dispatch_fused and
    # feature_encoder per Triton execute): each window's rows must be exactly those it gets
    # alone, whatever its batch-mates: sizes, padded candidates, hard constraints, another
    # decision time (hour, weekday) and a window with no candidate at all.
    settings = EncoderSettings()
    rng = np.random.default_rng(7)
    windows = [
        generate_regime_window(rng, dataclasses.replace(REGIMES[name], **size))
        for name, size in (
            ("default", {"num_orders": 1, "num_riders": 20}),
            ("scarcity", {"num_orders": 30, "num_riders": 6}),
            ("hard_constraints", {"num_orders": 12, "num_riders": 40}),
            ("night", {"num_orders": 5, "num_riders": 3}),
            ("default", {"num_orders": 64, "num_riders": 200}),
        )
    ]
    nobody = make_window(
        pickup=[[31.2, 121.4]], rider_position=[[31.21, 121.41]], rider_capacity=[0]
    )
    windows.insert(2, nobody)
    items = [(w, features.window_candidates(w, settings)) for w in windows]
    assert (items[2][1] < 0).all() and any((c < 0).any() for _, c in items[3:])
    # The windows' cities differ too (each window's rows read its own city's map).
    registry = default_registry()
    cities = [registry.cities[i % len(registry.cities)] for i in range(len(items))]
    alone = [
        features.encode_pairs(w, c, settings, city)
        for (w, c), city in zip(items, cities, strict=True)
    ]
    for order in (list(range(len(items))), list(reversed(range(len(items)))), [4, 0]):
        together = features.encode_pairs_batch(
            [items[i] for i in order], settings, [cities[i] for i in order]
        )
        for i, got in zip(order, together, strict=True):
            assert got.dtype == np.float32 and got.shape == alone[i].shape
            assert got.tobytes() == alone[i].tobytes(), f"window {i} in batch {order}"
    assert features.encode_pairs_batch([], settings, []) == []


def test_a_batch_names_the_window_whose_candidates_do_not_fit() -> None:
    window = _hand_window()
    good = (window, np.array([[0, 1]], dtype=np.int32))
    with pytest.raises(ValueError, match="window 1: candidates refer to a rider row"):
        features.encode_pairs_batch(
            [good, (window, np.array([[5]], dtype=np.int32))], EncoderSettings(), [SHANGHAI] * 2
        )


def _usual(window: DispatchWindow) -> DispatchWindow:
    """The window without hard constraints: the kind `windows_candidates` ranks together."""
    return dataclasses.replace(window, constraints=np.zeros_like(window.constraints))


def _crowded_window() -> DispatchWindow:
    """Four orders on one spot, six riders of one slot each: with two candidates per order
    every list names the two nearest, so the lists alone serve two orders of four."""
    here = [31.2, 121.4]
    return make_window(
        pickup=[here] * 4,
        rider_position=[[31.2 + 0.001 * (i + 1), 121.4] for i in range(6)],
        rider_capacity=[1] * 6,
    )


def test_batched_candidates_are_each_windows_own() -> None:
    # dispatch_fused and feature_encoder select the candidates of an execute's windows
    # together: each window must get exactly what it gets alone, whatever its batch-mates.
    settings = EncoderSettings(candidates_per_order=2)
    rng = np.random.default_rng(11)
    windows = [
        generate_regime_window(rng, dataclasses.replace(REGIMES[name], **size))
        for name, size in (
            ("scarcity", {"num_orders": 30, "num_riders": 6}),
            ("hard_constraints", {"num_orders": 12, "num_riders": 40}),
            ("default", {"num_orders": 64, "num_riders": 200}),  # pre-selects
        )
    ]
    for seed in range(8):  # small usual windows, some with co-located riders (exact ties)
        spots = 3 if seed % 2 else None
        shape = (int(rng.integers(1, 6)), int(rng.integers(1, 10)))
        windows.append(_usual(random_window(np.random.default_rng(seed), *shape, spots)))
    windows.append(_usual(generate_regime_window(rng, REGIMES["scarcity"])))
    windows.append(_crowded_window())
    windows.append(
        make_window(pickup=[[31.2, 121.4]], rider_position=[[31.21, 121.41]], rider_capacity=[0])
    )
    alone = [features.window_candidates(w, settings) for w in windows]
    # the crowded window's lists were amended, the nobody window's are all padding
    assert not np.array_equal(alone[-2], features.select_candidates(windows[-2], 2))
    assert (alone[-1] < 0).all()
    count = len(windows)
    for order in (list(range(count)), list(reversed(range(count))), [count - 2, 4, 0]):
        together = features.windows_candidates([windows[i] for i in order], settings)
        for i, got in zip(order, together, strict=True):
            assert got.dtype == np.int32 and got.shape == alone[i].shape
            assert got.tobytes() == alone[i].tobytes(), f"window {i} in batch {order}"
    assert features.windows_candidates([], settings) == []


@pytest.mark.parametrize("seed", range(10))
def test_batched_small_windows_rank_as_the_definition(seed: int) -> None:
    # Riders with slots to spare (nothing for the coverage to amend): one pass over many
    # small windows gives each the brute-force ranking, exact ties by the lower rider id.
    rng = np.random.default_rng(seed)
    windows = []
    for _ in range(12):
        window = random_window(rng, int(rng.integers(1, 4)), int(rng.integers(1, 24)), 4)
        windows.append(
            dataclasses.replace(
                _usual(window),
                rider_load=np.zeros(window.num_riders, np.int32),
                rider_capacity=np.full(window.num_riders, 5, np.int32),
            )
        )
    settings = EncoderSettings()
    for window, got in zip(windows, features.windows_candidates(windows, settings), strict=True):
        expected = brute_force_candidates(window, settings.candidates_per_order)
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("seed", range(10))
def test_batched_windows_whose_orders_share_hard_constraints_rank_as_the_definition(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A window whose orders all carry the same hard constraints (e.g. one order needing a
    # car) is ranked with the batch; one whose orders differ goes alone. Soft bits
    # (fragile, priority) never narrow the riders. Each gets the brute-force ranking.
    rng = np.random.default_rng(seed)
    windows = []
    for k in range(12):
        window = random_window(rng, int(rng.integers(1, 4)), int(rng.integers(1, 24)), 4)
        bits = int(rng.choice([THERMAL, LARGE, THERMAL | LARGE, FRAGILE, PRIORITY | THERMAL]))
        orders = window.num_orders
        mixed = rng.choice([0, THERMAL, LARGE], orders).astype(np.int32)
        windows.append(
            dataclasses.replace(
                window,
                constraints=mixed if k % 4 == 0 else np.full(orders, bits, np.int32),
                rider_equipment=rng.integers(0, 2, window.num_riders).astype(np.int32),
                rider_load=np.zeros(window.num_riders, np.int32),
                rider_capacity=np.full(window.num_riders, 5, np.int32),
            )
        )
    settings = EncoderSettings()
    alone: list[int] = []
    real = features.window_candidates

    def counting(window: DispatchWindow, *args: Any, **kwargs: Any) -> NDArray[np.int32]:
        alone.append(window.num_orders)
        return real(window, *args, **kwargs)

    monkeypatch.setattr(features, "window_candidates", counting)
    together = features.windows_candidates(windows, settings)
    hard = [set((w.constraints & (THERMAL | LARGE)).tolist()) for w in windows]
    assert len(alone) == sum(len(bits) > 1 for bits in hard)  # (no window pre-selects)
    for window, got in zip(windows, together, strict=True):
        expected = brute_force_candidates(window, settings.candidates_per_order)
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == np.int32


def test_batched_scarce_windows_with_shared_constraints_are_each_windows_own() -> None:
    # Riders of one slot each, orders that all need a thermal box: the lists may need the
    # coverage's amendment, exactly as alone.
    rng = np.random.default_rng(4)
    settings = EncoderSettings(candidates_per_order=2)
    windows = []
    for _ in range(6):
        window = generate_regime_window(rng, REGIMES["scarcity"])
        windows.append(
            dataclasses.replace(
                window,
                constraints=np.full(window.num_orders, THERMAL, np.int32),
                rider_equipment=rng.integers(0, 2, window.num_riders).astype(np.int32),
            )
        )
    windows.append(dataclasses.replace(_crowded_window(), constraints=np.full(4, LARGE, np.int32)))
    alone = [features.window_candidates(w, settings) for w in windows]
    for got, want in zip(features.windows_candidates(windows, settings), alone, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


def test_batched_crowded_windows_serve_as_many_orders_as_the_exact_optimum() -> None:
    # scipy's maximum-cardinality assignment over every feasible pair is the reference.
    rng = np.random.default_rng(5)
    windows = [_crowded_window()] + [
        _usual(generate_regime_window(rng, REGIMES["scarcity"])) for _ in range(4)
    ]
    settings = EncoderSettings(candidates_per_order=2)
    for seed, (window, got) in enumerate(
        zip(windows, features.windows_candidates(windows, settings), strict=True)
    ):
        optimum = int(np.count_nonzero(distance_matching_assignment(window) >= 0))
        assert _served(window, got, seed) == optimum


# ---- the lists do not depend on how the window is listed --------------------


def relisted_window(
    window: DispatchWindow, orders: NDArray[np.int64], riders: NDArray[np.int64]
) -> DispatchWindow:
    """``window`` with its orders and riders listed in the order ``orders`` / ``riders``."""
    order_fields = ["order_ids", "order_user_ids", "pickup", "dropoff", "created_at"]
    order_fields += ["promised_minutes", "constraints"]
    rider_fields = ["rider_ids", "rider_position", "rider_load", "rider_capacity"]
    rider_fields += ["rider_vehicle", "rider_equipment"]
    return dataclasses.replace(
        window,
        **{name: getattr(window, name)[orders] for name in order_fields},
        **{name: getattr(window, name)[riders] for name in rider_fields},
    )


def lists_by_ids(window: DispatchWindow, candidates: NDArray[np.int32]) -> dict[bytes, list[Any]]:
    names = np.append(window.rider_ids, np.array([None], dtype=object))
    listed = (names[row].tolist() for row in candidates)
    return dict(zip(window.order_ids.tolist(), listed, strict=True))


@pytest.mark.parametrize(
    ("orders", "riders", "spots"), [(12, 30, 4), (40, 300, 6), (3, 12, 2), (64, 60, 5)]
)
def test_colocated_riders_are_listed_by_id_however_the_window_is_listed(
    orders: int, riders: int, spots: int
) -> None:
    """Riders sharing a position tie exactly on distance: the id decides who comes first and
    who is cut, on the exact path, the pre-selected path and the batched path alike."""
    from dispatch_service.offline.simulator import generate_window

    rng = np.random.default_rng(orders + riders)
    window = generate_window(rng, orders, riders)
    shared = window.rider_position[rng.integers(0, spots, riders)]
    window = dataclasses.replace(window, rider_position=shared)
    settings = EncoderSettings(candidates_per_order=4)
    expected = lists_by_ids(window, features.window_candidates(window, settings))
    for _ in range(3):
        listed = relisted_window(window, rng.permutation(orders), rng.permutation(riders))
        assert lists_by_ids(listed, features.window_candidates(listed, settings)) == expected
        (batched,) = features.windows_candidates([listed], settings)
        assert lists_by_ids(listed, batched) == expected
