"""The pair feature encoder, shared by serving and training so the two cannot drift.

A window of B orders and R riders becomes B x N candidate pairs (the N nearest
feasible riders per order) and a float32 feature row per pair, laid out exactly as
``contracts.PAIR_FEATURE_NAMES``. Everything is vectorised: a full window (1024 x 8192)
must encode within a few tens of milliseconds on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
from numpy.typing import NDArray

from dispatch_service import geo
from dispatch_service.contracts import (
    HARD_CONSTRAINTS,
    MAX_CANDIDATES,
    NUM_PAIR_FEATURES,
    PAIR_FEATURE_NAMES,
    OrderConstraint,
    Vehicle,
)
from dispatch_service.window import DispatchWindow

IntArray = NDArray[np.int64]

# Candidates fetched by the cheap pre-selection beyond the N needed; the exact ordering
# then has room to reorder near-ties before the guard below has to fall back.
_PRESELECT_MARGIN: Final = 8
# Bound on the float error of a dot product of two unit vectors built from lat/lon.
_DOT_TOLERANCE: Final = 4e-15
# Work in blocks of orders so one block's B x R scores stay cache- and memory-friendly.
_BLOCK_ELEMENTS: Final = 1 << 20
_SECONDS_PER_DAY: Final = 86400
_EPOCH_WEEKDAY: Final = 3  # 1970-01-01 was a Thursday (Monday = 0)


@dataclass(frozen=True)
class EncoderSettings:
    """Knobs that change the features; part of a model version, so frozen."""

    candidates_per_order: int = 16
    utc_offset_minutes: int = 480  # Asia/Shanghai: hour-of-day is the city's local hour
    zone_precision: int = 5  # geohash-5 zones are ~4.9 km x 4.9 km

    def __post_init__(self) -> None:
        if not 1 <= self.candidates_per_order <= MAX_CANDIDATES:
            raise ValueError(f"candidates_per_order must be within 1..{MAX_CANDIDATES}")
        if not -18 * 60 <= self.utc_offset_minutes <= 18 * 60:
            raise ValueError("utc_offset_minutes must be within +-18 hours")
        if not 1 <= self.zone_precision <= geo.MAX_GEOHASH_PRECISION:
            raise ValueError(f"zone_precision must be within 1..{geo.MAX_GEOHASH_PRECISION}")


@dataclass(frozen=True)
class EncodedWindow:
    """What the feature_encoder step emits: features per pair and the pair's rider row."""

    pair_features: NDArray[np.float32]  # [B * N, NUM_PAIR_FEATURES]
    candidate_rider_index: NDArray[np.int32]  # [B, N], -1 = no candidate


# ------------------------------------------------------------------------ feasibility


def _rider_feasible_for(window: DispatchWindow, hard_bits: int) -> NDArray[np.bool_]:
    """Riders that may take an order carrying ``hard_bits`` of the hard constraints."""
    spare = window.rider_capacity.astype(np.int64) - window.rider_load.astype(np.int64)
    ok = spare > 0
    if hard_bits & OrderConstraint.THERMAL_BOX:
        ok &= (window.rider_equipment & 1) != 0
    if hard_bits & OrderConstraint.LARGE_ITEM:
        ok &= window.rider_vehicle == Vehicle.CAR
    return np.asarray(ok)


def feasible_mask(window: DispatchWindow) -> NDArray[np.bool_]:
    """[B, R]: may rider r take order b (spare capacity and hard constraints)."""
    hard = window.constraints.astype(np.int64) & HARD_CONSTRAINTS
    mask = np.zeros((window.num_orders, window.num_riders), dtype=np.bool_)
    for bits in np.unique(hard).tolist():
        mask[hard == bits] = _rider_feasible_for(window, int(bits))
    return mask


# ---------------------------------------------------------------- candidate selection


def _unit_vectors(latlon: NDArray[np.float64]) -> NDArray[np.float64]:
    lat = np.radians(latlon[:, 0])
    lon = np.radians(latlon[:, 1])
    cos_lat = np.cos(lat)
    return np.stack([cos_lat * np.cos(lon), cos_lat * np.sin(lon), np.sin(lat)], axis=1)


def _exact_nearest(
    pickup: NDArray[np.float64],
    riders: NDArray[np.float64],
    rows: IntArray,
    take: int,
) -> tuple[IntArray, NDArray[np.float64]]:
    """Order ``rows`` (per order, [b, m]) by (haversine, rider row); keep ``take``.

    Returns the chosen rider rows and their distances, both [b, take].
    """
    dist = geo.haversine_km(
        riders[rows, 0], riders[rows, 1], pickup[:, 0:1], pickup[:, 1:2]
    ).reshape(rows.shape)
    order = np.lexsort((rows, dist), axis=-1)[:, :take]
    return np.take_along_axis(rows, order, axis=1), np.take_along_axis(dist, order, axis=1)


def _nearest_among(
    pickup: NDArray[np.float64],
    pickup_xyz: NDArray[np.float64],
    riders: NDArray[np.float64],
    riders_xyz: NDArray[np.float64],
    take: int,
) -> IntArray:
    """Indices into ``riders`` of the ``take`` nearest per pickup, nearest first.

    A dot product of unit vectors (one BLAS call) ranks riders by great-circle distance;
    argpartition keeps the best ``take + margin``; those are ranked exactly by haversine
    with the rider row as tie-break. An order is exact when its ``take``-th distance is
    strictly below a lower bound on every rider left out; the few orders where that
    cannot be shown (near-ties at the cut, co-located riders) are ranked exactly over
    all riders.
    """
    num_orders, num_riders = pickup.shape[0], riders.shape[0]
    everyone = np.broadcast_to(np.arange(num_riders, dtype=np.int64), (num_orders, num_riders))
    keep = min(take + _PRESELECT_MARGIN, num_riders)
    if keep >= num_riders:
        return _exact_nearest(pickup, riders, everyone, take)[0]

    chosen = np.empty((num_orders, take), dtype=np.int64)
    unproven = np.zeros(num_orders, dtype=np.bool_)
    block = max(1, _BLOCK_ELEMENTS // num_riders)
    for start in range(0, num_orders, block):
        stop = min(start + block, num_orders)
        neg_dot = pickup_xyz[start:stop] @ riders_xyz.T
        np.negative(neg_dot, out=neg_dot)
        part = np.argpartition(neg_dot, keep, axis=1)
        best = part[:, :keep]
        # part[:, keep] holds the largest dot product (nearest rider) left out.
        cut_dot = -np.take_along_axis(neg_dot, part[:, keep : keep + 1], axis=1)[:, 0]
        rows, dist = _exact_nearest(pickup[start:stop], riders, best, take)
        chosen[start:stop] = rows
        chord_sq = np.maximum(2.0 - 2.0 * (cut_dot + _DOT_TOLERANCE), 0.0)
        bound_km = 2.0 * geo.EARTH_RADIUS_KM * np.arcsin(np.minimum(np.sqrt(chord_sq) * 0.5, 1.0))
        bound_km = bound_km * (1.0 - 1e-12) - 1e-12
        unproven[start:stop] = ~(dist[:, take - 1] < bound_km)

    redo = np.flatnonzero(unproven)
    for start in range(0, redo.size, block):
        orders = redo[start : start + block]
        chosen[orders] = _exact_nearest(pickup[orders], riders, everyone[: orders.size], take)[0]
    return chosen


def select_candidates(window: DispatchWindow, n: int) -> NDArray[np.int32]:
    """[B, min(n, R)] rider rows: per order the n nearest feasible riders to the pickup.

    Nearest first by haversine distance rider -> pickup, ties broken by the lower rider
    row; -1 pads when fewer riders are feasible. Deterministic for a given window.
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    num_orders, num_riders = window.num_orders, window.num_riders
    n_eff = min(n, num_riders)
    out = np.full((num_orders, n_eff), -1, dtype=np.int32)
    if num_orders == 0 or n_eff == 0:
        return out
    pickup_xyz = _unit_vectors(window.pickup)
    rider_xyz = _unit_vectors(window.rider_position)
    hard = window.constraints.astype(np.int64) & HARD_CONSTRAINTS
    for bits in np.unique(hard).tolist():
        orders = np.flatnonzero(hard == bits)
        riders = np.flatnonzero(_rider_feasible_for(window, int(bits)))
        if riders.size == 0:
            continue
        take = min(n_eff, riders.size)
        local = _nearest_among(
            window.pickup[orders],
            pickup_xyz[orders],
            window.rider_position[riders],
            rider_xyz[riders],
            take,
        )
        out[orders, :take] = riders[local]
    return out


# ----------------------------------------------------------------------------- features


def _local_time(dispatch_time: int, utc_offset_minutes: int) -> tuple[float, bool]:
    """(fractional local hour, is weekend) of a unix time."""
    local = dispatch_time + utc_offset_minutes * 60
    seconds_of_day = local % _SECONDS_PER_DAY
    weekday = (local // _SECONDS_PER_DAY + _EPOCH_WEEKDAY) % 7
    return seconds_of_day / 3600.0, weekday >= 5


def _zone_km(
    latlon: NDArray[np.float64], precision: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    lat, lon = geo.geohash_cell_centre(latlon[:, 0], latlon[:, 1], precision)
    return geo.en_offset_km(lat, lon)


def encode_pairs(
    window: DispatchWindow, candidates: NDArray[np.int32], settings: EncoderSettings
) -> NDArray[np.float32]:
    """float32 [B * N, F]: row b * N + j describes order b with candidate j.

    Rows of padded candidates (-1) are all zeros. Per-order and per-rider quantities
    are computed once and gathered, so the cost is a few passes over B * N values.
    """
    num_orders = window.num_orders
    if candidates.ndim != 2 or candidates.shape[0] != num_orders:
        raise ValueError(f"candidates must have shape [{num_orders}, N], got {candidates.shape}")
    per_order = candidates.shape[1]
    flat = candidates.reshape(-1).astype(np.int64)
    if flat.size and int(flat.max()) >= window.num_riders:
        raise ValueError("candidates refer to a rider row that does not exist")
    out = np.zeros((flat.size, NUM_PAIR_FEATURES), dtype=np.float32)
    valid = np.flatnonzero(flat >= 0)
    if valid.size == 0:
        return out
    o = valid // per_order
    r = flat[valid]

    pickup, dropoff, rider = window.pickup, window.dropoff, window.rider_position
    p_lat, p_lon = pickup[o, 0], pickup[o, 1]
    r_lat, r_lon = rider[r, 0], rider[r, 1]

    trip_km = geo.haversine_km(pickup[:, 0], pickup[:, 1], dropoff[:, 0], dropoff[:, 1])
    trip_bearing = geo.bearing_rad(pickup[:, 0], pickup[:, 1], dropoff[:, 0], dropoff[:, 1])
    approach_bearing = geo.bearing_rad(r_lat, r_lon, p_lat, p_lon)
    rider_e, rider_n = _zone_km(rider[r], settings.zone_precision)
    pickup_e, pickup_n = _zone_km(pickup, settings.zone_precision)
    dropoff_e, dropoff_n = _zone_km(dropoff, settings.zone_precision)

    hour, weekend = _local_time(window.dispatch_time, settings.utc_offset_minutes)
    hour_angle = 2.0 * np.pi * hour / 24.0
    age = np.maximum((window.dispatch_time - window.created_at.astype(np.float64)) / 60.0, 0.0)
    promised = window.promised_minutes.astype(np.float64)
    bits = window.constraints.astype(np.int64)
    load = window.rider_load.astype(np.float64)
    capacity = window.rider_capacity.astype(np.float64)
    vehicle = window.rider_vehicle

    def flag(values: NDArray[np.int64], bit: int) -> NDArray[np.float64]:
        return np.asarray((values & bit) != 0, dtype=np.float64)

    columns: dict[str, NDArray[np.float64] | float] = {
        "pickup_distance_km": geo.haversine_km(r_lat, r_lon, p_lat, p_lon),
        "trip_distance_km": trip_km[o],
        "approach_bearing_sin": np.sin(approach_bearing),
        "approach_bearing_cos": np.cos(approach_bearing),
        "trip_bearing_sin": np.sin(trip_bearing)[o],
        "trip_bearing_cos": np.cos(trip_bearing)[o],
        "rider_zone_east_km": rider_e,
        "rider_zone_north_km": rider_n,
        "pickup_zone_east_km": pickup_e[o],
        "pickup_zone_north_km": pickup_n[o],
        "dropoff_zone_east_km": dropoff_e[o],
        "dropoff_zone_north_km": dropoff_n[o],
        "hour_sin": float(np.sin(hour_angle)),
        "hour_cos": float(np.cos(hour_angle)),
        "is_weekend": float(weekend),
        "order_age_minutes": age[o],
        "promised_minutes": promised[o],
        "slack_minutes": (promised - age)[o],
        "needs_thermal_box": flag(bits, OrderConstraint.THERMAL_BOX)[o],
        "large_item": flag(bits, OrderConstraint.LARGE_ITEM)[o],
        "fragile": flag(bits, OrderConstraint.FRAGILE)[o],
        "priority": flag(bits, OrderConstraint.PRIORITY)[o],
        "rider_load": load[r],
        "rider_capacity": capacity[r],
        "rider_load_ratio": (load / np.maximum(capacity, 1.0))[r],
        "vehicle_ebike": (vehicle == Vehicle.EBIKE).astype(np.float64)[r],
        "vehicle_motorbike": (vehicle == Vehicle.MOTORBIKE).astype(np.float64)[r],
        "vehicle_car": (vehicle == Vehicle.CAR).astype(np.float64)[r],
    }
    if tuple(columns) != PAIR_FEATURE_NAMES:
        raise RuntimeError("encoder columns differ from contracts.PAIR_FEATURE_NAMES")
    block = np.empty((valid.size, NUM_PAIR_FEATURES), dtype=np.float32)
    for j, value in enumerate(columns.values()):
        block[:, j] = value
    out[valid] = block
    return out


def encode_window(window: DispatchWindow, settings: EncoderSettings | None = None) -> EncodedWindow:
    """Select candidates and encode their pairs: the whole feature_encoder step."""
    settings = settings or EncoderSettings()
    candidates = select_candidates(window, settings.candidates_per_order)
    return EncodedWindow(
        pair_features=encode_pairs(window, candidates, settings),
        candidate_rider_index=candidates,
    )
