"""The `topk_resolver` step: rank each order's candidates, keep the Top-K, assign riders.

Plain numpy/scipy so the Triton Python backend, offline tools and tests share one code
path. Scores are `scoring`'s, the input rules `resolver_inputs`', the exact assignment
`assignment`'s; this module ranks and puts one window (or the windows of one batch)
together.

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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import (
    ASSIGNED_OBJECTIVES,
    DISPATCH_OUTPUTS,
    OBJECTIVES,
    TOPK_OBJECTIVES,
)
from dispatch_service.core.batches import split_rows
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain import pair_kernels
from dispatch_service.domain.assignment import AssignmentGraph, at_position, uncontested_best
from dispatch_service.domain.hashing import rider_id_hashes
from dispatch_service.domain.ids import id_order, id_rank, ids_as_bytes
from dispatch_service.domain.resolver_inputs import (
    check_pair_objectives,
    checked_candidates,
    checked_counts,
    checked_objectives,
    checked_order_ids,
    checked_rider_ids,
)
from dispatch_service.domain.scoring import (
    COST,
    ETA,
    ONTIME,
    ResolverSettings,
    checked_weights,
    score_checked,
)

__all__ = [
    "Resolution",
    "ResolverWindow",
    "WindowTensors",
    "checked_together",
    "resolve",
    "resolve_many",
]


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
        columns = (
            self.topk_score,
            self.topk_eta_minutes,
            self.topk_ontime_probability,
            self.topk_cost,
        )
        # np.stack's result, filled column by column (np.stack is a dozen Python-level calls)
        topk = np.empty((*self.topk_score.shape, len(columns)), dtype=np.float32)
        for at, column in enumerate(columns):
            topk[..., at] = column
        return {
            "TOPK_RIDER_INDEX": self.topk_rider_index,
            TOPK_OBJECTIVES.name: topk,
            "ASSIGNED_RIDER_INDEX": self.assigned_rider_index,
            "ASSIGNED_SCORE": self.assigned_score,
            ASSIGNED_OBJECTIVES.name: self.assigned_objectives,
        }


def _ranked(keys: tuple[NDArray[Any], ...], tie: NDArray[Any]) -> NDArray[np.int64]:
    """Each order's candidate columns in Top-K order: `pair_kernels.rank_candidates` of
    ``keys`` (invalid, score, ETA, on-time, cost, id hash; each [B, N]), then ``tie``."""
    invalid, *values, rider_hash = keys
    order = np.empty(tie.shape, dtype=np.int64)
    pair_kernels.rank_candidates(
        (invalid, *(np.asarray(value, dtype=np.float64) for value in values), rider_hash),
        tie.astype(np.int64, copy=False),
        order,
    )
    return order


def _row_sums(at: NDArray[np.bool_], values: NDArray[np.float64]) -> NDArray[np.float64]:
    """``np.where(at, values, 0.0).sum(axis=1)`` (``values`` [B, N, ...], ``at`` [B, N]
    marking at most one cell of a row), bit for bit, as a gather: that cell's value plus
    0.0 (numpy's sum adds it even to a row of one: a -0.0 reads 0.0), or 0.0 for a row
    without one. For the objectives [B, N, 3]: numpy sums over their middle axis strided,
    12 times slower for 1,000 orders (a sum over a row's last axis, the scores', is not)."""
    rows, width = at.shape
    if width == 0:
        return np.zeros((rows, *values.shape[2:]))
    line = np.arange(rows)
    column = at.argmax(axis=1)
    hit = at[line, column].reshape(rows, *[1] * (values.ndim - 2))
    return np.where(hit, values[line, column] + 0.0, 0.0)


def _adjacent_equal(values: NDArray[Any], valid: NDArray[np.bool_]) -> bool:
    """Whether two neighbours of a row of ``values`` [B, N] are equal, both ``valid``."""
    return bool(((values[:, 1:] == values[:, :-1]) & valid[:, 1:] & valid[:, :-1]).any())


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
        *,
        rider_ids: ArrayLike,
        rider_load: ArrayLike,
        rider_capacity: ArrayLike,
        weights: ArrayLike,
        settings: ResolverSettings | None = None,
        order_ids: ArrayLike | None = None,
    ) -> ResolverWindow:
        """The window's tensors checked as `resolve` checks them (DispatchInputError)."""
        ids = checked_rider_ids(rider_ids)
        num_riders = int(ids.shape[0])
        load = checked_counts("RIDER_LOAD", rider_load, num_riders)
        capacity = checked_counts("RIDER_CAPACITY", rider_capacity, num_riders)
        w = checked_weights(weights)
        index = checked_candidates(candidate_rider_index, num_riders)
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
        return checked_objectives(objectives, self.candidates >= 0)

    def scores(self, objectives: NDArray[np.float64]) -> NDArray[np.float64]:
        """Each candidate's score from checked objectives [B, N, ..., 3]; 0 for a missing one."""
        score = score_checked(objectives, self.weights, self.settings)
        score[self.candidates < 0] = 0.0
        return score

    def pair_objectives(self, rows: NDArray[np.int64], values: ArrayLike) -> NDArray[np.float64]:
        """New objectives [n, 3] of valid pairs (PAIR_OBJECTIVES rows ``rows``, ascending),
        e.g. scored again with another load: float64, checked as `objectives` checks them."""
        new = np.asarray(values, dtype=np.float64).reshape(-1, len(OBJECTIVES))
        check_pair_objectives(new, rows)
        return new

    def assign(self, ranked: NDArray[np.float64]) -> NDArray[np.int64]:
        """Rider row per order (-1 = none) for scores [B * N, K] by slot rank
        (`AssignmentGraph.solve_ranked`; each row non-increasing, K = 1: plain scores).

        When every order's best usable rank-0 score is strictly its best and no two orders
        share that rider, giving each its best is the one optimum (it serves every order that
        can be served, each at the most it can score, and nothing stacks): then the graph is
        never built."""
        best = ranked[:, 0].reshape(self.candidates.shape)
        quick = uncontested_best(self.candidates, best, np.minimum(self.spare, 1))
        if quick is None:
            # Plain scores tie across a rider's slots: the square graph never pays there.
            square = None if ranked.shape[1] > 1 else False
            return self._solve_in_id_order(self.candidates, ranked, square)
        return at_position(self.candidates, quick, -1)

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
        (some order's best rider is tied or contested: `assignment.uncontested_best`)."""
        settings = self.settings
        index = self.candidates
        num_riders = int(self.rider_ids.shape[0])
        valid = index >= 0
        num_candidates = index.shape[1]
        k = min(settings.top_k, num_candidates)

        # Ids and hashes only for the riders someone listed (-1 marks the sentinel row R).
        listed = np.zeros(num_riders + 1, dtype=np.bool_)
        listed[index] = True
        used = listed[:num_riders].nonzero()[0]  # np.flatnonzero without its wrappers
        used_ids = ids_as_bytes("RIDER_IDS", self.rider_ids, used)
        id_table = np.empty(num_riders + 1, dtype=object)
        id_table[num_riders] = b""
        id_table[used] = used_ids
        rider_hash = np.zeros(num_riders + 1, dtype=np.uint64)
        used_hash = rider_id_hashes(used_ids)
        rider_hash[used] = used_hash
        safe_index = np.where(valid, index, num_riders)

        obj = objectives
        score = self.scores(obj)
        eta, ontime, cost = obj[..., ETA], obj[..., ONTIME], obj[..., COST]
        # `pair_kernels.rank_candidates`: np.lexsort((tie, *keys), axis=-1) of the keys
        # (hash[safe_index], cost, -ontime, eta, -score, ~valid), the last the primary one.
        keys = (~valid, score, eta, ontime, cost, rider_hash[safe_index])
        order = _ranked(keys, safe_index)

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
            order = _ranked(keys, id_key[safe_index])
            ranked_index = safe_index[rows, order]
        ranked_score = score[rows, order]
        full_index = np.where(ranked_index < num_riders, ranked_index, -1)
        if assigned is None:
            # The assignment sees every candidate (ranked, so ties resolve as the ranking
            # does); the answer's Top-K list is the first k of the same ranking.
            quick = uncontested_best(full_index, ranked_score, self.spare)
            if quick is None and not solve:
                return None
            assigned_index = (
                at_position(full_index, quick, -1)
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
        assigned_obj = _row_sums(at_assigned, obj)
        top = order[:, :k]
        top_index = ranked_index[:, :k]
        top_score = ranked_score[:, :k]
        top_obj = obj[rows, top].astype(np.float32)
        topk_index = full_index[:, :k]
        return Resolution(
            topk_rider_ids=id_table[top_index],
            topk_rider_index=topk_index.astype(np.int32),
            topk_score=top_score.astype(np.float32),
            topk_eta_minutes=np.ascontiguousarray(top_obj[..., ETA]),
            topk_ontime_probability=np.ascontiguousarray(top_obj[..., ONTIME]),
            topk_cost=np.ascontiguousarray(top_obj[..., COST]),
            assigned_rider_ids=id_table[assigned_index],
            assigned_rider_index=assigned_index.astype(np.int32),
            assigned_score=assigned_score.astype(np.float32),
            assigned_objectives=assigned_obj.astype(np.float32),
        )


def resolve(
    objectives: ArrayLike,
    candidate_rider_index: ArrayLike,
    *,
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
        candidate_rider_index,
        rider_ids=rider_ids,
        rider_load=rider_load,
        rider_capacity=rider_capacity,
        weights=weights,
        settings=settings,
        order_ids=order_ids,
    )
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
    `resolver_inputs`' and `scoring.checked_weights` (once per distinct weights); the only
    extra test is each order's rider rows against its own window's riders.
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
        ids = checked_rider_ids(np.concatenate([window[1] for window in windows]))
        load = checked_counts("RIDER_LOAD", np.concatenate([w[2] for w in windows]), ids.shape[0])
        capacity = checked_counts(
            "RIDER_CAPACITY", np.concatenate([w[3] for w in windows]), len(ids)
        )
        index = checked_candidates(np.concatenate([window[0] for window in windows]), max(riders))
        if (index >= np.repeat(riders, orders)[:, None]).any():
            return None  # a rider row of another window: its own check names it
        checked = checked_objectives(np.concatenate([w[5] for w in windows]), index >= 0)
        passed: set[tuple[str, bytes]] = set()  # windows of one caller share their weights
        for window in windows:
            key = (window[4].dtype.str, window[4].tobytes())
            if key not in passed:
                checked_weights(window[4])
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
    order's best rider is its unique best and uncontested (`assignment.uncontested_best`),
    which then holds in each window alone, with the same riders; otherwise, and for a width
    of its own, each window is resolved alone.
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
