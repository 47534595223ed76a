"""The evaluation's policies decide as the served library does."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.offline import evaluation_policies, simulator

V1 = model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(1)


@pytest.mark.parametrize(
    ("seed", "weights"),
    [
        (3, DEFAULT_OBJECTIVE_WEIGHTS),
        (4, DEFAULT_OBJECTIVE_WEIGHTS),
        (5, DEFAULT_OBJECTIVE_WEIGHTS),
        (3, (1.0, 0.0, 0.0)),
    ],
)
def test_model_policy_wiring_is_the_served_decision(
    seed: int, weights: evaluation_policies.Weights
) -> None:
    """Wiring, not correctness: the evaluation's model policy assigns as the served library
    does (DispatchPipeline with the repository's configs, stack-aware by default), on
    windows scarce enough to stack, and reports the served figures of each assigned pair;
    with other weights, as a request that sends them as OBJECTIVE_WEIGHTS."""
    from dispatch_service.domain.window_wire import window_to_wire
    from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline

    window = simulator.generate_window(np.random.default_rng(seed), 48, 14)
    decision = evaluation_policies.model_policy(
        model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(1), weights=weights
    )(window, simulator.DEFAULT_CITY)
    wire = window_to_wire(window)
    if weights != DEFAULT_OBJECTIVE_WEIGHTS:  # the default: a request that sends none
        wire["OBJECTIVE_WEIGHTS"] = np.asarray(weights, dtype=np.float32)
    served = DispatchPipeline.from_repository().run(wire)
    np.testing.assert_array_equal(decision.assigned, served["ASSIGNED_RIDER_INDEX"])
    assert decision.predicted is not None
    # Every assigned order's figures, its rider on the Top-K list or not (0 = unassigned).
    np.testing.assert_allclose(decision.predicted, served["ASSIGNED_OBJECTIVES"], rtol=1e-6)


def _expected_total(
    window: simulator.DispatchWindow, assigned: np.ndarray, world: simulator.CityConfig
) -> float:
    """The report's expected minutes of an assignment, every order counted: assigned orders
    from creation with the simulator's own stacking (creation order), the others at their
    promise plus the penalty."""
    rows = np.flatnonzero(assigned >= 0)
    extra = simulator.sequential_extra_load(window, assigned)[rows]
    eta, _, _ = simulator.expected_outcome(window, rows, assigned[rows], world, extra_load=extra)
    age = (window.dispatch_time - window.created_at.astype(np.float64)) / 60.0
    penalty = window.promised_minutes.astype(np.float64) + simulator.UNASSIGNED_PENALTY_MINUTES
    unserved = np.flatnonzero(assigned < 0)
    return float(np.sum(age[rows] + eta) + np.sum(penalty[unserved]))


def _every_assignment(window: simulator.DispatchWindow) -> list[np.ndarray]:
    """Every assignment that keeps hard constraints and capacity, by enumeration."""
    from itertools import product

    from dispatch_service.domain.feasibility import spare_slots
    from dispatch_service.domain.features import feasible_mask

    ok = feasible_mask(window)
    spare = spare_slots(window.rider_load, window.rider_capacity)
    found = []
    for choice in product(range(-1, window.num_riders), repeat=window.num_orders):
        assigned = np.asarray(choice, dtype=np.int64)
        taken = assigned[assigned >= 0]
        if (
            all(ok[o, r] for o, r in enumerate(choice) if r >= 0)
            and (np.bincount(taken, minlength=window.num_riders) <= spare).all()
        ):
            found.append(assigned)
    return found


@pytest.mark.parametrize("seed", range(6))
def test_the_minutes_oracle_serves_the_most_orders_in_the_fewest_minutes_by_enumeration(
    seed: int,
) -> None:
    """On windows small enough to try every assignment (5 orders, 4 riders of one free slot
    each, hard constraints as drawn): the oracle serves as many orders as any assignment can,
    and no assignment serving as many has fewer expected minutes."""
    import dataclasses

    world = simulator.city_worlds()["chengdu"]
    window = simulator.generate_window(np.random.default_rng(seed), 5, 4, config=world)
    window = dataclasses.replace(
        window, rider_load=np.zeros(4, np.int32), rider_capacity=np.ones(4, np.int32)
    )
    decision = evaluation_policies.minutes_oracle_policy(window, world)
    every = _every_assignment(window)
    most = max(int((a >= 0).sum()) for a in every)
    assert int((decision.assigned >= 0).sum()) == most
    best = min(_expected_total(window, a, world) for a in every if int((a >= 0).sum()) == most)
    assert _expected_total(window, decision.assigned, world) == pytest.approx(best, rel=1e-12)


def test_with_stacking_the_minutes_oracle_is_within_the_slot_models_bound() -> None:
    """Riders with several free slots: the oracle is exact for its slot model (the k-th
    slot at k orders of extra load), a lower bound on any assignment the simulator stacks in
    creation order; its own assignment, stacked so, is within a few tenths of a minute of
    the enumerated best (4 orders, 3 riders)."""
    import dataclasses

    world = simulator.city_worlds()["shanghai"]
    for seed in range(4):
        window = simulator.generate_window(np.random.default_rng(seed), 4, 3, config=world)
        window = dataclasses.replace(
            window, rider_load=np.zeros(3, np.int32), rider_capacity=np.full(3, 3, np.int32)
        )
        decision = evaluation_policies.minutes_oracle_policy(window, world)
        every = _every_assignment(window)
        most = max(int((a >= 0).sum()) for a in every)
        assert int((decision.assigned >= 0).sum()) == most
        best = min(_expected_total(window, a, world) for a in every if int((a >= 0).sum()) == most)
        assert best <= _expected_total(window, decision.assigned, world) <= best + 0.5


def test_order_objective_by_hand() -> None:
    """The resolver's weighted utility per order, an unassigned order adding 0: latency
    1 / (1 + eta / 30), on-time clipped to [0, 1], cost 1 / (1 + cost / 10), weights
    normalised to their sum."""
    from dispatch_service.domain.scoring import ResolverSettings

    served = np.array([[30.0, 0.8, 10.0], [60.0, 1.3, 30.0]])
    # 0.725 x 0.5 + 0.075 x 0.8 + 0.2 x 0.5 = 0.5225; 0.725 / 3 + 0.075 x 1 + 0.2 x 0.25
    expected = (0.5225 + (0.725 / 3 + 0.075 + 0.05)) / 4
    for weights in ((0.725, 0.075, 0.2), (1.45, 0.15, 0.4)):
        value = evaluation_policies.order_objective(served, 4, weights, ResolverSettings())
        assert value == pytest.approx(expected, abs=1e-12)
    nothing = np.zeros((0, 3))
    assert evaluation_policies.order_objective(nothing, 3, (1, 0, 0), ResolverSettings()) == 0.0
    with pytest.raises(ValueError, match="at least one order"):
        evaluation_policies.order_objective(nothing, 0, (1, 0, 0), ResolverSettings())


def test_ground_truth_objective_scores_the_decision_at_the_simulator_s_expectations() -> None:
    """An order served alone by a rider is scored at its noise-free expectation; a second
    order of the same rider at one more order of load (the simulator's stacking), which
    costs it time; nothing served scores 0."""
    from dispatch_service.domain.scoring import ResolverSettings

    window = simulator.generate_window(np.random.default_rng(7), 2, 3)
    city = simulator.DEFAULT_CITY
    judge = evaluation_policies.ground_truth_objective(weights=(1.0, 0.0, 0.0))
    none = np.full(2, -1, dtype=np.int64)
    assert judge(window, city, none, np.zeros(2, dtype=np.int64)) == 0.0
    alone = np.array([0, -1], dtype=np.int64)
    eta, _, _ = simulator.expected_outcome(window, [0], [0], city)
    by_hand = (1.0 / (1.0 + eta[0] / ResolverSettings().eta_scale_minutes)) / 2
    assert judge(window, city, alone, np.zeros(2, dtype=np.int64)) == pytest.approx(by_hand)
    carried = judge(window, city, alone, np.array([1, 0], dtype=np.int64))
    assert carried < by_hand
