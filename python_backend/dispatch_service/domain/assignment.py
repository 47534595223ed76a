"""The assignment: each order at most one of its candidates, each rider at most its spare
capacity; most orders first, then most total score.

The assignment is made over *every* valid candidate of every order (all N columns of
``CANDIDATE_RIDER_INDEX``, N = ``candidates_per_order``), not over the Top-K lists:
Top-K is only the ranked list in the answer. Cutting to Top-K first would leave orders
unassigned where riders are scarce, so the assigned rider of an order may sit outside its
Top-K list.
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
  column. That initial assignment thrashes where riders are tight or some order must
  stay unassigned, and ties across a rider's slots (plain scores) slow it down, so those
  graphs, and small ones, stay rectangular (`_SQUARE_FROM`).

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
a city-sized window) costs more in per-call overhead than it saves.
The graph depends only on the candidates and the spare capacity (`AssignmentGraph`),
the costs on the scores; a slot's cost may also depend on its rank among its rider's
slots (`AssignmentGraph.solve_ranked`), which is how `pipeline.stacking` prices a
rider's second and later new orders in the same exact solve.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching, min_weight_full_bipartite_matching

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.feasibility import spare_slots
from dispatch_service.domain.resolver_inputs import checked_candidates, checked_counts
from dispatch_service.domain.slots import slot_edges

__all__ = ["AssignmentGraph", "assign", "at_position", "uncontested_best"]

# A solve by slot rank uses the square graph (module docstring) from this many order rows x
# slot columns on, when every order can be served and there are at least _SQUARE_SLACK slots
# per order: below that size, or with fewer spare slots, the rectangular graph is faster.
# Plain scores never use it (a rider's slots tie, which slows its initial assignment).
_SQUARE_FROM: Final = 1 << 17
_SQUARE_SLACK: Final = 2


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


def uncontested_best(
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
    # One order's best rider is usable, so it has a slot: only several can contest one.
    if num_orders > 1:
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
    quick = uncontested_best(topk_index, topk_score, spare)
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


def at_position(values: NDArray[Any], position: NDArray[np.int64], fill: float) -> NDArray[Any]:
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
        checked_counts("RIDER_LOAD", load, num_riders),
        checked_counts("RIDER_CAPACITY", rider_capacity, num_riders),
    )
    index = checked_candidates(topk_rider_index, num_riders, "TOPK_RIDER_INDEX")
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
    result: NDArray[np.int32] = at_position(index, position, -1).astype(np.int32)
    return result
