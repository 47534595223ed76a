"""The pair feature encoder, shared by serving and training so the two cannot drift.

A window of B orders and R riders becomes B x N candidate pairs (the N nearest
feasible riders per order, `candidates`, amended in scarce windows by `coverage`) and a float32
feature row per pair, laid out exactly as
``contracts.PAIR_FEATURE_NAMES``. Everything is vectorised: a full window (1024 x 8192)
must encode within a few tens of milliseconds on a CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

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
from dispatch_service.domain import geo, map_features, pair_kernels
from dispatch_service.domain.candidates import (
    IntArray,
    feasible_mask,
    joined,
    preselects,
    ranked_exactly,
    rider_keys,
    select_candidates,
)
from dispatch_service.domain.cities import City
from dispatch_service.domain.coverage import cover_maximum_assignment, fits_spare, list_width
from dispatch_service.domain.feasibility import feasible, spare_slots
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
    *map_features.MAP_PAIR_COLUMNS,
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
    *map_features.MAP_ORDER_COLUMNS,
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
    windows of one Triton `execute` share them (pair features are built for the batch's
    concatenation). Each window's rows are exactly those it gets alone: every
    column is computed row by row, and the values of a window (local hour, weekday) are
    computed per window as for one window and then gathered. ``cities``: each window's
    city (its clock, its plane's origin and its map). Raises ValueError, naming the
    window, for candidates that do not fit their window.
    """
    if len(cities) != len(windows):
        raise ValueError(f"{len(windows)} windows need as many cities, got {len(cities)}")
    pair_orders: list[IntArray] = []  # per window: each valid pair's order, batch-wide
    pair_riders: list[IntArray] = []  # its rider row, in its window
    batch_riders: list[IntArray] = []  # and batch-wide (each window's riders after the last's)
    valids: list[IntArray] = []
    sizes: list[int] = []
    order_base = rider_base = 0
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
        valid = (flat >= 0).nonzero()[0]  # np.flatnonzero without its wrappers
        valids.append(valid)
        sizes.append(flat.size)
        pair_orders.append(valid // max(candidates.shape[1], 1) + order_base)
        pair_riders.append(flat[valid])
        batch_riders.append(pair_riders[-1] + rider_base if rider_base else pair_riders[-1])
        order_base += num_orders
        rider_base += window.num_riders
    if order_base == 0 or not any(v.size for v in valids):
        return [np.zeros((size, NUM_PAIR_FEATURES), dtype=np.float32) for size in sizes]

    members = [window for window, _ in windows]
    chosen = list(zip(members, pair_riders, strict=True))  # each window with its pairs' riders
    o = joined(pair_orders)
    pairs = o.size
    num_orders = order_base
    pickup = joined([w.pickup for w in members])
    dropoff = joined([w.dropoff for w in members])
    vehicle_code = joined([w.rider_vehicle[r] for w, r in chosen]).astype(np.int64)
    order_window = (  # each order's window: a lone window's are all 0, without a repeat
        np.zeros(num_orders, dtype=np.int64)
        if len(members) == 1
        else np.repeat(np.arange(len(members)), [w.num_orders for w in members])
    )

    # Legs rider -> pickup (one per pair) then pickup -> dropoff (one per order): their
    # km and bearings; the rider (per pair), the pickup and the drop-off (per order): their
    # zones' centres and the points themselves, in their window's city plane.
    legs, zones = pairs + num_orders, pairs + 2 * num_orders
    km, bearing_sin, bearing_cos = np.empty(legs), np.empty(legs), np.empty(legs)
    zone_east, zone_north, plane = np.empty(zones), np.empty(zones), np.empty((zones, 2))
    geometry = (km, bearing_sin, bearing_cos, zone_east, zone_north, plane)
    pair_kernels.leg_geometry(
        (joined([w.rider_position for w in members]), joined(batch_riders), o, pickup, dropoff),
        geo.geohash_grid(settings.zone_precision),
        (*_origins(cities, order_window, o), geo.EARTH_RADIUS_KM),
        geometry,
    )
    road_pair, road_order = map_features.road_tables(cities, order_window, o, plane, vehicle_code)

    # Per window: its local hour and weekday, as one window computes them.
    window_values = np.empty((len(members), len(_WINDOW_COLUMNS)), dtype=np.float64)
    for row, (window, city) in enumerate(zip(members, cities, strict=True)):
        hour, weekend = local_time(window.dispatch_time, city)
        hour_angle = 2.0 * np.pi * hour / 24.0
        window_values[row] = (float(np.sin(hour_angle)), float(np.cos(hour_angle)), weekend)
    block = np.empty((pairs, NUM_PAIR_FEATURES), dtype=np.float32)
    pair_kernels.write_block(
        block,
        (_PAIR_AT, _ORDER_AT, _WINDOW_AT, _VEHICLES, _ORDER_FLAGS),
        geometry,
        (
            o,
            vehicle_code,
            joined([w.rider_load[r] for w, r in chosen]).astype(np.float64),
            joined([w.rider_capacity[r] for w, r in chosen]).astype(np.float64),
            road_pair,
        ),
        (
            order_window,
            joined([w.created_at for w in members]).astype(np.int64),
            joined([w.promised_minutes for w in members]).astype(np.float64),
            joined([w.constraints for w in members]).astype(np.int64),
            road_order,
            np.array([w.dispatch_time for w in members], dtype=np.float64),
            window_values,
        ),
    )

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


def _origins(
    cities: Sequence[City], order_window: IntArray, pair_order: IntArray
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The plane's origin (lat, lon) of each point `encode_pairs_batch` converts (riders per
    pair, pickups, drop-offs): its window's city centre; for a batch in one city that
    centre alone (arrays of one: the same values, without the gathers)."""
    if len({id(city) for city in cities}) == 1:
        lat, lon = cities[0].centre
        return np.array([lat], dtype=np.float64), np.array([lon], dtype=np.float64)
    origins = np.array([city.centre for city in cities], dtype=np.float64)
    point_origin = origins[np.concatenate((order_window[pair_order], order_window, order_window))]
    return np.ascontiguousarray(point_origin[:, 0]), np.ascontiguousarray(point_origin[:, 1])


def window_candidates(
    window: DispatchWindow,
    settings: EncoderSettings,
    threads: int = 1,
    *,
    widen_scarce: bool = False,
) -> NDArray[np.int32]:
    """[B, N] rider rows per order: the N nearest feasible riders, amended where riders are
    scarce so that the lists still hold an assignment serving as many orders as the exact
    optimum (`coverage.cover_maximum_assignment`). ``widen_scarce`` (the served decision):
    a scarce window lists more riders (`coverage.list_width`); training's windows keep N."""
    spare = spare_slots(window.rider_load, window.rider_capacity)
    n = settings.candidates_per_order
    if widen_scarce:
        n = list_width(n, int(spare.sum()), window.num_orders)
    return _covered(window, select_candidates(window, n, threads), spare)


def windows_candidates(
    windows: Sequence[DispatchWindow],
    settings: EncoderSettings,
    threads: int = 1,
    *,
    widen_scarce: bool = False,
) -> list[NDArray[np.int32]]:
    """`window_candidates` of each window, each the same as alone. For the windows of the
    usual small kind (every order with the same hard constraints, e.g. a one-order window,
    and so few feasible riders that all are ranked exactly) the feasibility, the ranking
    (`ranked_exactly`) and the first round of `cover_maximum_assignment` run once over all
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
    load = joined([w.rider_load for w in windows])
    capacity = joined([w.rider_capacity for w in windows])
    equipment = joined([w.rider_equipment for w in windows])
    may = feasible(bits, equipment, joined([w.rider_vehicle for w in windows]), load, capacity)
    spare = spare_slots(load, capacity)
    # Each window's spare slots in all: a scarce one may list more riders (`list_width`).
    spare_in: list[int] | None = None
    if widen_scarce:
        total = np.concatenate(([0], np.cumsum(spare)))
        spare_in = (total[ends] - total[starts]).tolist()
    out: dict[int, NDArray[np.int32]] = {}
    usual: list[tuple[int, IntArray, int, int]] = []  # window, its riders, take, list width
    for at, window in enumerate(windows):
        riders = np.flatnonzero(may[starts[at] : ends[at]])
        wanted = n if spare_in is None else list_width(n, spare_in[at], window.num_orders)
        width = min(wanted, window.num_riders)
        take = min(width, riders.size)
        if shared[at] is None or preselects(take, riders.size):
            out[at] = window_candidates(window, settings, threads, widen_scarce=widen_scarce)
        else:
            usual.append((at, riders, take, width))
    if not usual:
        return [out[at] for at in range(len(windows))]
    ranked = ranked_exactly(
        [windows[at].pickup for at, _, _, _ in usual],
        [windows[at].rider_position[riders] for at, riders, _, _ in usual],
        [riders for _, riders, _, _ in usual],
        [take for _, _, take, _ in usual],
        [rider_keys(windows[at], riders) for at, riders, _, _ in usual],
    )
    # Each order's nearest rider, as a row of all windows' riders: a window where one is
    # asked for more than its spare slots goes through `cover_maximum_assignment`.
    first = [
        rows[:, 0] + starts[at]
        for (at, _, _, _), rows in zip(usual, ranked, strict=True)
        if rows.size
    ]
    fits = fits_spare(np.concatenate(first), spare) if first else np.ones(spare.size, bool)
    amend = set(np.searchsorted(ends, np.flatnonzero(~fits), side="right").tolist())
    for (at, _, take, width), rows in zip(usual, ranked, strict=True):
        window = windows[at]
        listed = np.full((window.num_orders, width), -1, dtype=np.int32)
        listed[:, :take] = rows
        own = spare[starts[at] : ends[at]]
        out[at] = _covered(window, listed, own) if at in amend else listed
    return [out[at] for at in range(len(windows))]


def _shared_hard_bits(window: DispatchWindow) -> int | None:
    """The hard constraints every order of the window carries (`select_candidates` then
    ranks them all as one group); None when they differ or there is no order."""
    hard = window.constraints.astype(np.int64) & HARD_CONSTRAINTS
    if hard.size == 0:
        return None
    first = int(hard[0])
    return first if hard.size == 1 or bool((hard == first).all()) else None


def _covered(
    window: DispatchWindow, candidates: NDArray[np.int32], spare: NDArray[np.int64]
) -> NDArray[np.int32]:
    """`window_candidates`' amendment where riders are scarce (`cover_maximum_assignment`),
    its choices made in the order of the window's ids, not of its rows; ``spare``: the
    riders' spare slots."""
    return cover_maximum_assignment(
        candidates,
        lambda: feasible_mask(window),
        spare,
        window.order_ids,
        window.rider_ids,
    )


def encode_window(
    window: DispatchWindow,
    city: City,
    settings: EncoderSettings | None = None,
    threads: int = 1,
    *,
    widen_scarce: bool = False,
) -> EncodedWindow:
    """Select candidates (`window_candidates`, ``widen_scarce`` as it takes it) and encode
    their pairs in ``city``: the whole feature_encoder step after locating the window."""
    settings = settings or EncoderSettings()
    candidates = window_candidates(window, settings, threads, widen_scarce=widen_scarce)
    return EncodedWindow(
        pair_features=encode_pairs(window, candidates, settings, city),
        candidate_rider_index=candidates,
    )
