"""Candidate selection: per order the N nearest feasible riders, nearest first.

Split from `features` (which encodes the pairs chosen here): the feasibility of each
rider for each order (`feasible_mask`), the exact ranking by (haversine, rider id)
(`ranked_exactly`, all of a group's riders in one pass) and, for windows with many riders,
a dot-product pre-selection whose result is proven exact or redone
(`select_candidates`). `features.window_candidates` amends the lists where riders are
scarce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import HARD_CONSTRAINTS
from dispatch_service.domain import geo, pair_kernels, window_kernels
from dispatch_service.domain.feasibility import feasible
from dispatch_service.domain.ids import id_rank
from dispatch_service.domain.window import DispatchWindow

__all__ = [
    "IntArray",
    "RiderKeys",
    "feasible_mask",
    "joined",
    "preselects",
    "ranked_exactly",
    "rider_distances",
    "rider_feasible_for",
    "rider_keys",
    "select_candidates",
]

IntArray = NDArray[np.int64]
# A group's riders' id ranks (`ids.id_rank`), computed on first call: only exact distance
# ties need them.
RiderKeys = Callable[[], IntArray]

# Candidates fetched by the cheap pre-selection beyond the N needed; the exact ordering
# then has room to reorder near-ties before the guard below has to fall back.
_PRESELECT_MARGIN: Final = 8
# The pre-selection's grid (`_rider_grid`): about this many riders per cell, and a grid
# only from this many order x rider pairs (below, one cell: every rider compared).
_RIDERS_PER_CELL: Final = 8
_GRID_FROM: Final = 1 << 15
# Bound on the float error of a dot product of two unit vectors built from lat/lon.
_DOT_TOLERANCE: Final = 4e-15
# Work in blocks of orders so a block redone over every rider keeps its B x R distances
# cache- and memory-friendly; blocks are also the unit handed to threads.
_BLOCK_ELEMENTS: Final = 1 << 20


# ------------------------------------------------------------------------ feasibility


def rider_feasible_for(window: DispatchWindow, hard_bits: int) -> NDArray[np.bool_]:
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
        mask[hard == bits] = rider_feasible_for(window, int(bits))
    return mask


# ---------------------------------------------------------------- candidate selection


def _unit_vectors(latlon: NDArray[np.float64]) -> NDArray[np.float64]:
    lat = np.radians(latlon[:, 0])
    lon = np.radians(latlon[:, 1])
    cos_lat = np.cos(lat)
    return np.stack([cos_lat * np.cos(lon), cos_lat * np.sin(lon), np.sin(lat)], axis=1)


def rider_distances(
    riders: NDArray[np.float64],
    rider_at: IntArray,
    pickups: NDArray[np.float64],
    pickup_at: IntArray,
) -> NDArray[np.float64]:
    """`geo.haversine_km` from each rider ``riders[rider_at[i]]`` to its pickup
    ``pickups[pickup_at[i]]`` ([n, 2] lat, lon each), the same bits, in one compiled loop
    (`pair_kernels.pair_distances`): no gathered copies, no numpy call per operation."""
    km = np.empty(rider_at.shape[0], dtype=np.float64)
    pair_kernels.pair_distances(
        (riders, rider_at.astype(np.int64, copy=False)),
        (pickups, pickup_at.astype(np.int64, copy=False)),
        geo.EARTH_RADIUS_KM,
        km,
    )
    return km


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
    orders, width = rows.shape
    dist = rider_distances(
        riders, rows.reshape(-1), pickup, np.repeat(np.arange(orders), width)
    ).reshape(orders, width)
    line = np.arange(rows.shape[0])[:, None]
    order = np.argsort(dist, axis=-1, kind="stable")
    head = dist[line, order[:, : take + 1]]
    if np.count_nonzero(head[:, 1:] == head[:, :-1]):
        order = np.lexsort((keys()[rows], dist), axis=-1)
    order = order[:, :take]
    return rows[line, order], dist[line, order]


def joined(parts: Sequence[NDArray[Any]]) -> NDArray[Any]:
    """The windows' arrays of a batch end to end (one window's own array, not a copy)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def ranked_exactly(
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
    if len(pickups) == 1:  # one group (a window alone): every order with every rider
        (b,), (m,) = orders.tolist(), width.tolist()
        if b == 1:  # one order (a small window): np.repeat's and np.tile's arrays, directly
            pair_order, pair_rider = np.zeros(m, dtype=np.int64), np.arange(m, dtype=np.int64)
        else:
            pair_order = np.repeat(np.arange(b), m)
            pair_rider = np.tile(np.arange(m), b)
    else:
        per_order = np.repeat(width, orders)  # each order paired with every rider of its group
        pair_order = np.repeat(np.arange(per_order.size), per_order)
        rider_start = np.repeat(np.repeat(np.cumsum(width) - width, orders), per_order)
        pair_start = np.repeat(np.cumsum(per_order) - per_order, per_order)
        pair_rider = rider_start + (np.arange(pair_order.size) - pair_start)
    pickup, position, row = joined(pickups), joined(riders), joined(rows)
    dist = rider_distances(position, pair_rider, pickup, pair_order)
    pair_row = row[pair_rider]
    order = np.lexsort((dist, pair_order))  # stable: exact ties still in row order here
    sorted_dist = dist[order]
    equal = sorted_dist[1:] == sorted_dist[:-1]  # then checked within one order (rare)
    if np.count_nonzero(equal) and (tied := equal & (np.diff(pair_order[order]) == 0)).any():
        # co-located riders: the ids of their groups decide
        group_of_order = np.repeat(np.arange(orders.size), orders)
        tied_groups = set(group_of_order[pair_order[order][1:][tied]].tolist())
        rider_key = joined(
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


def preselects(take: int, num_riders: int) -> bool:
    """Whether the dot-product pre-selection leaves any rider out (else rank them all)."""
    return take + _PRESELECT_MARGIN < num_riders


def _on_plane(xyz: NDArray[np.float64], frame: NDArray[np.float64]) -> NDArray[np.float64]:
    """[2, n]: points (unit vectors [n, 3]) projected on the plane of ``frame`` [3, 2] (its
    two axes), elementwise: a matrix product would wake OpenBLAS's threads for 3 columns."""
    axes = [np.outer(frame[axis], xyz[:, axis]) for axis in range(3)]
    return np.asarray(axes[0] + axes[1] + axes[2], dtype=np.float64)


def _rider_grid(
    riders_xyz: NDArray[np.float64], pickup_xyz: NDArray[np.float64]
) -> tuple[
    tuple[NDArray[np.float64], IntArray, IntArray],
    tuple[tuple[float, float, float], tuple[int, int]],
    NDArray[np.float64],
]:
    """The riders (unit vectors [m, 3]) bucketed for `window_kernels.largest_dots`: their
    coordinates in the plane through the sphere's centre parallel to the one touching it at
    their mean direction (its east and north axes, orthonormal), cut into square cells of
    about `_RIDERS_PER_CELL` riders. Returns (the riders sorted by cell, their rows, each
    cell's first), ((lowest u, lowest v, a cell's side), (cells along u, along v)) and the
    pickups' (unit vectors [b, 3]) coordinates in that plane [2, b]. One cell holds every
    rider where the orders are too few for the grid to pay (`_GRID_FROM`) or the riders all
    stand in one place."""
    count, num_orders = riders_xyz.shape[0], pickup_xyz.shape[0]
    rows = np.arange(count, dtype=np.int64)
    one_cell = (riders_xyz, rows, np.array([0, count], dtype=np.int64)), ((0.0, 0.0, 1.0), (1, 1))
    if num_orders * count < _GRID_FROM:
        return *one_cell, np.zeros((2, num_orders))  # any coordinates: the one cell
    centre = np.array([riders_xyz[:, axis].sum() for axis in range(3)])  # their sum
    if not centre.any():  # riders all around the earth, cancelling out: any plane serves
        centre = np.array([0.0, 0.0, 1.0])
    east = np.cross((0.0, 0.0, 1.0), centre)
    if not np.linalg.norm(east) > 1e-6 * np.linalg.norm(centre):  # at a pole
        east = np.cross((1.0, 0.0, 0.0), centre)
    east /= np.linalg.norm(east)
    north = np.cross(centre, east)
    north /= np.linalg.norm(north)
    frame = np.stack((east, north), axis=1)
    plane = _on_plane(riders_xyz, frame)
    low = plane.min(axis=1)
    span = plane.max(axis=1) - low
    side = max(
        float(np.sqrt(span[0] * span[1] * _RIDERS_PER_CELL / count)),
        float(span.max()) * _RIDERS_PER_CELL / count,
    )
    if not side > 0.0:
        return *one_cell, np.zeros((2, num_orders))
    cells = (span // side).astype(np.int64) + 1
    at = np.minimum(np.floor((plane - low[:, None]) / side).astype(np.int64), cells[:, None] - 1)
    cell = at[0] * cells[1] + at[1]
    rows = np.argsort(cell, kind="stable")
    start = np.zeros(int(cells[0] * cells[1]) + 1, dtype=np.int64)
    np.cumsum(np.bincount(cell, minlength=start.size - 1), out=start[1:])
    shape = ((float(low[0]), float(low[1]), side), (int(cells[0]), int(cells[1])))
    return (np.take(riders_xyz, rows, axis=0), rows, start), shape, _on_plane(pickup_xyz, frame)


def _nearest_among(
    pickup: NDArray[np.float64],
    pickup_xyz: NDArray[np.float64],
    riders: NDArray[np.float64],
    riders_xyz: NDArray[np.float64],
    take: int,
    *,
    keys: RiderKeys,
    threads: int = 1,
) -> IntArray:
    """Indices into ``riders`` of the ``take`` nearest per pickup, nearest first.

    A dot product of unit vectors ranks riders by great-circle distance; a compiled search
    over a grid of the riders (`_rider_grid`, `window_kernels.largest_dots`) keeps the best
    ``take + margin`` of each order and the best dot product it left out; those kept are
    ranked exactly by haversine
    with the rider id as tie-break (``keys``: `_exact_nearest`). An order is exact when its
    ``take``-th distance is strictly below a lower bound on every rider left out; the few
    orders where that cannot be shown (near-ties at the cut, co-located riders) are ranked
    exactly over all riders. Callers rank few riders exactly instead (`preselects`).
    Blocks of orders are independent: with ``threads`` > 1 they run on that many threads
    (same result).
    """
    num_orders, num_riders = pickup.shape[0], riders.shape[0]
    everyone = np.broadcast_to(np.arange(num_riders, dtype=np.int64), (num_orders, num_riders))
    keep = min(take + _PRESELECT_MARGIN, num_riders)

    chosen = np.empty((num_orders, take), dtype=np.int64)
    unproven = np.zeros(num_orders, dtype=np.bool_)
    block = max(1, _BLOCK_ELEMENTS // num_riders)

    grid_riders, grid, pickup_plane = _rider_grid(riders_xyz, pickup_xyz)

    def rank(start: int, stop: int) -> None:  # writes only rows start:stop of the outputs
        best = np.empty((stop - start, keep), dtype=np.int64)
        cut_dot = np.empty(stop - start)  # the largest dot product (nearest rider) left out
        window_kernels.largest_dots(
            (pickup_xyz[start:stop], pickup_plane[:, start:stop]),
            grid_riders,
            grid,
            (best, cut_dot),
        )
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
        # the compiled pre-selection, which dominates here, runs without the GIL
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
        riders = rider_feasible_for(window, bits).nonzero()[0]  # np.flatnonzero, unwrapped
        if riders.size == 0:
            continue
        take = min(n_eff, riders.size)
        pickup = window.pickup[orders]
        keys = rider_keys(window, riders)
        if not preselects(take, riders.size):  # few riders: rank them all exactly
            (out[orders, :take],) = ranked_exactly(
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
            keys=keys,
            threads=threads,
        )
        out[orders, :take] = riders[local]
    return out


def rider_keys(window: DispatchWindow, riders: IntArray) -> RiderKeys:
    """The id ranks of the window's riders at rows ``riders``, computed once when asked (a
    closure, not `functools.cache`: that costs a small window more than the ranking)."""
    found: list[IntArray] = []

    def keys() -> IntArray:
        if not found:
            found.append(id_rank(window.rider_ids[riders].tolist()))
        return found[0]

    return keys
