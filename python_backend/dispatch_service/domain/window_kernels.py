"""A window's per-value work outside the pair features, compiled with numba: the usual
window's value checks (`window_wire`), a one-order window's candidate ranking
(`pipeline.small_window.one_order_candidates`) and its Top-K list and assignment
(`pipeline.small_window.resolved_one_order`), a large window's candidate pre-selection
(`candidates._nearest_among`), the coverage's first assignment over the candidate lists
(`coverage._greedy`), the slot graph's edges (`slots.slot_edges`) and the stacked loads'
count of a rider's earlier orders (`stacking.joining_extra_load`).

Why: on a small window these were a few dozen numpy calls and Python comprehensions over a
handful of values, each a microsecond or so whatever its size (`perf.window_profile`
counts them); here each is one call. The pre-selection was a [B, R] matrix product and an
``np.argpartition`` over it (about 50 ms of CPU for 1,000 orders x 5,000 riders); here each
order compares the riders of the grid cells around its pickup, as far out as can matter.
The results are those of the code they replace, bit for bit: comparisons are IEEE
comparisons (False for NaN), the scores are `scoring.score_checked`'s operations in the
same order on float64 (no fused multiply-add, no reassociation: numba's default, not
``fastmath``), the ranking is a stable sort by the resolver's keys and float64 values are
rounded to float32 as numpy rounds them (tests/unit/domain/test_window_kernels.py compares
them with the Python rules). The
pre-selection's dot products may differ from OpenBLAS's in the last bits, and of riders
equally near at its cut it may keep another: neither changes a candidate list, which the
exact ranking after it either proves or redoes over every rider.

The kernels are compiled like `pair_kernels`' (explicit signatures, numba's on-disk
cache), so a model pays for them at load, never on a request; their helpers are inlined
into them. Loading them from the cache costs a stub that imports them about 25 ms of CPU.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np

from dispatch_service.domain.kernel_types import F4_2D, F8, F8_2D, I4, I8, U8, compiled, inlined
from dispatch_service.domain.kernel_types import numba_types as _types
from dispatch_service.domain.pair_kernels import haversine

__all__ = [
    "ANSWERED",
    "NOT_USABLE",
    "TIED",
    "largest_dots",
    "nearest_first",
    "one_order_answer",
    "orders_before",
    "proposal_rounds",
    "slot_copies",
    "usual_values",
]

# `one_order_answer`'s outcomes.
ANSWERED: Final = 0
NOT_USABLE: Final = 1  # an objective out of its range (or NaN): the resolver names it
TIED: Final = 2  # an exact tie for the best usable rider: the solver decides

# (low [C], high [C], whole-number columns [W]) of a packed matrix
_BOUNDS: Final = _types.Tuple((F8, F8, I8))


@inlined
def _within(matrix: Any, bounds: Any, capped: int, cap: float) -> bool:
    """Whether every value of ``matrix`` [n, C] lies in its column's [low, high] (column
    ``capped`` also <= ``cap``) and every whole-number column holds whole numbers."""
    low, high, whole = bounds
    rows, columns = matrix.shape
    for i in range(rows):
        for c in range(columns):
            value = matrix[i, c]
            top = min(high[c], cap) if c == capped else high[c]
            if not (value >= low[c] and value <= top):  # False for NaN
                return False
        for w in range(whole.shape[0]):
            value = matrix[i, whole[w]]
            if value != np.floor(value):
                return False
    return True


# (created_at's column and its latest value, the constraints' column and the known bits)
_LIMITS: Final = _types.Tuple((_types.intp, _types.float64, _types.intp, _types.int64))


@compiled(_types.boolean(F8_2D, _BOUNDS, F8_2D, _BOUNDS, _LIMITS))
def usual_values(
    orders: Any, order_bounds: Any, riders: Any, rider_bounds: Any, limits: Any
) -> bool:
    """Whether the packed ORDER_FIELDS and RIDER_FIELDS of a usual window hold only values
    within their columns' bounds (created_at's column also at most its latest value),
    whole numbers in their whole-number columns and constraint bits within the known ones
    (``limits``: `_LIMITS`): the checks `window_wire._usual_window` made with numpy, each
    value compared as they compared it."""
    created_at, latest_created, constraints, known_constraints = limits
    if not _within(orders, order_bounds, created_at, latest_created):
        return False
    if not _within(riders, rider_bounds, -1, 0.0):
        return False
    for i in range(orders.shape[0]):  # whole and within [0, known]: exact as integers
        if np.int64(orders[i, constraints]) & ~known_constraints:
            return False
    return True


@inlined
def _clipped(value: float) -> float:
    """numpy's clip(value, 0, 1) of a finite float (max, then min)."""
    value = value if value > 0.0 else 0.0
    return value if value < 1.0 else 1.0


@inlined
def _ranks_before(keys: Any, x: int, y: int) -> bool:
    """Whether position ``x`` comes strictly before ``y``, both listed riders or both pads,
    by the resolver's Top-K keys after validity (``keys``: score, ETA, on-time, cost, id
    hash, row; a pad's row is R): score descending, ETA ascending, on-time descending, cost
    ascending, id hash, row. The first key that differs decides, as Python compares
    tuples."""
    score, eta, ontime, cost, rider_hash, row = keys
    if score[x] != score[y]:
        return bool(score[x] > score[y])
    if eta[x] != eta[y]:
        return bool(eta[x] < eta[y])
    if ontime[x] != ontime[y]:
        return bool(ontime[x] > ontime[y])
    if cost[x] != cost[y]:
        return bool(cost[x] < cost[y])
    if rider_hash[x] != rider_hash[y]:
        return bool(rider_hash[x] < rider_hash[y])
    return bool(row[x] < row[y])


# (TOPK_RIDER_INDEX [1, K], TOPK_OBJECTIVES [1, K, 4], ASSIGNED_RIDER_INDEX [1],
# ASSIGNED_SCORE [1], ASSIGNED_OBJECTIVES [1, 3])
_ANSWER: Final = _types.Tuple(
    (
        _types.int32[:, :],
        _types.float32[:, :, :],
        _types.int32[:],
        _types.float32[:],
        _types.float32[:, :],
    )
)


@compiled(
    _types.int64(
        _types.Tuple((I4, F4_2D, U8)),
        _types.Tuple((I4, I4)),
        _types.UniTuple(_types.float64, 6),
        _ANSWER,
    )
)
def one_order_answer(candidates: Any, counts: Any, scoring: Any, out: Any) -> int:
    """One order's Top-K list and assignment into ``out`` (`_ANSWER`; K its width, at most
    the candidates' N). ``candidates``: (rows [N] its candidates' rider rows, -1 pads;
    objectives [N, 3] their ETA, on-time, cost; rider_hash [N] their id hashes, 0 for a
    pad); ``counts``: every rider's (load, capacity); ``scoring``: (the weights of ETA,
    on-time and cost, the weights' sum, the ETA and cost scales).

    A pad's objectives read 0; each score is `scoring.score_checked`'s
    ``w . (1 / (1 + eta / scale), clip(p, 0, 1), 1 / (1 + cost / scale)) / sum(w)``; the
    list holds the listed riders first, then the pads, each part ranked by `_ranks_before`;
    the assigned rider is the best usable one (listed, with room left), when strictly
    cheaper (2 - score) than every other usable one. The assigned values are the
    resolver's sums over the order's row (+0.0 added to each, nothing on a row of one).
    Returns `ANSWERED`, or `NOT_USABLE` / `TIED` with ``out`` unwritten."""
    rows, objectives, rider_hash = candidates
    w_eta, w_ontime, w_cost, total_weight, eta_scale, cost_scale = scoring
    load, capacity = counts
    topk_index, topk_objectives, assigned, assigned_score, assigned_objectives = out
    width = rows.shape[0]
    num_riders = load.shape[0]
    score, eta = np.zeros(width), np.zeros(width)
    ontime, cost = np.zeros(width), np.zeros(width)
    tie = np.empty(width, dtype=np.int64)  # the row, a pad's R (after every rider row)
    for j in range(width):
        tie[j] = rows[j] if rows[j] >= 0 else num_riders
        if rows[j] < 0:
            continue
        e = np.float64(objectives[j, 0])
        p = np.float64(objectives[j, 1])
        c = np.float64(objectives[j, 2])
        if not (0.0 <= e < math.inf and 0.0 <= c < math.inf and -math.inf < p < math.inf):
            return NOT_USABLE
        eta[j], ontime[j], cost[j] = e, p, c
        score[j] = (
            w_eta * (1.0 / (1.0 + e / eta_scale))
            + w_ontime * _clipped(p)
            + w_cost * (1.0 / (1.0 + c / cost_scale))
        ) / total_weight
    keys = (score, eta, ontime, cost, rider_hash, tie)
    order = np.arange(width)
    for j in range(1, width):  # a stable insertion sort: equal keys keep their order
        moving = order[j]
        at = j
        while at > 0 and (
            rows[order[at - 1]] < 0 <= rows[moving]  # valid before a pad
            or (
                (rows[moving] < 0) == (rows[order[at - 1]] < 0)
                and _ranks_before(keys, moving, order[at - 1])
            )
        ):
            order[at] = order[at - 1]
            at -= 1
        order[at] = moving
    best = -1
    lowest = math.inf
    ties = 0
    for j in order:
        row = rows[j]
        if row < 0 or capacity[row] <= load[row]:
            continue
        cost_of = 2.0 - score[j]
        if best < 0 or cost_of < lowest:
            best, lowest, ties = j, cost_of, 1
        elif cost_of == lowest:
            ties += 1
    if ties > 1:
        return TIED
    for i in range(topk_index.shape[1]):
        j = order[i]
        topk_index[0, i] = rows[j]
        topk_objectives[0, i, 0] = score[j]
        topk_objectives[0, i, 1] = eta[j]
        topk_objectives[0, i, 2] = ontime[j]
        topk_objectives[0, i, 3] = cost[j]
    zero = 0.0 if width > 1 else -0.0
    if best >= 0:
        assigned[0] = rows[best]
        assigned_score[0] = score[best] + zero
        assigned_objectives[0, 0] = eta[best] + zero
        assigned_objectives[0, 1] = ontime[best] + zero
        assigned_objectives[0, 2] = cost[best] + zero
    else:
        assigned[0] = -1
        assigned_score[0] = 0.0
        for column in range(3):
            assigned_objectives[0, column] = 0.0 + zero
    return ANSWERED


@compiled(
    _types.boolean(
        _types.Tuple((I8, F8_2D)),
        _types.Tuple((F8_2D, _types.intp)),
        _types.float64,
        _types.int32[:],
    )
)
def nearest_first(riders: Any, pickup: Any, radius: float, out: Any) -> bool:
    """The ``out.shape[0]`` nearest of ``riders`` (rows [m] into positions [R, 2]) to one
    pickup (pickups [B, 2], its row) into ``out``, nearest first, by `geo.haversine_km`'s
    distances (`pair_kernels.pair_distances`' values); False with ``out`` unwritten when
    two riders are equally far (their ids then decide: `candidates.ranked_exactly`)."""
    rows, positions = riders
    pickups, at = pickup
    count = rows.shape[0]
    km = np.empty(count)
    for i in range(count):
        lat, lon = positions[rows[i], 0], positions[rows[i], 1]
        km[i] = haversine(lat, lon, pickups[at, 0], pickups[at, 1], radius)
    order = np.arange(count)
    for j in range(1, count):  # insertion sort by distance
        moving = order[j]
        position = j
        while position > 0 and km[moving] < km[order[position - 1]]:
            order[position] = order[position - 1]
            position -= 1
        order[position] = moving
    for j in range(1, count):
        if km[order[j]] == km[order[j - 1]]:
            return False
    for j in range(out.shape[0]):
        out[j] = rows[order[j]]
    return True


# What a dot product of two unit vectors built from lat/lon may exceed the bound that
# `largest_dots` derives from their distance in the grid's plane by: their squared norms
# are 1 within a few ulp, the plane's axes orthonormal within a few ulp, the projections
# and the cells' edges rounded (each error below 1e-15). Far below any gap between two
# riders' dot products that the exact ranking after it has to resolve.
_DOT_SLACK: Final = 1e-12

# (unit vectors [m, 3], their rows [m], each cell's first rider [C + 1]: the riders sorted
# by cell, cell i * columns + j holding those at [start[c], start[c + 1]))
_GRID_RIDERS: Final = _types.Tuple((F8_2D, I8, I8))
# (the plane's lowest coordinates (2), a cell's side, rows and columns of cells)
_GRID_SHAPE: Final = _types.Tuple(
    (_types.UniTuple(_types.float64, 3), _types.UniTuple(_types.intp, 2))
)


@inlined
def _cell(coordinate: float, low: float, side: float, cells: int) -> int:
    """The cell of a plane coordinate along one axis, clamped to the grid."""
    at = math.floor((coordinate - low) / side)
    return int(min(max(at, 0), cells - 1))


@compiled(
    _types.void(
        _types.Tuple((F8_2D, F8_2D)),
        _GRID_RIDERS,
        _GRID_SHAPE,
        _types.Tuple((_types.int64[:, :], _types.float64[:])),
    )
)
def largest_dots(pickups: Any, riders: Any, grid: Any, out: Any) -> None:
    """Per pickup the ``keep`` riders of the largest dot products of unit vectors into
    ``best`` [b, keep] in no set order, and the largest dot product of a rider left out into
    ``cut`` [b] (``out``: (best, cut)): `candidates._nearest_among`'s pre-selection by
    great-circle distance. ``pickups``: (unit vectors [b, 3], their coordinates [2, b] in
    the grid's plane); ``riders`` (more than ``keep``) and ``grid``: the riders bucketed on a
    square grid in a plane through the sphere's centre (`_GRID_RIDERS`, `_GRID_SHAPE`;
    `candidates._rider_grid`).

    Each pickup visits the cells in rings around its own, keeping its ``keep + 1`` largest
    dot products so far in descending order. A rider outside the rings visited lies at
    least ``gap`` from the pickup in the plane (an orthonormal projection), so at least that
    far on the sphere, so its dot product is at most ``1 - gap**2 / 2``: once that bound
    (plus `_DOT_SLACK`) is at most the ``keep + 1``-th largest kept, no rider left can
    enter or raise the cut, and the search stops. The result is that of comparing every
    dot product (of riders equally near at the cut, either may be kept)."""
    points, plane = pickups
    unit, rows, start = riders
    (low_u, low_v, side), (cells_u, cells_v) = grid
    best, cut = out
    keep = best.shape[1]
    top = np.empty(keep + 1)
    index = np.empty(keep + 1, dtype=np.int64)
    for b in range(points.shape[0]):
        x, y, z = points[b, 0], points[b, 1], points[b, 2]
        u, v = plane[0, b], plane[1, b]
        home_u = _cell(u, low_u, side, cells_u)
        home_v = _cell(v, low_v, side, cells_v)
        filled = 0
        ring = 0
        while True:
            first_u, last_u = home_u - ring, home_u + ring
            first_v, last_v = home_v - ring, home_v + ring
            for i in range(max(first_u, 0), min(last_u, cells_u - 1) + 1):
                edge = i == first_u or i == last_u  # a whole row of the ring, else its ends
                step = 1 if edge else max(last_v - first_v, 1)
                for j in range(first_v, last_v + 1, step):
                    if j < 0 or j >= cells_v:
                        continue
                    cell = i * cells_v + j
                    for r in range(start[cell], start[cell + 1]):
                        dot = x * unit[r, 0] + y * unit[r, 1] + z * unit[r, 2]
                        if filled <= keep:
                            slot = filled
                            filled += 1
                        elif dot > top[keep]:
                            slot = keep
                        else:
                            continue
                        while slot > 0 and dot > top[slot - 1]:
                            top[slot], index[slot] = top[slot - 1], index[slot - 1]
                            slot -= 1
                        top[slot], index[slot] = dot, rows[r]
            gap = math.inf  # from the pickup to the nearest edge with cells beyond it
            if first_u > 0:
                gap = min(gap, u - (low_u + first_u * side))
            if last_u < cells_u - 1:
                gap = min(gap, low_u + (last_u + 1) * side - u)
            if first_v > 0:
                gap = min(gap, v - (low_v + first_v * side))
            if last_v < cells_v - 1:
                gap = min(gap, low_v + (last_v + 1) * side - v)
            if gap == math.inf:
                break  # every cell visited
            gap = max(gap, 0.0)
            if filled > keep and 1.0 - 0.5 * gap * gap + _DOT_SLACK <= top[keep]:
                break
            ring += 1
        for j in range(keep):
            best[b, j] = index[j]
        cut[b] = top[keep]


@compiled(_types.void(I8, _types.Tuple((I8, I8)), _types.UniTuple(_types.int64[:], 3)))
def slot_copies(edge_rider: Any, riders: Any, out: Any) -> None:
    """`slots.slot_edges`' copies: each edge e (to rider ``edge_rider[e]``) once per slot of
    its rider (``riders``: every rider's slot count and first slot column), in edge order,
    into ``out``: (the edge each copy is of, its slot column, that slot's rank)."""
    slots, first_slot = riders
    edge, column, rank = out
    at = 0
    for e in range(edge_rider.shape[0]):
        rider = edge_rider[e]
        for k in range(slots[rider]):
            edge[at], column[at], rank[at] = e, first_slot[rider] + k, k
            at += 1


@compiled(_types.void(I8, I8, _types.Tuple((I8, I8)), _types.int64[:]))
def orders_before(rank: Any, assigned: Any, pairs: Any, out: Any) -> None:
    """`stacking.joining_extra_load`'s count: for each pair p (order ``pairs[0][p]``, rider
    ``pairs[1][p]``) how many orders assigned to that rider (``assigned`` [B]: rider row or
    -1) come before the order (``rank`` [B]: each order's place in the riding order), into
    ``out`` [P]. The assigned orders are listed rider by rider first (a rider holds a few),
    so each pair reads only its rider's."""
    riders = 0
    for b in range(assigned.shape[0]):
        riders = max(riders, assigned[b] + 1)
    first = np.zeros(riders + 1, dtype=np.int64)
    for b in range(assigned.shape[0]):
        if assigned[b] >= 0:
            first[assigned[b] + 1] += 1
    for r in range(riders):
        first[r + 1] += first[r]
    ranks = np.empty(first[riders], dtype=np.int64)
    filled = first[:riders].copy()
    for b in range(assigned.shape[0]):
        rider = assigned[b]
        if rider >= 0:
            ranks[filled[rider]] = rank[b]
            filled[rider] += 1
    orders, pair_riders = pairs
    for p in range(out.shape[0]):
        rider, mine = pair_riders[p], rank[orders[p]]
        count = 0
        if 0 <= rider < riders:
            for i in range(first[rider], first[rider + 1]):
                count += 1 if ranks[i] < mine else 0
        out[p] = count


@compiled(
    _types.void(
        _types.Array(_types.int32, 2, "A", readonly=True), I8, _types.int64[:], _types.int64[:]
    )
)
def proposal_rounds(candidates: Any, spare: Any, left: Any, rider_of: Any) -> None:
    """`coverage._greedy`'s rounds into ``rider_of`` [B] (-1 = none; ``left`` [R]: scratch):
    in round k every order still without a rider proposes to its k-th candidate, an order
    whose list has ended drops out, and each rider accepts its lowest-numbered proposers
    while it has slots left. Taking the proposals of a round in row order accepts exactly
    those (a proposer is accepted iff fewer than the rider's slots at the round's start
    proposed before it)."""
    orders, width = candidates.shape
    for r in range(spare.shape[0]):
        left[r] = spare[r]
    pending = np.empty(orders, dtype=np.int64)
    for b in range(orders):
        rider_of[b] = -1
        pending[b] = b
    count = orders
    for k in range(width):
        kept = 0
        for i in range(count):
            b = pending[i]
            rider = candidates[b, k]
            if rider < 0:
                continue  # its list has ended
            if left[rider] > 0:
                left[rider] -= 1
                rider_of[b] = rider
            else:
                pending[kept] = b
                kept += 1
        count = kept
        if count == 0:
            return
