"""Stack-aware resolution, scored by the simulator's ground truth as an independent model:
the reported figures of every assigned pair must be the truth for the load that pair really
rides with (the rider's earlier new orders in the window)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS, PAIR_FEATURE_NAMES
from dispatch_service.domain.cities import default_registry
from dispatch_service.domain.features import encode_window
from dispatch_service.domain.resolver import ResolverWindow, resolve
from dispatch_service.domain.scoring import score_pairs
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.offline import simulator
from dispatch_service.pipeline.stacking import (
    StackingSettings,
    can_stack,
    resolve_stack_aware,
    routed_rescorer,
)
from dispatch_service.routing.engine import ModelCallError

SHANGHAI = default_registry().get("shanghai")

WEIGHTS = np.asarray(DEFAULT_OBJECTIVE_WEIGHTS, dtype=np.float64)
LOAD = PAIR_FEATURE_NAMES.index("rider_load")


def truth(
    window: DispatchWindow, rows: NDArray[np.int64], width: int, extra: object
) -> NDArray[np.float32]:
    candidates = encode_window(window, SHANGHAI).candidate_rider_index.reshape(-1)
    expected = simulator.expected_outcome(window, rows // width, candidates[rows], extra_load=extra)
    return np.stack(expected, axis=1).astype(np.float32)


def case(seed: int, riders: int) -> tuple[DispatchWindow, dict[str, object]]:
    window = simulator.generate_window(np.random.default_rng(seed), 48, riders)
    return window, stack_args(window)


def stack_args(window: DispatchWindow) -> dict[str, object]:
    """`resolve_stack_aware`'s arguments for ``window``, scored and re-scored by the truth."""
    encoded = encode_window(window, SHANGHAI)
    candidates = encoded.candidate_rider_index
    width = candidates.shape[1]
    flat = candidates.reshape(-1)
    valid = np.flatnonzero(flat >= 0)
    objectives = np.zeros((flat.size, 3), dtype=np.float32)
    objectives[valid] = truth(window, valid, width, None)

    def rescore(rows: NDArray[np.int64], features: NDArray[np.float32]) -> NDArray[np.float32]:
        extra = features[:, LOAD].astype(np.int64) - window.rider_load[flat[rows]]
        return truth(window, rows, width, extra)

    args: dict[str, object] = {
        "objectives": objectives,
        "features": encoded.pair_features,
        "candidate_rider_index": candidates,
        "created_at": window.created_at,
        "rider_ids": window.rider_ids,
        "rider_load": window.rider_load,
        "rider_capacity": window.rider_capacity,
        "weights": WEIGHTS,
        "rescore": rescore,
        "order_ids": window.order_ids,  # orders created together ride in id order
    }
    return args


def test_assigned_figures_are_the_truth_for_the_stacked_load() -> None:
    stacked_total = 0
    for seed in range(6):
        window, args = case(seed, riders=40)  # few riders: many stacked orders
        result = resolve_stack_aware(**args)  # type: ignore[arg-type]
        assigned = result.resolution.assigned_rider_index.astype(np.int64)
        rows = np.flatnonzero(assigned >= 0)
        extra = simulator.sequential_extra_load(window, assigned)[rows]
        stacked_total += int((extra > 0).sum())
        eta, ontime, cost = simulator.expected_outcome(
            window, rows, assigned[rows], extra_load=extra
        )
        np.testing.assert_allclose(result.resolution.assigned_objectives[rows, 0], eta, rtol=1e-5)
        np.testing.assert_allclose(
            result.resolution.assigned_objectives[rows, 1], ontime, atol=1e-6
        )
        np.testing.assert_allclose(result.resolution.assigned_objectives[rows, 2], cost, rtol=1e-5)
        own = score_pairs(result.resolution.assigned_objectives[rows], WEIGHTS).astype(np.float32)
        np.testing.assert_allclose(result.resolution.assigned_score[rows], own, rtol=1e-6)
    assert stacked_total > 20  # the case really stacks orders


def joining_loads(window: DispatchWindow, assigned: NDArray[np.int64], pairs: Any) -> list[int]:
    """Per (order, rider): the orders its rider took that were created before it (ties by
    order id), 0 when the rider is full without it -- written as plain loops."""
    spare = np.maximum(window.rider_capacity - window.rider_load, 0)
    out = []
    for b, r in pairs:
        others = [o for o in range(assigned.size) if o != b and assigned[o] == r]
        key = {o: (window.created_at[o], window.order_ids[o]) for o in [b, *others]}
        before = [o for o in others if key[o] < key[b]]
        out.append(len(before) if len(others) < spare[r] or assigned[b] == r else 0)
    return out


def test_every_pair_reports_the_truth_for_the_load_it_would_ride_with() -> None:
    """Top-K figures: a pair whose rider took earlier-created orders is the truth with that
    load (stand-alone where the rider has no room left for it)."""
    joined = 0
    for seed in range(3):
        window, args = case(seed, riders=40)
        result = resolve_stack_aware(**args)  # type: ignore[arg-type]
        assigned = result.resolution.assigned_rider_index.astype(np.int64)
        candidates = np.asarray(args["candidate_rider_index"]).astype(np.int64)
        width = candidates.shape[1]
        rows = np.flatnonzero(candidates.reshape(-1) >= 0)
        pairs = [(int(row // width), int(candidates.reshape(-1)[row])) for row in rows]
        extra = np.asarray(joining_loads(window, assigned, pairs))
        joined += int((extra > 0).sum())
        expected = truth(window, rows, width, extra)
        np.testing.assert_allclose(result.objectives[rows], expected, rtol=1e-5, atol=1e-6)
        topk = result.resolution.topk_eta_minutes
        listed = result.resolution.topk_rider_index.astype(np.int64)
        b, k = np.nonzero(listed >= 0)
        at = b * width + np.argmax(candidates[b] == listed[b, k][:, None], axis=1)
        np.testing.assert_array_equal(topk[b, k], result.objectives[at, 0])
    assert joined > 50  # many pairs really carry a joining load


def test_a_window_without_stacking_is_one_plain_solve() -> None:
    window, args = case(1, riders=300)
    # Capacity one: nobody can take two new orders, so nothing stacks.
    one = np.minimum(window.rider_load + 1, window.rider_capacity).astype(np.int32)
    args["rider_capacity"] = one
    result = resolve_stack_aware(**args)  # type: ignore[arg-type]
    plain = resolve(
        args["objectives"],
        args["candidate_rider_index"],
        rider_ids=window.rider_ids,  # type: ignore[arg-type]
        rider_load=window.rider_load,
        rider_capacity=one,
        weights=WEIGHTS,
        order_ids=window.order_ids,
    )
    assert result.rescored == 0
    for name, value in plain.as_tensors().items():
        np.testing.assert_array_equal(result.resolution.as_tensors()[name], value)


def test_pipeline_wiring_runs_the_stack_aware_resolution() -> None:
    """Wiring: DispatchPipeline (topk_resolver's stack_aware, on in the repository) answers
    what resolve_stack_aware does with the pipeline's own model, and differs from the
    pipeline with stack_aware off on a stacked window."""
    from dataclasses import replace

    from dispatch_service.domain.window_wire import window_to_wire
    from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline

    window = simulator.generate_window(np.random.default_rng(2), 48, 40)
    tensors = window_to_wire(window)
    aware = DispatchPipeline.from_repository()
    assert aware.resolver.stacking.stack_aware
    plain = replace(aware, resolver=replace(aware.resolver, stacking=StackingSettings(False)))
    encoded = aware.encoder.run(tensors)
    scores = aware.model.scorer.infer(encoded["PAIR_FEATURES"])
    direct = resolve_stack_aware(
        scores,
        encoded["PAIR_FEATURES"],
        candidate_rider_index=encoded["CANDIDATE_RIDER_INDEX"],
        created_at=window.created_at,
        rider_ids=window.rider_ids,
        rider_load=window.rider_load,
        rider_capacity=window.rider_capacity,
        weights=WEIGHTS,
        rescore=lambda rows, features: aware.model.scorer.infer(features),
        settings=aware.resolver.settings,
    ).resolution.as_wire_tensors()
    got = aware.run(tensors)
    for name, value in direct.items():
        np.testing.assert_array_equal(got[name], value)
    assert not np.array_equal(plain.run(tensors)["ASSIGNED_SCORE"], got["ASSIGNED_SCORE"])


def test_routed_rescorer_asks_each_order_s_version_once_and_keeps_what_it_cannot_score() -> None:
    """Orders of version 0 (rule-based fallback) and of a version whose call fails keep the
    objectives they came with; every other pair gets its own version's answer."""
    width = 2
    objectives = np.arange(24, dtype=np.float32).reshape(8, 3)  # 4 orders x 2 candidates
    versions = np.array([1, 0, 2, 3], dtype=np.int32)
    calls: list[tuple[int, int]] = []

    def score(version: int, features: NDArray[np.float32]) -> NDArray[np.float32]:
        calls.append((version, len(features)))
        if version == 3:
            raise ModelCallError("version 3 is not served")
        return np.full((len(features), 3), -float(version), dtype=np.float32) - features[:, :1]

    rows = np.array([0, 1, 2, 4, 6, 7], dtype=np.int64)
    features = np.arange(6, dtype=np.float32).reshape(6, 1) * 10.0
    out = routed_rescorer(objectives, versions, width, score)(rows, features)
    assert sorted(calls) == [(1, 2), (2, 1), (3, 2)]
    np.testing.assert_array_equal(out[:2], [[-1.0] * 3, [-11.0] * 3])  # order 0, version 1
    np.testing.assert_array_equal(out[2], objectives[2])  # order 1: the rule-based fallback
    np.testing.assert_array_equal(out[3], [-32.0] * 3)  # order 2, version 2
    np.testing.assert_array_equal(out[4:], objectives[[6, 7]])  # order 3: its call failed


def ranked_truth(
    window: DispatchWindow, candidates: NDArray[np.int64]
) -> dict[tuple[int, int], list[float]]:
    """(order, rider) -> score as that rider's 1st, 2nd, ... new order (never above an
    earlier rank), from the simulator's expectations, for every rank the rider can offer."""
    spare = np.maximum(window.rider_capacity - window.rider_load, 0)
    degree = np.bincount(candidates[candidates >= 0], minlength=spare.size)
    out = {}
    for b, j in zip(*np.nonzero(candidates >= 0), strict=True):
        r = int(candidates[b, j])
        ranks = max(int(min(spare[r], degree[r])), 1)
        figures = simulator.expected_outcome(
            window, np.full(ranks, b), np.full(ranks, r), extra_load=np.arange(ranks)
        )
        scores = score_pairs(np.stack(figures, axis=1), WEIGHTS)
        out[(int(b), r)] = np.minimum.accumulate(scores).tolist()
    return out


def milp_ranked_optimum(
    ranked: dict[tuple[int, int], list[float]], spare: NDArray[np.int64]
) -> tuple[int, float]:
    """Most orders served, then the largest total of rank scores: order b takes rider r's
    slot of rank k (k < min(spare_r, degree_r)) at score ranked[b, r][k]; two MILPs."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    variables = [(b, r, k) for (b, r), scores in ranked.items() for k in range(len(scores))]
    variables = [(b, r, k) for b, r, k in variables if spare[r] > 0]
    if not variables:
        return 0, 0.0
    n = len(variables)
    orders = sorted({b for b, _, _ in variables})
    slots = sorted({(r, k) for _, r, k in variables})
    order_row = {b: i for i, b in enumerate(orders)}
    slot_row = {s: i for i, s in enumerate(slots)}
    columns = np.arange(n)
    per_order = coo_matrix(
        (np.ones(n), ([order_row[b] for b, _, _ in variables], columns)), shape=(len(orders), n)
    )
    per_slot = coo_matrix(
        (np.ones(n), ([slot_row[(r, k)] for _, r, k in variables], columns)),
        shape=(len(slots), n),
    )
    constraints = [LinearConstraint(per_order, 0, 1), LinearConstraint(per_slot, 0, 1)]
    integral, bounds = np.ones(n), Bounds(0, 1)
    first = milp(-np.ones(n), constraints=constraints, integrality=integral, bounds=bounds)
    assert first.success
    count = round(-first.fun)
    fixed = [*constraints, LinearConstraint(np.ones((1, n)), count, count)]
    values = np.asarray([ranked[(b, r)][k] for b, r, k in variables])
    second = milp(-values, constraints=fixed, integrality=integral, bounds=bounds)
    assert second.success
    return count, float(-second.fun)


def best_ranking_value(
    ranked: dict[tuple[int, int], list[float]], assigned: NDArray[np.int64]
) -> float:
    """The total of an assignment's rank scores, each rider's orders ranked at their best."""
    from itertools import permutations

    total = 0.0
    for r in set(assigned[assigned >= 0].tolist()):
        mine = np.flatnonzero(assigned == r).tolist()
        total += max(
            sum(ranked[(b, r)][k] for k, b in enumerate(order)) for order in permutations(mine)
        )
    return total


@pytest.mark.parametrize("seed", range(5))
def test_the_assignment_is_the_exact_optimum_over_slot_ranks(seed: int) -> None:
    """Against an independent MILP of the ranked slots: as many orders as any assignment
    serves, and no assignment's rank scores (each rider's orders ranked at their best) add
    up to more. Few riders (a third to a half as many as orders), each with room for one to
    three new orders, so that ranks matter and some orders stay unassigned."""
    from dataclasses import replace

    rng = np.random.default_rng(100 + seed)
    window = simulator.generate_window(rng, 24, 8 + seed)
    room = rng.integers(1, 4, window.rider_load.size)
    window = replace(window, rider_capacity=(window.rider_load + room).astype(np.int32))
    args = stack_args(window)
    truth_rescore = args["rescore"]
    calls = []

    def rescore(rows: NDArray[np.int64], features: NDArray[np.float32]) -> NDArray[np.float32]:
        calls.append(rows.size)
        return truth_rescore(rows, features)  # type: ignore[operator,no-any-return]

    result = resolve_stack_aware(**{**args, "rescore": rescore})  # type: ignore[arg-type]
    candidates = np.asarray(args["candidate_rider_index"]).astype(np.int64)
    assigned = result.resolution.assigned_rider_index.astype(np.int64)
    ranked = ranked_truth(window, candidates)
    spare = np.maximum(window.rider_capacity - window.rider_load, 0).astype(np.int64)
    count, value = milp_ranked_optimum(ranked, spare)
    assert int((assigned >= 0).sum()) == count
    assert best_ranking_value(ranked, assigned) == pytest.approx(value, abs=1e-6)
    assert len(calls) == 1 and calls[0] == result.rescored > 0  # one model call


def test_a_bad_rescored_objective_is_refused_like_a_bad_input() -> None:
    from dispatch_service.core.errors import DispatchInputError

    _, args = case(0, riders=40)
    good = args["rescore"]

    def broken(rows: NDArray[np.int64], features: NDArray[np.float32]) -> NDArray[np.float32]:
        out = good(rows, features).copy()  # type: ignore[operator]
        out[-1, 0] = np.nan
        return out  # type: ignore[no-any-return]

    args["rescore"] = broken
    with pytest.raises(DispatchInputError) as caught:
        resolve_stack_aware(**args)  # type: ignore[arg-type]
    assert caught.value.tensor == "PAIR_OBJECTIVES"


def test_can_stack_says_whether_some_rider_can_take_two_new_orders() -> None:
    """Checked rider by rider, by hand: spare capacity >= 2 and listed by >= 2 orders."""
    rng = np.random.default_rng(11)
    windows = []
    for _ in range(40):
        orders, riders, width = (int(n) for n in rng.integers(1, 5, 3))
        candidates = np.full((orders, width), -1, dtype=np.int64)
        for b in range(orders):
            listed = int(rng.integers(0, min(width, riders) + 1))
            candidates[b, :listed] = rng.choice(riders, size=listed, replace=False)
        ids = np.array([f"r{r}".encode() for r in range(riders)], dtype=object)
        load = rng.integers(0, 3, riders)
        window = ResolverWindow.checked(
            candidates,
            rider_ids=ids,
            rider_load=load,
            rider_capacity=load + rng.integers(0, 4, riders),
            weights=DEFAULT_OBJECTIVE_WEIGHTS,
        )
        windows.append(window)
    expected = [
        any(w.spare[r] >= 2 and int((w.candidates == r).sum()) >= 2 for r in range(w.spare.size))
        for w in windows
    ]
    assert 0 < sum(expected) < len(windows)  # both kinds are drawn
    assert can_stack(windows) == expected
    assert [can_stack([w])[0] for w in windows] == expected
    assert can_stack([]) == []
