"""The pair feature encoder, shared by serving and training so the two cannot drift.

A window of B orders and R riders becomes B x N candidate pairs (the N nearest
feasible riders per order, amended in scarce windows by `coverage`) and a float32
feature row per pair, laid out exactly as
``contracts.PAIR_FEATURE_NAMES``. Everything is vectorised: a full window (1024 x 8192)
must encode within a few tens of milliseconds on a CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    HARD_CONSTRAINTS,
    MAX_CANDIDATES,
    NUM_PAIR_FEATURES,
    PAIR_FEATURE_NAMES,
    OrderConstraint,
    Vehicle,
)
from dispatch_service.domain import geo, roads
from dispatch_service.domain.cities import City
from dispatch_service.domain.coverage import cover_maximum_assignment, fits_spare
from dispatch_service.domain.feasibility import feasible, spare_slots
from dispatch_service.domain.ids import id_rank
from dispatch_service.domain.window import DispatchWindow

__all__ = [
    "EncodedWindow",
    "EncoderSettings",
    "EncoderThreads",
    "IntArray",
    "encode_pairs",
    "encode_pairs_batch",
    "encode_window",
    "feasible_mask",
    "local_time",
    "select_candidates",
    "window_candidates",
    "windows_candidates",
]

IntArray = NDArray[np.int64]
# A group's riders' id ranks (`ids.id_rank`), computed on first call: only exact distance
# ties need them.
RiderKeys = Callable[[], IntArray]

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
    # geohash-7 cells (~150 m): fine enough to tell which side of a river or a ring road a
    # point is on (geohash-5, ~4.9 km, left a third of the best policy's gain out of reach).
    zone_precision: int = 7

    def __post_init__(self) -> None:
        if not 1 <= self.candidates_per_order <= MAX_CANDIDATES:
            raise ValueError(f"candidates_per_order must be within 1..{MAX_CANDIDATES}")
        if not 1 <= self.zone_precision <= geo.MAX_GEOHASH_PRECISION:
            raise ValueError(f"zone_precision must be within 1..{geo.MAX_GEOHASH_PRECISION}")


@dataclass(frozen=True)
class EncoderThreads:
    """How the encoder runs, not what it computes (so not part of a model version)."""

    # Threads that rank a large window's riders (more than one block of orders); the
    # result is the same for any count. Smaller windows always run on one.
    selection_threads: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.selection_threads <= 64:
            raise ValueError("selection_threads must be within 1..64")


@dataclass(frozen=True)
class EncodedWindow:
    """What the feature_encoder step emits: features per pair and the pair's rider row."""

    pair_features: NDArray[np.float32]  # [B * N, NUM_PAIR_FEATURES]
    candidate_rider_index: NDArray[np.int32]  # [B, N], -1 = no candidate


# ------------------------------------------------------------------------ feasibility


def _rider_feasible_for(window: DispatchWindow, hard_bits: int) -> NDArray[np.bool_]:
    """Riders that may take an order carrying ``hard_bits`` of the hard constraints."""
    return feasible(
        hard_bits,
        window.rider_equipment,
        window.rider_vehicle,
        window.rider_load,
        window.rider_capacity,
    )


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
    keys: RiderKeys,
) -> tuple[IntArray, NDArray[np.float64]]:
    """Order ``rows`` (per order, [b, m]) by (haversine, rider id); keep ``take``.

    ``keys()``: the id rank of each rider of ``riders``, asked for only when two of the
    first ``take + 1`` distances of an order are equal (co-located riders): the ids, not
    the rows, decide who is listed first. Returns the chosen rider rows and
    their distances, both [b, take].
    """
    dist = geo.haversine_km(
        riders[rows, 0], riders[rows, 1], pickup[:, 0:1], pickup[:, 1:2]
    ).reshape(rows.shape)
    line = np.arange(rows.shape[0])[:, None]
    order = np.argsort(dist, axis=-1, kind="stable")
    head = dist[line, order[:, : take + 1]]
    if np.count_nonzero(head[:, 1:] == head[:, :-1]):
        order = np.lexsort((keys()[rows], dist), axis=-1)
    order = order[:, :take]
    return rows[line, order], dist[line, order]


def _joined(parts: Sequence[NDArray[Any]]) -> NDArray[Any]:
    """The windows' arrays of a batch end to end (one window's own array, not a copy)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _ranked_exactly(
    pickups: Sequence[NDArray[np.float64]],
    riders: Sequence[NDArray[np.float64]],
    rows: Sequence[IntArray],
    takes: Sequence[int],
    keys: Sequence[RiderKeys],
) -> list[IntArray]:
    """Per group (orders ``pickups`` [b, 2] that may take riders at ``riders`` [m, 2], rows
    ``rows`` [m], their id ranks ``keys``): [b, take] of those rows, every rider ranked by
    (haversine, rider id) and the nearest ``take`` kept. All groups in one pass: one
    distance computation over every pair and one sort, so each group's result is the same
    alone or with others; a group's ids are read only where two of its distances tie."""
    orders = np.array([len(p) for p in pickups], dtype=np.int64)
    width = np.array([len(r) for r in rows], dtype=np.int64)
    per_order = np.repeat(width, orders)  # each order is paired with every rider of its group
    pair_order = np.repeat(np.arange(per_order.size), per_order)
    rider_start = np.repeat(np.repeat(np.cumsum(width) - width, orders), per_order)
    pair_start = np.repeat(np.cumsum(per_order) - per_order, per_order)
    pair_rider = rider_start + (np.arange(pair_order.size) - pair_start)
    pickup, position, row = _joined(pickups), _joined(riders), _joined(rows)
    dist = geo.haversine_km(
        position[pair_rider, 0], position[pair_rider, 1],
        pickup[pair_order, 0], pickup[pair_order, 1],
    )  # fmt: skip
    pair_row = row[pair_rider]
    order = np.lexsort((dist, pair_order))  # stable: exact ties still in row order here
    sorted_dist = dist[order]
    equal = sorted_dist[1:] == sorted_dist[:-1]  # then checked within one order (rare)
    if np.count_nonzero(equal) and (tied := equal & (np.diff(pair_order[order]) == 0)).any():
        # co-located riders: the ids of their groups decide
        group_of_order = np.repeat(np.arange(orders.size), orders)
        tied_groups = set(group_of_order[pair_order[order][1:][tied]].tolist())
        rider_key = _joined(
            [
                keys[group]() if group in tied_groups else np.arange(m, dtype=np.int64)
                for group, m in enumerate(width.tolist())
            ]
        )
        order = np.lexsort((rider_key[pair_rider], dist, pair_order))
    ranked = pair_row[order]
    out: list[IntArray] = []
    first = 0
    for b, m, take in zip(orders.tolist(), width.tolist(), takes, strict=True):
        out.append(ranked[first : first + b * m].reshape(b, m)[:, :take])
        first += b * m
    return out


def _preselects(take: int, num_riders: int) -> bool:
    """Whether the dot-product pre-selection leaves any rider out (else rank them all)."""
    return take + _PRESELECT_MARGIN < num_riders


def _nearest_among(
    pickup: NDArray[np.float64],
    pickup_xyz: NDArray[np.float64],
    riders: NDArray[np.float64],
    riders_xyz: NDArray[np.float64],
    take: int,
    keys: RiderKeys,
    threads: int = 1,
) -> IntArray:
    """Indices into ``riders`` of the ``take`` nearest per pickup, nearest first.

    A dot product of unit vectors (one BLAS call) ranks riders by great-circle distance;
    argpartition keeps the best ``take + margin``; those are ranked exactly by haversine
    with the rider id as tie-break (``keys``: `_exact_nearest`). An order is exact when its
    ``take``-th distance is strictly below a lower bound on every rider left out; the few
    orders where that cannot be shown (near-ties at the cut, co-located riders) are ranked
    exactly over all riders. Callers rank few riders exactly instead (`_preselects`).
    Blocks of orders are independent: with ``threads`` > 1 they run on that many threads
    (same result).
    """
    num_orders, num_riders = pickup.shape[0], riders.shape[0]
    everyone = np.broadcast_to(np.arange(num_riders, dtype=np.int64), (num_orders, num_riders))
    keep = min(take + _PRESELECT_MARGIN, num_riders)

    chosen = np.empty((num_orders, take), dtype=np.int64)
    unproven = np.zeros(num_orders, dtype=np.bool_)
    block = max(1, _BLOCK_ELEMENTS // num_riders)

    def rank(start: int, stop: int) -> None:  # writes only rows start:stop of the outputs
        neg_dot = pickup_xyz[start:stop] @ riders_xyz.T
        np.negative(neg_dot, out=neg_dot)
        part = np.argpartition(neg_dot, keep, axis=1)
        best = part[:, :keep]
        # part[:, keep] holds the largest dot product (nearest rider) left out.
        cut_dot = -np.take_along_axis(neg_dot, part[:, keep : keep + 1], axis=1)[:, 0]
        rows, dist = _exact_nearest(pickup[start:stop], riders, best, take, keys)
        chosen[start:stop] = rows
        chord_sq = np.maximum(2.0 - 2.0 * (cut_dot + _DOT_TOLERANCE), 0.0)
        bound_km = 2.0 * geo.EARTH_RADIUS_KM * np.arcsin(np.minimum(np.sqrt(chord_sq) * 0.5, 1.0))
        bound_km = bound_km * (1.0 - 1e-12) - 1e-12
        unproven[start:stop] = ~(dist[:, take - 1] < bound_km)

    if threads > 1 and num_orders > block:  # as many equal blocks on every thread
        count = -(-num_orders // block)
        block = -(-num_orders // (-(-count // threads) * threads))
    spans = [(start, min(start + block, num_orders)) for start in range(0, num_orders, block)]
    if threads > 1 and len(spans) > 1:
        # numpy releases the GIL in the matrix product and argpartition that dominate here
        with ThreadPoolExecutor(max_workers=min(threads, len(spans))) as pool:
            for done in [pool.submit(rank, start, stop) for start, stop in spans]:
                done.result()
    else:
        for start, stop in spans:
            rank(start, stop)

    redo = np.flatnonzero(unproven)
    for start in range(0, redo.size, block):
        orders = redo[start : start + block]
        chosen[orders] = _exact_nearest(
            pickup[orders], riders, everyone[: orders.size], take, keys
        )[0]
    return chosen


def select_candidates(window: DispatchWindow, n: int, threads: int = 1) -> NDArray[np.int32]:
    """[B, min(n, R)] rider rows: per order the n nearest feasible riders to the pickup.

    Nearest first by haversine distance rider -> pickup, ties broken by the lower rider
    id (bytes), never by the row: the lists are the same however the caller orders the
    riders. -1 pads when fewer riders are feasible. Deterministic for a given
    window, whatever ``threads`` (how many threads large windows are ranked on).
    """
    if n < 1:
        raise ValueError("n must be >= 1")
    num_orders, num_riders = window.num_orders, window.num_riders
    n_eff = min(n, num_riders)
    out = np.full((num_orders, n_eff), -1, dtype=np.int32)
    if num_orders == 0 or n_eff == 0:
        return out
    pickup_xyz: NDArray[np.float64] | None = None
    rider_xyz: NDArray[np.float64] | None = None
    hard = window.constraints.astype(np.int64) & HARD_CONSTRAINTS
    # Without hard constraints (most windows) one group holds every order: no gathers.
    groups: list[tuple[int, IntArray | slice]] = (
        [(bits, np.flatnonzero(hard == bits)) for bits in np.unique(hard).tolist()]
        if hard.any()
        else [(0, slice(None))]
    )
    for bits, orders in groups:
        riders = np.flatnonzero(_rider_feasible_for(window, bits))
        if riders.size == 0:
            continue
        take = min(n_eff, riders.size)
        pickup = window.pickup[orders]
        keys = _rider_keys(window, riders)
        if not _preselects(take, riders.size):  # few riders: rank them all exactly
            (out[orders, :take],) = _ranked_exactly(
                [pickup], [window.rider_position[riders]], [riders], [take], [keys]
            )
            continue
        if pickup_xyz is None or rider_xyz is None:
            pickup_xyz = _unit_vectors(window.pickup)
            rider_xyz = _unit_vectors(window.rider_position)
        local = _nearest_among(
            pickup,
            pickup_xyz[orders],
            window.rider_position[riders],
            rider_xyz[riders],
            take,
            keys,
            threads,
        )
        out[orders, :take] = riders[local]
    return out


def _rider_keys(window: DispatchWindow, riders: IntArray) -> RiderKeys:
    """The id ranks of the window's riders at rows ``riders``, computed once when asked (a
    closure, not `functools.cache`: that costs a small window more than the ranking)."""
    found: list[IntArray] = []

    def keys() -> IntArray:
        if not found:
            found.append(id_rank(window.rider_ids[riders].tolist()))
        return found[0]

    return keys


# ----------------------------------------------------------------------------- features


def local_time(dispatch_time: int, city: City) -> tuple[float, bool]:
    """(fractional local hour, is weekend) of a unix time in the city's time zone."""
    local = dispatch_time + city.utc_offset_s(dispatch_time)
    seconds_of_day = local % _SECONDS_PER_DAY
    weekday = (local // _SECONDS_PER_DAY + _EPOCH_WEEKDAY) % 7
    return seconds_of_day / 3600.0, weekday >= 5


# Where each feature comes from: the pair (rider row), the order, or the whole window.
# Each group is computed as one table and written with one fancy-indexed assignment.
_PAIR_COLUMNS: Final = (
    "pickup_distance_km",
    "approach_bearing_sin",
    "approach_bearing_cos",
    "rider_zone_east_km",
    "rider_zone_north_km",
    "rider_load",
    "rider_capacity",
    "rider_load_ratio",
    "vehicle_ebike",
    "vehicle_motorbike",
    "vehicle_car",
    "approach_barrier_crossings",
    "approach_detour_km",
    "approach_route_minutes",
    "trip_route_minutes",
)
_ORDER_COLUMNS: Final = (
    "trip_distance_km",
    "trip_bearing_sin",
    "trip_bearing_cos",
    "pickup_zone_east_km",
    "pickup_zone_north_km",
    "dropoff_zone_east_km",
    "dropoff_zone_north_km",
    "order_age_minutes",
    "promised_minutes",
    "slack_minutes",
    "needs_thermal_box",
    "large_item",
    "fragile",
    "priority",
    "trip_barrier_crossings",
    "trip_detour_km",
)
_WINDOW_COLUMNS: Final = ("hour_sin", "hour_cos", "is_weekend")
if sorted(_PAIR_COLUMNS + _ORDER_COLUMNS + _WINDOW_COLUMNS) != sorted(PAIR_FEATURE_NAMES):
    raise RuntimeError("encoder columns differ from contracts.PAIR_FEATURE_NAMES")
_PAIR_AT: Final = np.array([PAIR_FEATURE_NAMES.index(name) for name in _PAIR_COLUMNS])
_ORDER_AT: Final = np.array([PAIR_FEATURE_NAMES.index(name) for name in _ORDER_COLUMNS])
_WINDOW_AT: Final = np.array([PAIR_FEATURE_NAMES.index(name) for name in _WINDOW_COLUMNS])
_ORDER_FLAGS: Final = np.array(
    [
        OrderConstraint.THERMAL_BOX,
        OrderConstraint.LARGE_ITEM,
        OrderConstraint.FRAGILE,
        OrderConstraint.PRIORITY,
    ],
    dtype=np.int64,
)
_VEHICLES: Final = np.array([Vehicle.EBIKE, Vehicle.MOTORBIKE, Vehicle.CAR], dtype=np.int64)


def encode_pairs(
    window: DispatchWindow,
    candidates: NDArray[np.int32],
    settings: EncoderSettings,
    city: City,
) -> NDArray[np.float32]:
    """float32 [B * N, F]: row b * N + j describes order b with candidate j.

    Rows of padded candidates (-1) are all zeros. Per-order quantities are computed
    once and gathered; pair and order geometry share one pass (distance, bearing and
    geohash zone over all their points together), so a small window costs a few dozen
    numpy calls and a big one a few passes over B * N values.
    """
    return encode_pairs_batch([(window, candidates)], settings, [city])[0]


def encode_pairs_batch(
    windows: Sequence[tuple[DispatchWindow, NDArray[np.int32]]],
    settings: EncoderSettings,
    cities: Sequence[City],
) -> list[NDArray[np.float32]]:
    """`encode_pairs` of several windows (each with its candidates) in one pass.

    Why: a small window's features cost a few dozen numpy calls whatever its size, so the
    windows of one Triton `execute` share them (issue 11: pair features built for the
    batch's concatenation). Each window's rows are exactly those it gets alone: every
    column is computed row by row, and the values of a window (local hour, weekday) are
    computed per window as for one window and then gathered. ``cities``: each window's
    city (its clock, its plane's origin and its map). Raises ValueError, naming the
    window, for candidates that do not fit their window.
    """
    if len(cities) != len(windows):
        raise ValueError(f"{len(windows)} windows need as many cities, got {len(cities)}")
    pair_orders: list[IntArray] = []  # per window: each valid pair's order, batch-wide
    pair_riders: list[IntArray] = []  # its rider row, in its window
    valids: list[IntArray] = []
    sizes: list[int] = []
    order_base = 0
    for number, (window, candidates) in enumerate(windows):
        num_orders = window.num_orders
        if candidates.ndim != 2 or candidates.shape[0] != num_orders:
            raise ValueError(
                f"window {number}: candidates must have shape [{num_orders}, N], "
                f"got {candidates.shape}"
            )
        flat = candidates.reshape(-1).astype(np.int64)
        if flat.size and int(flat.max()) >= window.num_riders:
            raise ValueError(
                f"window {number}: candidates refer to a rider row that does not exist"
            )
        valid = np.flatnonzero(flat >= 0)
        valids.append(valid)
        sizes.append(flat.size)
        pair_orders.append(valid // max(candidates.shape[1], 1) + order_base)
        pair_riders.append(flat[valid])
        order_base += num_orders
    if order_base == 0 or not any(v.size for v in valids):
        return [np.zeros((size, NUM_PAIR_FEATURES), dtype=np.float32) for size in sizes]

    members = [window for window, _ in windows]
    chosen = list(zip(members, pair_riders, strict=True))  # each window with its pairs' riders
    o = _joined(pair_orders)
    pairs = o.size
    num_orders = order_base
    pickup = _joined([w.pickup for w in members])
    dropoff = _joined([w.dropoff for w in members])
    rider_position = _joined([w.rider_position[r] for w, r in chosen])
    load = _joined([w.rider_load[r] for w, r in chosen]).astype(np.float64)
    capacity = _joined([w.rider_capacity[r] for w, r in chosen]).astype(np.float64)
    vehicle_code = _joined([w.rider_vehicle[r] for w, r in chosen]).astype(np.int64)
    vehicle = vehicle_code[:, None] == _VEHICLES
    order_window = np.repeat(np.arange(len(members)), [w.num_orders for w in members])

    # Legs rider -> pickup (one per pair) then pickup -> dropoff (one per order).
    start = np.concatenate((rider_position, pickup))
    end = np.concatenate((pickup[o], dropoff))
    km, bearing = geo.haversine_bearing(start[:, 0], start[:, 1], end[:, 0], end[:, 1])
    bearing_sin, bearing_cos = np.sin(bearing), np.cos(bearing)
    # Zones of the rider (per pair), the pickup and the dropoff (per order), from their
    # window's city centre.
    centre = geo.cell_centre_latlon(np.concatenate((start, dropoff)), settings.zone_precision)
    origins = np.array([city.centre for city in cities], dtype=np.float64)
    point_window = np.concatenate((order_window[o], order_window, order_window))
    point_origin = origins[point_window]
    east, north = geo.en_offset_km(
        centre[:, 0], centre[:, 1], (point_origin[:, 0], point_origin[:, 1])
    )
    road_pair, road_order = _road_tables(
        cities, order_window, o, pickup, dropoff, rider_position, vehicle_code
    )

    # Per window: its local hour and weekday, as one window computes them; per order: its
    # window's row of them and its decision time.
    window_values = np.empty((len(members), len(_WINDOW_COLUMNS)), dtype=np.float64)
    for row, (window, city) in enumerate(zip(members, cities, strict=True)):
        hour, weekend = local_time(window.dispatch_time, city)
        hour_angle = 2.0 * np.pi * hour / 24.0
        window_values[row] = (float(np.sin(hour_angle)), float(np.cos(hour_angle)), weekend)
    dispatch_time = np.array([w.dispatch_time for w in members], dtype=np.float64)[order_window]
    created_at = _joined([w.created_at for w in members]).astype(np.float64)
    age = np.maximum((dispatch_time - created_at) / 60.0, 0.0)
    promised = _joined([w.promised_minutes for w in members]).astype(np.float64)
    constraints = _joined([w.constraints for w in members]).astype(np.int64)
    flags = (constraints[:, None] & _ORDER_FLAGS) != 0

    trip, pickup_zone, dropoff_zone = (
        slice(pairs, None),
        slice(pairs, -num_orders),
        slice(-num_orders, None),
    )
    per_order_table = np.column_stack(
        (
            km[trip],
            bearing_sin[trip],
            bearing_cos[trip],
            east[pickup_zone],
            north[pickup_zone],
            east[dropoff_zone],
            north[dropoff_zone],
            age,
            promised,
            promised - age,
            flags,
            road_order,
        )
    )
    per_pair_table = np.column_stack(
        (
            km[:pairs],
            bearing_sin[:pairs],
            bearing_cos[:pairs],
            east[:pairs],
            north[:pairs],
            load,
            capacity,
            load / np.maximum(capacity, 1.0),
            vehicle,
            road_pair,
        )
    )
    block = np.empty((pairs, NUM_PAIR_FEATURES), dtype=np.float32)
    block[:, _PAIR_AT] = per_pair_table
    block[:, _ORDER_AT] = per_order_table[o]
    block[:, _WINDOW_AT] = window_values[order_window[o]]

    out: list[NDArray[np.float32]] = []
    first = 0
    for valid, size in zip(valids, sizes, strict=True):
        rows = block[first : first + valid.size]
        first += valid.size
        if valid.size == size:
            out.append(rows)
        else:
            full = np.zeros((size, NUM_PAIR_FEATURES), dtype=np.float32)
            full[valid] = rows
            out.append(full)
    return out


def _road_tables(
    cities: Sequence[City],
    order_window: IntArray,
    pair_order: IntArray,
    pickup: NDArray[np.float64],
    dropoff: NDArray[np.float64],
    rider_position: NDArray[np.float64],
    vehicle: IntArray,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The map's columns: per pair [P, 4] (approach crossings, detour km, route minutes,
    trip route minutes for the pair's vehicle), per order [B, 2] (trip crossings, detour
    km). Each window's legs are read on its own city's map, in that city's plane."""
    pair_table = np.empty((pair_order.size, 4), dtype=np.float64)
    order_table = np.empty((order_window.size, 2), dtype=np.float64)
    pair_window = order_window[pair_order]
    for city in {id(city): city for city in cities}.values():
        mine = np.flatnonzero([member is city for member in cities])
        orders: slice | IntArray = slice(None)
        pairs: slice | IntArray = slice(None)
        local_order = pair_order
        if mine.size < len(cities):  # the batch's windows lie in several cities
            orders = np.flatnonzero(np.isin(order_window, mine))
            pairs = np.flatnonzero(np.isin(pair_window, mine))
            local_order = np.searchsorted(orders, pair_order[pairs])
        # One plane conversion and one map pass for the window's points and legs: each
        # pair's approach (rider -> pickup), then each order's trip (pickup -> drop-off).
        pickups = pickup[orders]
        plane = city.plane(np.concatenate((rider_position[pairs], pickups, dropoff[orders])))
        riders_en, pickup_en, dropoff_en = np.split(
            plane, [local_order.size, local_order.size + pickups.shape[0]]
        )
        legs = roads.leg_roads(
            city,
            np.concatenate((riders_en, pickup_en)),
            np.concatenate((pickup_en[local_order], dropoff_en)),
        )
        approach, trip = slice(None, local_order.size), slice(local_order.size, None)
        crossings, road_km = legs.crossings, legs.road_km(city)
        vehicles = vehicle[pairs]
        order_table[orders, 0] = crossings[trip]
        order_table[orders, 1] = legs.detour_km[trip]
        pair_table[pairs, 0] = crossings[approach]
        pair_table[pairs, 1] = legs.detour_km[approach]
        pair_table[pairs, 2] = roads.route_minutes(city, road_km[approach], vehicles)
        pair_table[pairs, 3] = roads.route_minutes(city, road_km[trip][local_order], vehicles)
    return pair_table, order_table


def window_candidates(
    window: DispatchWindow, settings: EncoderSettings, threads: int = 1
) -> NDArray[np.int32]:
    """[B, N] rider rows per order: the N nearest feasible riders, amended where riders are
    scarce so that the lists still hold an assignment serving as many orders as the exact
    optimum (`coverage.cover_maximum_assignment`)."""
    return _covered(window, select_candidates(window, settings.candidates_per_order, threads))


def windows_candidates(
    windows: Sequence[DispatchWindow], settings: EncoderSettings, threads: int = 1
) -> list[NDArray[np.int32]]:
    """`window_candidates` of each window, each the same as alone. For the windows of the
    usual small kind (every order with the same hard constraints, e.g. a one-order window,
    and so few feasible riders that all are ranked exactly) the feasibility, the ranking
    (`_ranked_exactly`) and the first round of `cover_maximum_assignment` run once over all
    of them: a small window paid ~80 us alone, mostly numpy calls on a few elements."""
    if not windows:
        return []
    n = settings.candidates_per_order
    counts = [w.num_riders for w in windows]
    ends = np.cumsum(counts).tolist()
    starts = [end - count for count, end in zip(counts, ends, strict=True)]
    shared = [_shared_hard_bits(window) for window in windows]
    # Each rider is judged for its window's orders (a window without shared ones goes alone).
    bits = np.repeat([0 if b is None else b for b in shared], counts)
    load = _joined([w.rider_load for w in windows])
    capacity = _joined([w.rider_capacity for w in windows])
    equipment = _joined([w.rider_equipment for w in windows])
    may = feasible(bits, equipment, _joined([w.rider_vehicle for w in windows]), load, capacity)
    spare = spare_slots(load, capacity)
    out: dict[int, NDArray[np.int32]] = {}
    usual: list[tuple[int, IntArray, int]] = []
    for at, window in enumerate(windows):
        riders = np.flatnonzero(may[starts[at] : ends[at]])
        take = min(n, window.num_riders, riders.size)
        if shared[at] is None or _preselects(take, riders.size):
            out[at] = window_candidates(window, settings, threads)
        else:
            usual.append((at, riders, take))
    if not usual:
        return [out[at] for at in range(len(windows))]
    ranked = _ranked_exactly(
        [windows[at].pickup for at, _, _ in usual],
        [windows[at].rider_position[riders] for at, riders, _ in usual],
        [riders for _, riders, _ in usual],
        [take for _, _, take in usual],
        [_rider_keys(windows[at], riders) for at, riders, _ in usual],
    )
    # Each order's nearest rider, as a row of all windows' riders: a window where one is
    # asked for more than its spare slots goes through `cover_maximum_assignment`.
    first = [
        rows[:, 0] + starts[at] for (at, _, _), rows in zip(usual, ranked, strict=True) if rows.size
    ]
    fits = fits_spare(np.concatenate(first), spare) if first else np.ones(spare.size, bool)
    amend = set(np.searchsorted(ends, np.flatnonzero(~fits), side="right").tolist())
    for (at, _, take), rows in zip(usual, ranked, strict=True):
        window = windows[at]
        listed = np.full((window.num_orders, min(n, window.num_riders)), -1, dtype=np.int32)
        listed[:, :take] = rows
        out[at] = _covered(window, listed) if at in amend else listed
    return [out[at] for at in range(len(windows))]


def _shared_hard_bits(window: DispatchWindow) -> int | None:
    """The hard constraints every order of the window carries (`select_candidates` then
    ranks them all as one group); None when they differ or there is no order."""
    hard = window.constraints.astype(np.int64) & HARD_CONSTRAINTS
    if hard.size == 0:
        return None
    first = int(hard[0])
    return first if hard.size == 1 or bool((hard == first).all()) else None


def _covered(window: DispatchWindow, candidates: NDArray[np.int32]) -> NDArray[np.int32]:
    """`window_candidates`' amendment where riders are scarce (`cover_maximum_assignment`),
    its choices made in the order of the window's ids, not of its rows."""
    return cover_maximum_assignment(
        candidates,
        lambda: feasible_mask(window),
        spare_slots(window.rider_load, window.rider_capacity),
        window.order_ids,
        window.rider_ids,
    )


def encode_window(
    window: DispatchWindow,
    city: City,
    settings: EncoderSettings | None = None,
    threads: int = 1,
) -> EncodedWindow:
    """Select candidates (`window_candidates`) and encode their pairs in ``city``: the
    whole feature_encoder step after locating the window."""
    settings = settings or EncoderSettings()
    candidates = window_candidates(window, settings, threads)
    return EncodedWindow(
        pair_features=encode_pairs(window, candidates, settings, city),
        candidate_rider_index=candidates,
    )
