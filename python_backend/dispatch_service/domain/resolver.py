"""The `topk_resolver` step: rank each order's candidates, keep the Top-K, assign riders.

Plain numpy/scipy so the Triton Python backend, offline tools and tests share one code
path. The inputs come from upstream models, not from the caller, yet a bad tensor must
end one request with a `DispatchInputError` that names it, never crash the model.

Scoring
    Each objective is mapped to a utility that depends on that pair alone (never on the
    rest of the window, so an order's ranking cannot change because another order
    arrived) and is monotone: latency ``1 / (1 + eta / eta_scale)``, on-time
    ``clip(p, 0, 1)``, cost ``1 / (1 + cost / cost_scale)``. The score is
    ``sum(w * u) / sum(w)``, in [0, 1]. Rounding is monotone, so if pair a is at least
    as good as pair b on every objective its computed score is >= b's.

Ranking
    Candidates of one order sort by score descending, then ETA ascending, on-time
    descending, cost ascending, then a 64-bit FNV-1a hash of the rider id, then the rider
    id. The objective tie-breaks make the order Pareto-consistent even when a weight is
    zero: a pair that dominates another has a score at least as high, and on equal scores
    the first objective where they differ favours it. The id hash spreads exact ties over
    riders deterministically across processes (Python's ``hash()`` is salted); the id itself
    (`ids.id_rank`) settles a hash collision, so no position ever decides. The
    Top-K list is the first ``min(top_k, N)`` valid candidates, padded with index -1, id
    b'' and zeros.

Assignment
    The assignment is made over *every* valid candidate of every order (all N columns of
    ``CANDIDATE_RIDER_INDEX``, N = ``candidates_per_order``), not over the Top-K lists:
    Top-K is only the ranked list in the answer. Cutting to Top-K first loses orders where
    riders are scarce (issue 12: 249 unassigned vs 10 for the exact optimum at 64 x 64),
    so the assigned rider of an order may sit outside its Top-K list.
    Each order gets at most one of its candidates, and rider r at most
    ``spare_r = max(capacity_r - load_r, 0)`` new orders. The objective is
    lexicographic: first the number of assigned orders, then the sum of their scores.
    It is solved as a minimum-cost full matching of a sparse bipartite graph with
    ``scipy.sparse.csgraph.min_weight_full_bipartite_matching`` (LAPJVsp):

    * one row per order that has a candidate;
    * ``c_r = min(spare_r, deg_r)`` interchangeable slot columns for rider r (`slots`), where
      ``deg_r`` is the number of candidate lists naming r (r can never take more than
      that); order b links to every slot of every rider in its list at cost ``2 - s_br``,
      in [1, 2] so that no cost is an explicit zero, which sparse matrices drop;
    * one private "unassigned" column per order, at cost ``D = 2B + 3`` from its order,
      unless a matching serves every order that has a usable candidate (Hopcroft-Karp,
      cheap): then no maximum-cardinality matching leaves one of them out, so those edges
      are left out and every full matching is a maximum-cardinality assignment;
    * for a big window scored by slot rank (`pipeline.stacking`) with ample riders, one
      "unused" row per slot, linked at cost 1 to its own slot and to the unassigned column
      of every order that lists the slot's rider (the unassigned columns are then always
      there). It makes the graph square: on a non-square graph LAPJVsp skips its cheap
      initial assignment and runs a shortest-path search per order, each scanning every
      column (1,000 x 5,000 stack-aware: 10.9 -> 3.4 ms per solve). That initial assignment
      thrashes where riders are tight or some order must stay unassigned (up to 1,000 times
      slower), and ties across a rider's slots (plain scores) slow it down, so those graphs,
      and small ones, stay rectangular (`_SQUARE_FROM`).

    Why this is optimal: the orders' part of a full matching is a feasible assignment (each
    slot column is matched at most once), and every feasible assignment completes to a full
    matching (in the square graph, an unused slot takes its own row and a used slot's row
    the unassigned column of the order that took it); slot rows, if any, pay a constant 1
    each. Assignments and full matchings thus correspond up to permuting a rider's
    identical slots, and a full matching always exists. One that assigns m of the B' orders with
    score sum S costs ``const + B'*D - m*(D - 2) - S``. Since ``0 <= S <= m <= B' <= B``
    and ``D - 2 > B``, one more assigned order always lowers the cost by more than any
    difference in S can raise it, so the minimum-cost matching has the most assigned
    orders and, among those, the largest score sum. LAPJVsp is an exact
    shortest-augmenting-path solver, so the matching it returns is optimal; it is also
    deterministic for a given graph. Where two optimal assignments tie exactly (equal scores
    are common: clamped model outputs, co-located riders), which one it returns depends on
    the order of the graph's rows and columns, so the graph is built with the orders in
    order-id order and the listed riders in rider-id order (`ids.id_order`), then mapped
    back to rows: the assignment is a function of the window as a set, not of how the caller
    listed it. Without ORDER_IDS the orders keep their rows.
    Ranking and matching use the float64 scores; the outputs round them to float32.
    The whole window is one solver call: augmenting-path searches only reach their own
    connected component anyway, and splitting into components first (hundreds of them in
    a city-sized window) cost more in per-call overhead than it saved.
    The graph depends only on the candidates and the spare capacity (`AssignmentGraph`),
    the costs on the scores; a slot's cost may also depend on its rank among its rider's
    slots (`AssignmentGraph.solve_ranked`), which is how `pipeline.stacking` prices a
    rider's second and later new orders in the same exact solve.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching, min_weight_full_bipartite_matching

from dispatch_contract import (
    ASSIGNED_OBJECTIVES,
    CANDIDATE_RIDER_INDEX,
    DISPATCH_OUTPUTS,
    OBJECTIVES,
    PAIR_OBJECTIVES,
    TOPK_OBJECTIVES,
)
from dispatch_service.core.batches import split_rows
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.feasibility import spare_slots
from dispatch_service.domain.ids import id_order, id_rank
from dispatch_service.domain.slots import slot_edges
from dispatch_service.domain.window import check_objective_weights

__all__ = [
    "AssignmentGraph",
    "Resolution",
    "ResolverSettings",
    "ResolverWindow",
    "WindowTensors",
    "assign",
    "checked_order_ids",
    "checked_together",
    "fnv1a_64",
    "ids_as_bytes",
    "resolve",
    "resolve_many",
    "score_pairs",
]

_FNV_OFFSET: Final = np.uint64(0xCBF29CE484222325)
_FNV_PRIME: Final = np.uint64(0x100000001B3)
_FNV_MASK: Final = (1 << 64) - 1
# Up to this many id bytes in all a plain Python loop beats the per-column numpy passes.
_FNV_SCALAR_BYTES: Final = 256
# Rider ids recur from window to window; their hashes are kept up to this many entries.
_HASH_CACHE_SIZE: Final = 1 << 15
_hash_cache: dict[bytes, int] = {}

_ETA, _ONTIME, _COST = range(len(OBJECTIVES))
# A solve by slot rank uses the square graph (module docstring) from this many order rows x
# slot columns on, when every order can be served and there are at least _SQUARE_SLACK slots
# per order. Measured stack-aware, rectangular vs square (ms): 256 x 800 windows 6.5 vs 5.1,
# 1,000 x 2,000 (2.2 slots per order) 24-25 vs 20-21, 1,000 x 5,000 26.8 vs 21.3. Where riders
# are tight the square graph's initial assignment thrashes: 1,000 x 1,200 (1.4 slots per
# order) 30-36 vs 98-469, 1,000 x 1,000 37-40 vs 173-501, and with unassigned edges (cost
# 2B + 3) 1,000 x 400 took 0.08 vs 57 s. With plain scores a rider's slots tie, and the square
# graph was slower at every size.
_SQUARE_FROM: Final = 1 << 17
_SQUARE_SLACK: Final = 2


@dataclass(frozen=True)
class ResolverSettings:
    """Server-side knobs; the scales set where a utility falls to one half."""

    top_k: int = 5
    eta_scale_minutes: float = 30.0
    cost_scale_cny: float = 10.0

    def __post_init__(self) -> None:
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
            raise ValueError(f"top_k must be a positive int, got {self.top_k!r}")
        for name in ("eta_scale_minutes", "cost_scale_cny"):
            value = float(getattr(self, name))
            if not np.isfinite(value) or value <= 0.0:
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")


@dataclass(frozen=True, eq=False)
class Resolution:
    """The resolver's answer, one field per contract output (eq=False: arrays inside)."""

    topk_rider_ids: NDArray[np.object_]
    topk_rider_index: NDArray[np.int32]
    topk_score: NDArray[np.float32]
    topk_eta_minutes: NDArray[np.float32]
    topk_ontime_probability: NDArray[np.float32]
    topk_cost: NDArray[np.float32]
    assigned_rider_ids: NDArray[np.object_]
    assigned_rider_index: NDArray[np.int32]
    assigned_score: NDArray[np.float32]
    # [B, 3] OBJECTIVES of the assigned pair (0 = unassigned): its rider may be off the list
    assigned_objectives: NDArray[np.float32]

    def as_tensors(self) -> dict[str, NDArray[Any]]:
        """The outputs keyed by contract name, in the contract's dtypes."""
        return {
            spec.name: np.asarray(getattr(self, spec.name.lower()), dtype=spec.numpy_dtype)
            for spec in DISPATCH_OUTPUTS
        }

    def as_wire_tensors(self) -> dict[str, NDArray[Any]]:
        """The v2 answer (`RESOLVER_OUTPUTS`): indices and objective matrices, no ids."""
        return {
            "TOPK_RIDER_INDEX": self.topk_rider_index,
            TOPK_OBJECTIVES.name: np.stack(
                (
                    self.topk_score,
                    self.topk_eta_minutes,
                    self.topk_ontime_probability,
                    self.topk_cost,
                ),
                axis=-1,
            ).astype(np.float32),
            "ASSIGNED_RIDER_INDEX": self.assigned_rider_index,
            "ASSIGNED_SCORE": self.assigned_score,
            ASSIGNED_OBJECTIVES.name: self.assigned_objectives,
        }


# ---- stable rider-id hash ------------------------------------------------------------


def fnv1a_64(ids: Iterable[bytes]) -> NDArray[np.uint64]:
    """64-bit FNV-1a of each id: a tie-break that is identical in every process.

    Vectorised over ids; the Python loop runs over byte positions (at most the longest
    id, 64 under the contract), masking ids that are already finished.
    """
    items = list(ids)
    count = len(items)
    if sum(map(len, items)) <= _FNV_SCALAR_BYTES:
        return np.fromiter(map(_fnv1a_scalar, items), dtype=np.uint64, count=count)
    out = np.full(count, _FNV_OFFSET, dtype=np.uint64)
    lengths = np.fromiter((len(item) for item in items), dtype=np.int64, count=count)
    width = int(lengths.max())
    if width == 0:
        return out
    # 'S' pads with NUL bytes; real trailing NULs survive in the buffer, and the mask
    # comes from the true lengths, so they are hashed too.
    raw = np.array(items, dtype=f"S{width}").view(np.uint8).reshape(count, width)
    for column in range(width):
        live = lengths > column
        mixed = (out ^ raw[:, column].astype(np.uint64)) * _FNV_PRIME  # wraps mod 2**64
        np.copyto(out, mixed, where=live)
    return out


def _fnv1a_scalar(item: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in item:
        value = ((value ^ byte) * 0x100000001B3) & _FNV_MASK
    return value


def _rider_hashes(ids: list[bytes]) -> NDArray[np.uint64]:
    """`fnv1a_64` through a bounded cache: most riders were hashed in an earlier window."""
    cache = _hash_cache
    found = list(map(cache.get, ids))
    if None in found:
        missing = [item for item, value in zip(ids, found, strict=True) if value is None]
        fresh = dict(zip(missing, fnv1a_64(missing).tolist(), strict=True))
        found = [
            fresh[item] if value is None else value for item, value in zip(ids, found, strict=True)
        ]
        if len(cache) + len(fresh) > _HASH_CACHE_SIZE:
            cache.clear()
        cache.update(fresh)
    return np.array(found, dtype=np.uint64)


# ---- scoring -------------------------------------------------------------------------


def _weights(weights: ArrayLike) -> NDArray[np.float64]:
    try:
        array = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError):
        raise DispatchInputError("OBJECTIVE_WEIGHTS", "must be numeric", "dtype") from None
    return check_objective_weights(array)


def score_pairs(
    objectives: ArrayLike,
    weights: ArrayLike,
    settings: ResolverSettings | None = None,
) -> NDArray[np.float64]:
    """Weighted utility of each pair, shape ``objectives.shape[:-1]``, in [0, 1].

    Each term uses only its own pair's value, so scores are comparable across windows.
    Evaluated in float64 with a fixed operation order: every step is monotone, so
    dominance is never reversed by rounding.
    """
    settings = settings or ResolverSettings()
    w = _weights(weights)
    obj = np.asarray(objectives, dtype=np.float64)
    if obj.ndim < 1 or obj.shape[-1] != len(OBJECTIVES):
        raise DispatchInputError(
            PAIR_OBJECTIVES.name,
            f"must have {len(OBJECTIVES)} columns, got shape {obj.shape}",
            "shape",
        )
    return _score(obj, w, settings)


def _score(
    obj: NDArray[np.float64], w: NDArray[np.float64], settings: ResolverSettings
) -> NDArray[np.float64]:
    """`score_pairs` on inputs already checked (resolve validates them once). ``w``: [3],
    or one row per order ([B, 1, 3] for objectives [B, N, 3]: `resolve_many`); the same
    arithmetic either way, element by element."""
    latency = 1.0 / (1.0 + obj[..., _ETA] / settings.eta_scale_minutes)
    ontime = np.clip(obj[..., _ONTIME], 0.0, 1.0)
    cost = 1.0 / (1.0 + obj[..., _COST] / settings.cost_scale_cny)
    total = w[..., 0] * latency + w[..., 1] * ontime + w[..., 2] * cost
    result: NDArray[np.float64] = total / w.sum(axis=-1)
    return result


# ---- validation ----------------------------------------------------------------------


def _first_row(mask: NDArray[np.bool_]) -> int:
    return int(np.argwhere(mask)[0][0])


def _candidates(
    value: ArrayLike, num_riders: int, name: str = CANDIDATE_RIDER_INDEX.name
) -> NDArray[np.int64]:
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise DispatchInputError(name, f"must be INT32, got {array.dtype}", "dtype")
    if array.ndim != 2:
        raise DispatchInputError(name, f"must have shape [B, N], got {array.shape}", "shape")
    index = array.astype(np.int64)
    bad = (index < -1) | (index >= num_riders)
    if bad.any():
        b, j = (int(x) for x in np.argwhere(bad)[0])
        raise DispatchInputError(
            name,
            f"must be -1 or a rider row in [0, {num_riders}), got {index[b, j]} at [{b}, {j}]",
            "range",
        )
    if index.shape[1] > 1:
        ordered = np.sort(index, axis=1)
        repeated = (ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)
        if repeated.any():
            b = _first_row(repeated)
            raise DispatchInputError(name, f"order {b} lists a rider more than once", "unique")
    return index


def _objectives(value: ArrayLike, valid: NDArray[np.bool_]) -> NDArray[np.float64]:
    """[B, N, 3] float64 with the rows of missing candidates zeroed."""
    name = PAIR_OBJECTIVES.name
    array = np.asarray(value)
    if array.dtype.kind != "f":
        raise DispatchInputError(name, f"must be FP32, got {array.dtype}", "dtype")
    if array.ndim != 2 or array.shape[1] != len(OBJECTIVES):
        raise DispatchInputError(
            name, f"must have shape [P, {len(OBJECTIVES)}], got {array.shape}", "shape"
        )
    num_orders, num_candidates = valid.shape
    pairs = num_orders * num_candidates
    if array.shape[0] != pairs:
        raise DispatchInputError(
            name,
            f"must have B*N = {num_orders}*{num_candidates} = {pairs} rows "
            f"like {CANDIDATE_RIDER_INDEX.name}, got {array.shape[0]}",
            "shape",
        )
    obj = array.astype(np.float64).reshape(num_orders, num_candidates, len(OBJECTIVES))
    obj[~valid] = 0.0  # zeros pass every check below
    _check_pairs(obj.reshape(pairs, len(OBJECTIVES)), np.arange(pairs))
    return obj


def _check_pairs(values: NDArray[np.float64], rows: NDArray[np.int64]) -> None:
    """Objectives [n, 3] of valid pairs, at PAIR_OBJECTIVES rows ``rows`` (ascending)."""
    name = PAIR_OBJECTIVES.name
    bad = ~np.isfinite(values).all(axis=1)
    if bad.any():
        raise DispatchInputError(
            name,
            f"must be finite on valid pairs, got NaN or infinity (row {rows[_first_row(bad)]})",
            "not_finite",
        )
    for column, label in ((_ETA, "ETA minutes"), (_COST, "cost")):
        negative = values[:, column] < 0
        if negative.any():
            raise DispatchInputError(
                name,
                f"{label} must be >= 0 on valid pairs (row {rows[_first_row(negative)]})",
                "range",
            )


def _counts(name: str, value: ArrayLike, num_riders: int) -> NDArray[np.int64]:
    array = np.asarray(value)
    if array.dtype.kind not in "iu":
        raise DispatchInputError(name, f"must be INT32, got {array.dtype}", "dtype")
    if array.shape != (num_riders,):
        raise DispatchInputError(
            name, f"must have shape [{num_riders}] like RIDER_IDS, got {array.shape}", "shape"
        )
    counts = array.astype(np.int64)
    negative = counts < 0
    if negative.any():
        row = _first_row(negative)
        raise DispatchInputError(name, f"must be >= 0 (row {row})", "range")
    return counts


def _rider_ids(value: ArrayLike) -> NDArray[Any]:
    array = np.asarray(value)
    if array.dtype.kind not in "OS":
        raise DispatchInputError("RIDER_IDS", f"must be BYTES, got {array.dtype}", "dtype")
    if array.ndim != 1:
        raise DispatchInputError("RIDER_IDS", f"must have shape [R], got {array.shape}", "shape")
    return array


def checked_order_ids(value: ArrayLike, num_orders: int) -> NDArray[Any]:
    """ORDER_IDS as the resolver takes them: BYTES [B], one per order of the candidates
    (the encoder checked their content; here they only break ties)."""
    array = np.asarray(value)
    if array.dtype.kind not in "OS":
        raise DispatchInputError("ORDER_IDS", f"must be BYTES, got {array.dtype}", "dtype")
    if array.shape != (num_orders,):
        raise DispatchInputError(
            "ORDER_IDS",
            f"must have shape [{num_orders}], one per order of {CANDIDATE_RIDER_INDEX.name}, "
            f"got {list(array.shape)}",
            "shape",
        )
    return array


def ids_as_bytes(name: str, ids: ArrayLike, rows: NDArray[np.int64] | None = None) -> list[bytes]:
    """The ids of tensor `name` (all, or the given rows) as bytes: str is UTF-8 encoded,
    anything else is refused naming the tensor and the row."""
    array = np.asarray(ids, dtype=object).reshape(-1)
    numbers = range(array.size) if rows is None else rows.tolist()
    items = array.tolist() if rows is None else array[rows].tolist()
    if set(map(type, items)) <= {bytes}:  # the usual case, without a Python-level loop
        return items  # type: ignore[no-any-return]
    out: list[bytes] = []
    for row, item in zip(numbers, items, strict=True):
        if isinstance(item, bytes):
            out.append(item)
        elif isinstance(item, str):
            out.append(item.encode("utf-8"))
        else:
            raise DispatchInputError(
                name, f"must hold bytes, got {type(item).__name__} (row {row})", "dtype"
            )
    return out


# ---- assignment ----------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class AssignmentGraph:
    """The exact solve's sparse graph (module docstring) for fixed candidate lists and spare
    capacity. Only its costs depend on the scores, given per pair or per pair and slot rank.
    Rows: the orders with a candidate (then, square, one "unused" row per slot); columns: the
    slots, then (when some order may stay unassigned, or square) one "unassigned" column per
    order row.
    """

    candidates: NDArray[np.int64]  # [B, N] rider rows, -1 = none
    spare: NDArray[np.int64]  # [R]
    rows: NDArray[np.int64]  # [B'] the order of each order row (orders with an edge)
    edge_pair: NDArray[np.int64]  # [E'] flat candidate position (b * N + j) of each slot edge
    edge_at: NDArray[np.int64]  # [E'] its entry in the CSR arrays
    edge_rank: NDArray[np.int64]  # [E'] its slot's rank among its rider's slots (`slots`)
    slot_rider: NDArray[np.int64]  # [S] the rider of each slot column
    may_leave_unassigned: bool  # the orders' unassigned edges are in the graph
    # Built once; `solve` writes the edges' costs into its data (the others stay): one
    # graph serves one caller at a time.
    matrix: csr_matrix

    @classmethod
    def build(
        cls, candidates: NDArray[np.int64], spare: NDArray[np.int64], square: bool | None = False
    ) -> AssignmentGraph:
        """The graph of validated candidates [B, N] (-1 pads anywhere) and spare [R].

        ``square``: add the slots' "unused" rows (module docstring); None: where it pays
        for scores that differ by slot rank (`_SQUARE_FROM`).
        """
        num_orders, width = candidates.shape
        # Each order's edges by rider, so that its slot columns come out ascending: sort
        # every short row (riders are distinct within one; -1 pads sort first, dropped).
        by_rider = np.argsort(candidates, axis=1)
        ordered = np.take_along_axis(candidates, by_rider, axis=1)
        order_of, column = np.nonzero(ordered >= 0)
        # Each (order, rider) edge to every slot of that rider (`domain.slots`).
        slots = slot_edges(ordered[order_of, column], spare)
        edge_pair = (order_of * width + by_rider[order_of, column])[slots.edge]
        per_order = np.bincount(order_of[slots.edge], minlength=num_orders)
        rows = np.flatnonzero(per_order)
        edge_row = (np.cumsum(per_order > 0) - 1)[order_of[slots.edge]]  # ascending
        num_rows, num_slots, num_edges = rows.size, slots.num_slots, edge_pair.size
        # The edges come sorted by (row, column), so the CSR arrays are written directly:
        # exactly the canonical matrix a COO build would sort itself into, for a fraction of
        # the cost. int32 like scipy's own build: columns and entries stay far below 2**31
        # under the contract's limits.
        indptr = np.zeros(num_rows + 1, dtype=np.int32)
        np.cumsum(per_order[rows], out=indptr[1:])
        served = csr_matrix(
            (np.ones(num_edges), slots.column.astype(np.int32), indptr),
            shape=(num_rows, num_slots),
        )
        unassigned = bool(
            num_rows and (maximum_bipartite_matching(served, perm_type="column") < 0).any()
        )
        if square is None:
            square = (
                not unassigned
                and num_slots >= _SQUARE_SLACK * num_rows
                and num_rows * num_slots >= _SQUARE_FROM
            )
        edge_at = np.arange(num_edges)
        if not (unassigned or square):
            return cls(
                candidates, spare, rows, edge_pair, edge_at, slots.rank, slots.slot_rider,
                unassigned, served,
            )  # fmt: skip
        # Order row i: its slot edges, then (maybe) its unassigned column S + i. Square: then
        # slot row j: slot column j, then the unassigned columns of its edges' orders (the
        # edges grouped by slot with rows ascending: scipy's counting pass).
        mirror = served.tocsc() if square else None
        per_slot = np.zeros(0, dtype=np.int64) if mirror is None else np.diff(mirror.indptr)
        extra = int(unassigned)
        counts = np.concatenate((per_order[rows] + extra, per_slot + 1))
        indptr = np.zeros(counts.size + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        indices = np.empty(int(indptr[-1]), dtype=np.int32)
        data = np.ones(indices.size)
        edge_at += extra * edge_row
        indices[edge_at] = slots.column
        if unassigned:
            unassigned_at = indptr[1 : num_rows + 1] - 1
            indices[unassigned_at] = num_slots + np.arange(num_rows)
            data[unassigned_at] = 2.0 * num_orders + 3.0
        if mirror is not None:
            slot_at = indptr[num_rows:-1]
            indices[slot_at] = np.arange(num_slots)
            slot_of = np.repeat(np.arange(num_slots), per_slot)
            mirror_at = int(indptr[num_rows]) + np.arange(num_edges) + slot_of + 1
            indices[mirror_at] = num_slots + mirror.indices
        # Here the graph has its unassigned columns (unassigned or square): one per order row.
        shape = (indptr.size - 1, num_slots + num_rows)
        return cls(
            candidates, spare, rows, edge_pair, edge_at, slots.rank, slots.slot_rider,
            unassigned, csr_matrix((data, indices, indptr), shape=shape),
        )  # fmt: skip

    def solve(self, score: NDArray[np.float64]) -> NDArray[np.int64]:
        """Rider row per order (-1 = unassigned) for scores [B, N] in [0, 1]: most orders,
        then most total score. Exact (the full matching), whatever the scores."""
        return self.solve_ranked(score.reshape(-1, 1))

    def solve_ranked(self, score: NDArray[np.float64]) -> NDArray[np.int64]:
        """`solve` where a pair's score depends on how many new orders its rider already
        took: ``score[b * N + j, k]`` (in [0, 1]) is candidate j of order b as its rider's
        (k+1)-th new order; ranks past the last column read the last. Exact: the slot of
        rank k carries that score, so this is the optimum over every assignment with each
        rider's orders ranked at their best."""
        assigned = np.full(self.candidates.shape[0], -1, dtype=np.int64)
        if self.edge_pair.size == 0:
            return assigned
        ranks = np.minimum(self.edge_rank, score.shape[1] - 1)
        self.matrix.data[self.edge_at] = 2.0 - score[self.edge_pair, ranks]
        _, matched = min_weight_full_bipartite_matching(self.matrix)
        matched = matched[: self.rows.size]
        slot = matched < self.slot_rider.size
        assigned[self.rows[slot]] = self.slot_rider[matched[slot]]
        return assigned


def _adjacent_equal(values: NDArray[Any], valid: NDArray[np.bool_]) -> bool:
    """Whether two neighbours of a row of ``values`` [B, N] are equal, both ``valid``."""
    return bool(((values[:, 1:] == values[:, :-1]) & valid[:, 1:] & valid[:, :-1]).any())


def _uncontested(
    topk_index: NDArray[np.int64],
    topk_score: NDArray[np.float64],
    spare: NDArray[np.int64],
) -> NDArray[np.int64] | None:
    """Each order's own best position when that is the unique optimum, else None.

    An order's usable candidates are listed riders with spare > 0. If every order's
    cheapest usable edge (cost ``2 - s``, exactly as the solver sees it) is strictly
    cheaper than its others, and no rider is the best of more orders than its spare,
    then giving each order its best serves every order that can be served, each at its
    own maximum score: any other assignment serves fewer or scores strictly less, so
    this is the one optimum and the full solve would return it too. Ties and contested
    riders return None (solve it properly), so tie-breaking never depends on this path.
    """
    num_orders, width = topk_index.shape
    if width == 0 or spare.size == 0:
        return np.full(num_orders, -1, dtype=np.int64)
    listed = topk_index >= 0
    usable = listed & (spare[np.where(listed, topk_index, 0)] > 0)
    cost = np.where(usable, 2.0 - topk_score, np.inf)
    rows = np.arange(num_orders)
    best = np.argmin(cost, axis=1)
    best_cost = cost[rows, best]
    served = best_cost < np.inf
    if width > 1:
        cost[rows, best] = np.inf
        if (served & (cost.min(axis=1) <= best_cost)).any():
            return None
    riders = topk_index[rows, best][served]
    if (np.bincount(riders, minlength=spare.size) > spare).any():
        return None
    return np.where(served, best, -1)


def _assign_slots(
    topk_index: NDArray[np.int64],
    topk_score: NDArray[np.float64],
    spare: NDArray[np.int64],
) -> NDArray[np.int64]:
    """Chosen Top-K position per order, -1 = unassigned (inputs already validated)."""
    quick = _uncontested(topk_index, topk_score, spare)
    if quick is not None:
        return quick
    return _solve_slots(topk_index, topk_score, spare)


def _solve_slots(
    topk_index: NDArray[np.int64],
    topk_score: NDArray[np.float64],
    spare: NDArray[np.int64],
) -> NDArray[np.int64]:
    """`_assign_slots` by the full matching (module docstring), for any instance."""
    riders = AssignmentGraph.build(topk_index, spare).solve(topk_score)
    if topk_index.shape[1] == 0:
        return riders
    return np.where(riders >= 0, np.argmax(topk_index == riders[:, None], axis=1), -1)


def _at_position(values: NDArray[Any], position: NDArray[np.int64], fill: float) -> NDArray[Any]:
    """``values[b, position[b]]``, or `fill` where the position is -1 (even with no columns)."""
    rows = values.shape[0]
    if values.shape[1] == 0:
        return np.full(rows, fill, dtype=values.dtype)
    picked: NDArray[Any] = values[np.arange(rows), np.maximum(position, 0)]
    picked[position < 0] = fill
    return picked


def assign(
    topk_rider_index: ArrayLike,
    topk_score: ArrayLike,
    rider_load: ArrayLike,
    rider_capacity: ArrayLike,
) -> NDArray[np.int32]:
    """Rider row per order (-1 = unassigned): most orders first, then most total score.

    Each order takes at most one rider from its own list (row of `topk_rider_index`,
    -1 pads); rider r takes at most ``max(capacity_r - load_r, 0)`` orders. Without ids, an
    exact tie between optimal assignments falls to the rows; `resolve` breaks it by ids.
    """
    load = np.asarray(rider_load)
    if load.ndim != 1:
        raise DispatchInputError("RIDER_LOAD", f"must have shape [R], got {load.shape}", "shape")
    num_riders = int(load.shape[0])
    spare = spare_slots(
        _counts("RIDER_LOAD", load, num_riders),
        _counts("RIDER_CAPACITY", rider_capacity, num_riders),
    )
    index = _candidates(topk_rider_index, num_riders, "TOPK_RIDER_INDEX")
    score = np.asarray(topk_score, dtype=np.float64)
    if score.shape != index.shape:
        raise DispatchInputError(
            "TOPK_SCORE",
            f"must have the shape of TOPK_RIDER_INDEX {index.shape}, got {score.shape}",
            "shape",
        )
    listed = score[index >= 0]
    if not (np.isfinite(listed) & (listed >= 0.0) & (listed <= 1.0)).all():
        # The cost 2 - s must stay in [1, 2] for cardinality to dominate (module docstring).
        raise DispatchInputError(
            "TOPK_SCORE", "must lie in [0, 1] where a rider is listed", "range"
        )
    position = _assign_slots(index, score, spare)
    result: NDArray[np.int32] = _at_position(index, position, -1).astype(np.int32)
    return result


# ---- the step ------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ResolverWindow:
    """One window's checked riders, candidates, weights and settings: all `resolve` needs but
    the objectives, for a caller that scores some pairs again before it resolves
    (`pipeline.stacking`)."""

    rider_ids: NDArray[Any]  # [R]
    candidates: NDArray[np.int64]  # [B, N] rider rows, -1 = none
    spare: NDArray[np.int64]  # [R]
    weights: NDArray[np.float64]  # [3]; [B, 1, 3] (one row per order) in `resolve_many`
    settings: ResolverSettings
    # [B] the orders' ids (ORDER_IDS): exact ties between orders are broken by them; None:
    # by row (a caller that sends no ids).
    order_ids: NDArray[Any] | None = None

    @classmethod
    def checked(
        cls,
        candidate_rider_index: ArrayLike,
        rider_ids: ArrayLike,
        rider_load: ArrayLike,
        rider_capacity: ArrayLike,
        weights: ArrayLike,
        settings: ResolverSettings | None = None,
        order_ids: ArrayLike | None = None,
    ) -> ResolverWindow:
        """The window's tensors checked as `resolve` checks them (DispatchInputError)."""
        ids = _rider_ids(rider_ids)
        num_riders = int(ids.shape[0])
        load = _counts("RIDER_LOAD", rider_load, num_riders)
        capacity = _counts("RIDER_CAPACITY", rider_capacity, num_riders)
        w = _weights(weights)
        index = _candidates(candidate_rider_index, num_riders)
        orders = None if order_ids is None else checked_order_ids(order_ids, index.shape[0])
        return cls(
            ids, index, np.maximum(capacity - load, 0), w, settings or ResolverSettings(), orders
        )

    def order_rank(self) -> NDArray[np.int64] | None:
        """Each order's place in id order (`ids.id_rank`), None without ORDER_IDS: the
        tie-break between orders wherever one is needed (e.g. equal creation times)."""
        if self.order_ids is None:
            return None
        return id_rank(ids_as_bytes("ORDER_IDS", self.order_ids))

    def objectives(self, objectives: ArrayLike) -> NDArray[np.float64]:
        """PAIR_OBJECTIVES [B*N, 3] checked: [B, N, 3] float64, missing candidates zeroed."""
        return _objectives(objectives, self.candidates >= 0)

    def scores(self, objectives: NDArray[np.float64]) -> NDArray[np.float64]:
        """Each candidate's score from checked objectives [B, N, ..., 3]; 0 for a missing one."""
        score = _score(objectives, self.weights, self.settings)
        score[self.candidates < 0] = 0.0
        return score

    def pair_objectives(self, rows: NDArray[np.int64], values: ArrayLike) -> NDArray[np.float64]:
        """New objectives [n, 3] of valid pairs (PAIR_OBJECTIVES rows ``rows``, ascending),
        e.g. scored again with another load: float64, checked as `objectives` checks them."""
        new = np.asarray(values, dtype=np.float64).reshape(-1, len(OBJECTIVES))
        _check_pairs(new, rows)
        return new

    def assign(self, ranked: NDArray[np.float64]) -> NDArray[np.int64]:
        """Rider row per order (-1 = none) for scores [B * N, K] by slot rank
        (`AssignmentGraph.solve_ranked`; each row non-increasing, K = 1: plain scores).

        When every order's best usable rank-0 score is strictly its best and no two orders
        share that rider, giving each its best is the one optimum (it serves every order that
        can be served, each at the most it can score, and nothing stacks): then the graph is
        never built."""
        best = ranked[:, 0].reshape(self.candidates.shape)
        quick = _uncontested(self.candidates, best, np.minimum(self.spare, 1))
        if quick is None:
            # Plain scores tie across a rider's slots: the square graph never pays there.
            square = None if ranked.shape[1] > 1 else False
            return self._solve_in_id_order(self.candidates, ranked, square)
        return _at_position(self.candidates, quick, -1)

    def _solve_in_id_order(
        self,
        candidates: NDArray[np.int64],
        ranked: NDArray[np.float64],
        square: bool | None,
        listed: tuple[NDArray[np.int64], list[bytes]] | None = None,
    ) -> NDArray[np.int64]:
        """Rider row per order: `AssignmentGraph.solve_ranked` of ``candidates`` [B, N] (rows
        of this window's riders, in any column order) and their scores ``ranked`` [B * N, K],
        solved with the orders in order-id order and the listed riders in rider-id order.
        ``listed``: the rows of the riders ``candidates`` name, ascending, and their ids,
        when the caller has them already.

        Why: where optimal assignments tie exactly, LAPJVsp's pick depends on the graph's
        row and column order; built in id order the graph, and so the pick, is the same for
        every listing of the window (module docstring)."""
        num_orders, width = candidates.shape
        num_riders = int(self.spare.size)
        if listed is None:
            marked = np.zeros(num_riders + 1, dtype=np.bool_)
            marked[candidates] = True  # -1 pads mark the last entry
            used = np.flatnonzero(marked[:num_riders])
            listed = used, ids_as_bytes("RIDER_IDS", self.rider_ids, used)
        used, used_ids = listed
        if used.size == 0:
            return np.full(num_orders, -1, dtype=np.int64)
        riders = used[id_order(used_ids)]
        label = np.full(num_riders + 1, -1, dtype=np.int64)
        label[riders] = np.arange(riders.size)
        orders = (
            np.arange(num_orders)
            if self.order_ids is None or num_orders == 1
            else id_order(ids_as_bytes("ORDER_IDS", self.order_ids))
        )
        scores = ranked.reshape(num_orders, width, -1)[orders].reshape(num_orders * width, -1)
        graph = AssignmentGraph.build(label[candidates[orders]], self.spare[riders], square)
        solved = graph.solve_ranked(scores)
        out = np.empty(num_orders, dtype=np.int64)
        out[orders] = np.where(solved >= 0, riders[np.maximum(solved, 0)], -1)
        return out

    def resolution(
        self, objectives: NDArray[np.float64], assigned: NDArray[np.int64] | None = None
    ) -> Resolution:
        """Top-K lists from checked objectives [B, N, 3] and the assignment: the optimal one
        for these objectives, or ``assigned`` (rider row per order, -1 = none) when given."""
        resolution = self._resolution(objectives, assigned, solve=True)
        assert resolution is not None  # with solve, always
        return resolution

    def _resolution(
        self, objectives: NDArray[np.float64], assigned: NDArray[np.int64] | None, solve: bool
    ) -> Resolution | None:
        """`resolution`; without ``solve``, None where the assignment needs the full solve
        (some order's best rider is tied or contested: `_uncontested`)."""
        settings = self.settings
        index = self.candidates
        num_riders = int(self.rider_ids.shape[0])
        valid = index >= 0
        num_candidates = index.shape[1]
        k = min(settings.top_k, num_candidates)

        # Ids and hashes only for the riders someone listed (-1 marks the sentinel row R).
        listed = np.zeros(num_riders + 1, dtype=np.bool_)
        listed[index] = True
        used = np.flatnonzero(listed[:num_riders])
        used_ids = ids_as_bytes("RIDER_IDS", self.rider_ids, used)
        id_table = np.empty(num_riders + 1, dtype=object)
        id_table[num_riders] = b""
        id_table[used] = used_ids
        rider_hash = np.zeros(num_riders + 1, dtype=np.uint64)
        used_hash = _rider_hashes(used_ids)
        rider_hash[used] = used_hash
        safe_index = np.where(valid, index, num_riders)

        obj = objectives
        score = self.scores(obj)
        eta, ontime, cost = obj[..., _ETA], obj[..., _ONTIME], obj[..., _COST]
        # np.lexsort: the last key is the primary one.
        keys = (rider_hash[safe_index], cost, -ontime, eta, -score, ~valid)
        order = np.lexsort((safe_index, *keys), axis=-1)

        # Missing candidates sort last and carry zero objectives and score, so the Top-K
        # values need no masking: a padded slot already reads 0.
        rows = np.arange(index.shape[0])[:, None]
        ranked_index = safe_index[rows, order]
        if len(set(used_hash.tolist())) < used.size and _adjacent_equal(
            rider_hash[ranked_index], ranked_index < num_riders
        ):
            # Two riders of one order's list share a hash (FNV-1a is easy to collide on
            # purpose): their ids, not their rows, decide.
            id_key = np.zeros(num_riders + 1, dtype=np.int64)
            id_key[used] = id_rank(used_ids)
            order = np.lexsort((id_key[safe_index], *keys), axis=-1)
            ranked_index = safe_index[rows, order]
        ranked_score = score[rows, order]
        full_index = np.where(ranked_index < num_riders, ranked_index, -1)
        if assigned is None:
            # The assignment sees every candidate (ranked, so ties resolve as the ranking
            # does); the answer's Top-K list is the first k of the same ranking.
            quick = _uncontested(full_index, ranked_score, self.spare)
            if quick is None and not solve:
                return None
            assigned_index = (
                _at_position(full_index, quick, -1)
                if quick is not None
                else self._solve_in_id_order(
                    full_index, ranked_score.reshape(-1, 1), False, (used, used_ids)
                )
            )
        else:
            assigned_index = assigned
        # The assigned pair's score and objectives: its one cell of the order's row (a missing
        # candidate never matches; an unassigned order, -1, matches none and reads 0).
        at_assigned = (index == assigned_index[:, None]) & valid
        assigned_score = np.where(at_assigned, score, 0.0).sum(axis=1)
        assigned_obj = np.where(at_assigned[..., None], obj, 0.0).sum(axis=1)
        top = order[:, :k]
        top_index = ranked_index[:, :k]
        top_score = ranked_score[:, :k]
        top_obj = obj[rows, top].astype(np.float32)
        topk_index = full_index[:, :k]
        return Resolution(
            topk_rider_ids=id_table[top_index],
            topk_rider_index=topk_index.astype(np.int32),
            topk_score=top_score.astype(np.float32),
            topk_eta_minutes=np.ascontiguousarray(top_obj[..., _ETA]),
            topk_ontime_probability=np.ascontiguousarray(top_obj[..., _ONTIME]),
            topk_cost=np.ascontiguousarray(top_obj[..., _COST]),
            assigned_rider_ids=id_table[assigned_index],
            assigned_rider_index=assigned_index.astype(np.int32),
            assigned_score=assigned_score.astype(np.float32),
            assigned_objectives=assigned_obj.astype(np.float32),
        )


def resolve(
    objectives: ArrayLike,
    candidate_rider_index: ArrayLike,
    rider_ids: ArrayLike,
    rider_load: ArrayLike,
    rider_capacity: ArrayLike,
    weights: ArrayLike,
    settings: ResolverSettings | None = None,
    order_ids: ArrayLike | None = None,
) -> Resolution:
    """Top-K riders per order and a capacity-respecting assignment for one window;
    ``order_ids`` (ORDER_IDS) break exact ties between orders (else their rows do)."""
    window = ResolverWindow.checked(
        candidate_rider_index, rider_ids, rider_load, rider_capacity, weights, settings,
        order_ids,
    )  # fmt: skip
    return window.resolution(window.objectives(objectives))


# One window's tensors as `ResolverWindow.checked` and `.objectives` take them: candidates,
# rider ids, load, capacity, weights (checked: `parse_objective_weights`), objectives.
WindowTensors = tuple[
    NDArray[Any], NDArray[Any], NDArray[Any], NDArray[Any], NDArray[np.float64], NDArray[Any]
]


def checked_together(
    windows: Sequence[WindowTensors], settings: ResolverSettings
) -> list[tuple[ResolverWindow, NDArray[np.float64]]] | None:
    """`ResolverWindow.checked` and `objectives` of several windows of one candidate width,
    each window's result exactly as alone, checked in one pass over their concatenation;
    None when any window breaks a rule (or the windows differ in width): then check each
    alone, which names the rule and the window's own rows.

    Why: the checks cost a dozen numpy calls per window whatever its size; for the windows
    of one `execute` they are the same calls on the concatenated arrays. The rules are
    this module's (`_rider_ids`, `_counts`, `_candidates`, `_check_pairs`, `_weights`, the
    last once per distinct weights); the only extra test is each order's rider rows against
    its own window's riders.
    """
    if not windows:
        return []
    width = windows[0][0].shape[-1] if windows[0][0].ndim == 2 else -1
    orders: list[int] = []
    riders: list[int] = []
    for candidates, ids, load, capacity, weights, objectives in windows:
        count = ids.shape[0] if ids.ndim == 1 else -1
        if not (
            ids.dtype.kind in "OS"
            and candidates.dtype.kind in "iu"
            and load.dtype.kind in "iu"
            and capacity.dtype.kind in "iu"
            and objectives.dtype.kind == "f"
            and candidates.ndim == 2
            and candidates.shape[1] == width
            and count >= 0
            and load.shape == capacity.shape == (count,)
            and weights.shape == (len(OBJECTIVES),)
            and objectives.shape == (candidates.shape[0] * width, len(OBJECTIVES))
        ):
            return None
        orders.append(candidates.shape[0])
        riders.append(count)
    try:
        ids = _rider_ids(np.concatenate([window[1] for window in windows]))
        load = _counts("RIDER_LOAD", np.concatenate([w[2] for w in windows]), ids.shape[0])
        capacity = _counts("RIDER_CAPACITY", np.concatenate([w[3] for w in windows]), len(ids))
        index = _candidates(np.concatenate([window[0] for window in windows]), max(riders))
        if (index >= np.repeat(riders, orders)[:, None]).any():
            return None  # a rider row of another window: its own check names it
        checked = _objectives(np.concatenate([w[5] for w in windows]), index >= 0)
        passed: set[tuple[str, bytes]] = set()  # windows of one caller share their weights
        for window in windows:
            key = (window[4].dtype.str, window[4].tobytes())
            if key not in passed:
                _weights(window[4])
                passed.add(key)
    except DispatchInputError:
        return None
    spare = np.maximum(capacity - load, 0)
    out: list[tuple[ResolverWindow, NDArray[np.float64]]] = []
    first_order = first_rider = 0
    for parts, count, riders_here in zip(windows, orders, riders, strict=True):
        rows = slice(first_order, first_order + count)
        own = slice(first_rider, first_rider + riders_here)
        weights = np.asarray(parts[4], dtype=np.float64)
        resolver = ResolverWindow(ids[own], index[rows], spare[own], weights, settings)
        out.append((resolver, checked[rows]))
        first_order += count
        first_rider += riders_here
    return out


def resolve_many(items: Sequence[tuple[ResolverWindow, NDArray[np.float64]]]) -> list[Resolution]:
    """`ResolverWindow.resolution` of several windows, each with its checked objectives
    [B, N, 3], byte for byte, in one pass where that is exact.

    Why: a small window's Top-K and assignment cost a few dozen numpy calls whatever its
    size, so the windows of one Triton `execute` share them. Windows of one candidate width
    and settings are stacked as one window whose riders are each window's own, in blocks
    (every order lists only its window's riders, each with its window's weights): ranking,
    scores and the Top-K lists are row by row. The assignment is shared only when every
    order's best rider is its unique best and uncontested (`_uncontested`), which then holds
    in each window alone, with the same riders; otherwise, and for a width of its own, each
    window is resolved alone.
    """
    out: dict[int, Resolution] = {}
    groups: dict[tuple[int, ResolverSettings], list[int]] = {}
    for i, (window, _) in enumerate(items):
        groups.setdefault((window.candidates.shape[1], window.settings), []).append(i)
    for members in groups.values():
        joined = _resolve_stacked([items[i] for i in members]) if len(members) > 1 else None
        for n, i in enumerate(members):
            window, objectives = items[i]
            out[i] = joined[n] if joined is not None else window.resolution(objectives)
    return [out[i] for i in range(len(items))]


def _resolve_stacked(
    items: Sequence[tuple[ResolverWindow, NDArray[np.float64]]],
) -> list[Resolution] | None:
    """`resolve_many` of windows of one width and settings as one stacked window; None when
    the assignment needs a full solve somewhere."""
    windows = [window for window, _ in items]
    orders = [window.candidates.shape[0] for window in windows]
    riders = [window.rider_ids.shape[0] for window in windows]
    first_rider = np.cumsum([0, *riders[:-1]])
    shift = np.repeat(first_rider, orders)[:, None]
    candidates = np.concatenate([window.candidates for window in windows])
    stacked = ResolverWindow(
        rider_ids=np.concatenate([window.rider_ids for window in windows]),
        candidates=np.where(candidates >= 0, candidates + shift, -1),
        spare=np.concatenate([window.spare for window in windows]),
        weights=np.repeat(np.stack([window.weights for window in windows]), orders, axis=0)[
            :, None, :
        ],
        settings=windows[0].settings,
    )
    joined = stacked._resolution(np.concatenate([obj for _, obj in items]), None, solve=False)
    if joined is None:
        return None
    fields = {name: getattr(joined, name) for name in Resolution.__dataclass_fields__}
    for name in ("topk_rider_index", "assigned_rider_index"):  # back to each window's rows
        rows = fields[name]
        local = rows - shift.reshape((-1,) + (1,) * (rows.ndim - 1))
        fields[name] = np.where(rows >= 0, local, -1).astype(np.int32)
    parts = {name: split_rows(value, orders) for name, value in fields.items()}
    return [
        Resolution(**{name: part[n] for name, part in parts.items()}) for n in range(len(orders))
    ]
