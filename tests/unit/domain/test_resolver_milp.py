"""The resolver's assignment against an independent exact solver (scipy.optimize.milp).

The reference solves the lexicographic objective in two integer programs: first the most
orders that can be served, then, with that count fixed, the largest total score. The
instances cover scarcity (fewer spare slots than orders), zero spare capacity, infeasible
pairs (missing candidates, riders nobody may use) and ties (coarse scores).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS
from dispatch_service.domain.assignment import AssignmentGraph, assign
from dispatch_service.domain.resolver import resolve
from dispatch_service.domain.scoring import ResolverSettings, score_pairs

WEIGHTS = np.asarray(DEFAULT_OBJECTIVE_WEIGHTS, dtype=np.float64)


def milp_optimum(
    index: NDArray[np.int64], score: NDArray[np.float64], spare: NDArray[np.int64]
) -> tuple[int, float]:
    """(most orders served, best score sum among those) by two exact MILP solves."""
    orders, riders = np.nonzero(index >= 0)
    if orders.size == 0:
        return 0, 0.0
    rider = index[orders, riders]
    n = orders.size
    columns = np.arange(n)
    per_order = coo_matrix((np.ones(n), (orders, columns)), shape=(index.shape[0], n))
    per_rider = coo_matrix((np.ones(n), (rider, columns)), shape=(spare.size, n))
    constraints = [
        LinearConstraint(per_order, 0, 1),
        LinearConstraint(per_rider, 0, spare.astype(np.float64)),
    ]
    integral = np.ones(n)
    first = milp(-np.ones(n), constraints=constraints, integrality=integral, bounds=Bounds(0, 1))
    assert first.success
    count = round(-first.fun)
    fixed = [*constraints, LinearConstraint(np.ones((1, n)), count, count)]
    values = score[orders, riders]
    second = milp(-values, constraints=fixed, integrality=integral, bounds=Bounds(0, 1))
    assert second.success
    return count, float(-second.fun)


def instance(rng: np.random.Generator, regime: str) -> dict[str, Any]:
    """Random resolver inputs for one regime (see the module docstring)."""
    num_orders = int(rng.integers(1, 40))
    num_riders = int(rng.integers(1, 50))
    width = int(rng.integers(1, min(num_riders, 32) + 1))
    index = np.stack([rng.permutation(num_riders)[:width] for _ in range(num_orders)])
    index[rng.random(index.shape) < 0.25] = -1  # infeasible / missing pairs
    capacity = rng.integers(0, 4, num_riders)
    load = rng.integers(0, 3, num_riders)
    if regime == "scarce":  # total spare about a third of the orders
        capacity = load + (rng.random(num_riders) < num_orders / (3.0 * num_riders))
    elif regime == "zero_spare":
        capacity = load.copy()
        capacity[: max(1, num_riders // 10)] += 1  # a few riders keep one slot
    objectives = np.column_stack(
        [
            rng.uniform(3, 90, index.size),
            rng.uniform(0, 1, index.size),
            rng.uniform(2, 40, index.size),
        ]
    )
    if regime == "ties":  # few distinct values: many exactly equal scores
        objectives = np.column_stack(
            [
                rng.choice([10.0, 20.0], index.size),
                rng.choice([0.5, 1.0], index.size),
                rng.choice([5.0, 10.0], index.size),
            ]
        )
    return {
        "objectives": objectives.astype(np.float32),
        "candidate_rider_index": index.astype(np.int32),
        "rider_ids": np.array([f"r{i}".encode() for i in range(num_riders)], dtype=object),
        "rider_load": load.astype(np.int32),
        "rider_capacity": capacity.astype(np.int32),
        "weights": WEIGHTS,
    }


@pytest.mark.parametrize("regime", ["plain", "scarce", "zero_spare", "ties"])
def test_resolve_matches_milp_over_all_candidates(regime: str) -> None:
    rng = np.random.default_rng(["plain", "scarce", "zero_spare", "ties"].index(regime))
    for _ in range(40):
        args = instance(rng, regime)
        index = args["candidate_rider_index"].astype(np.int64)
        # top_k=1: the assignment must still use every candidate, not the one-long lists.
        result = resolve(**args, settings=ResolverSettings(top_k=1))
        scores = score_pairs(args["objectives"].astype(np.float64), WEIGHTS).reshape(index.shape)
        scores = np.where(index >= 0, scores, 0.0)
        spare = np.maximum(args["rider_capacity"] - args["rider_load"], 0).astype(np.int64)
        count, total = milp_optimum(index, scores, spare)
        assigned = result.assigned_rider_index.astype(np.int64)
        assert int((assigned >= 0).sum()) == count
        used = np.bincount(assigned[assigned >= 0], minlength=spare.size)
        assert (used <= spare).all()
        got = 0.0
        for b, rider in enumerate(assigned.tolist()):
            if rider >= 0:
                got += float(scores[b, index[b].tolist().index(rider)])
        assert got == pytest.approx(total, abs=1e-6)


@pytest.mark.parametrize("regime", ["plain", "scarce", "zero_spare", "ties"])
def test_assign_matches_milp(regime: str) -> None:
    rng = np.random.default_rng(100 + ["plain", "scarce", "zero_spare", "ties"].index(regime))
    for _ in range(40):
        args = instance(rng, regime)
        index = args["candidate_rider_index"].astype(np.int64)
        scores = score_pairs(args["objectives"].astype(np.float64), WEIGHTS).reshape(index.shape)
        scores = np.where(index >= 0, scores, 0.0)
        assigned = assign(index, scores, args["rider_load"], args["rider_capacity"])
        spare = np.maximum(args["rider_capacity"] - args["rider_load"], 0).astype(np.int64)
        count, total = milp_optimum(index, scores, spare)
        assert int((assigned >= 0).sum()) == count
        got = sum(
            float(scores[b, index[b].tolist().index(r)])
            for b, r in enumerate(assigned.tolist())
            if r >= 0
        )
        assert got == pytest.approx(total, abs=1e-6)


@pytest.mark.parametrize(("riders", "spare_at_most", "square"), [(1800, 3, True), (700, 1, False)])
def test_city_sized_graphs_match_milp(riders: int, spare_at_most: int, square: bool) -> None:
    """A solve by slot rank on a big window (``square=None``) builds the square graph (the
    slots' "unused" rows) where riders are ample, and the rectangular one where they are
    scarce (some orders must stay unassigned); both are the MILP's optimum."""
    rng = np.random.default_rng(riders)
    num_orders, width = 600, 16
    index = np.stack([rng.permutation(riders)[:width] for _ in range(num_orders)])
    index[rng.random(index.shape) < 0.1] = -1
    spare = rng.integers(0, spare_at_most + 1, riders)
    scores = np.where(index >= 0, rng.random(index.shape), 0.0)
    graph = AssignmentGraph.build(index.astype(np.int64), spare.astype(np.int64), square=None)
    assert (graph.matrix.shape[0] > graph.rows.size) == square  # the slot rows
    assert graph.may_leave_unassigned != square
    assigned = graph.solve(scores)
    count, total = milp_optimum(index, scores, spare)
    assert int((assigned >= 0).sum()) == count
    assert (np.bincount(assigned[assigned >= 0], minlength=spare.size) <= spare).all()
    got = sum(
        float(scores[b, index[b].tolist().index(r)])
        for b, r in enumerate(assigned.tolist())
        if r >= 0
    )
    assert got == pytest.approx(total, abs=1e-6)
