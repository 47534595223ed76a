"""Stack-aware resolution, scored by the simulator's ground truth as an independent model:
the reported figures of every assigned pair must be the truth for the load that pair really
rides with (the rider's earlier new orders in the window)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS, PAIR_FEATURE_NAMES
from dispatch_service.domain.features import encode_window
from dispatch_service.domain.resolver import resolve, score_pairs
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.offline import simulator
from dispatch_service.pipeline.stacking import resolve_stack_aware

WEIGHTS = np.asarray(DEFAULT_OBJECTIVE_WEIGHTS, dtype=np.float64)
LOAD = PAIR_FEATURE_NAMES.index("rider_load")


def truth(
    window: DispatchWindow, rows: NDArray[np.int64], width: int, extra: object
) -> NDArray[np.float32]:
    candidates = encode_window(window).candidate_rider_index.reshape(-1)
    expected = simulator.expected_outcome(window, rows // width, candidates[rows], extra_load=extra)
    return np.stack(expected, axis=1).astype(np.float32)


def case(seed: int, riders: int) -> tuple[DispatchWindow, dict[str, object]]:
    window = simulator.generate_window(np.random.default_rng(seed), 48, riders)
    encoded = encode_window(window)
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
    }
    return window, args


@pytest.mark.parametrize("max_rounds", [1, 4])
def test_assigned_figures_are_the_truth_for_the_stacked_load(max_rounds: int) -> None:
    stacked_total = 0
    for seed in range(6):
        window, args = case(seed, riders=40)  # few riders: many stacked orders
        result = resolve_stack_aware(**args, max_rounds=max_rounds)  # type: ignore[arg-type]
        assigned = result.resolution.assigned_rider_index.astype(np.int64)
        rows = np.flatnonzero(assigned >= 0)
        extra = simulator.sequential_extra_load(window, assigned)[rows]
        stacked_total += int((extra > 0).sum())
        eta, ontime, cost = simulator.expected_outcome(
            window, rows, assigned[rows], extra_load=extra
        )
        np.testing.assert_allclose(result.assigned_objectives[rows, 0], eta, rtol=1e-5)
        np.testing.assert_allclose(result.assigned_objectives[rows, 1], ontime, atol=1e-6)
        np.testing.assert_allclose(result.assigned_objectives[rows, 2], cost, rtol=1e-5)
        own = score_pairs(result.assigned_objectives[rows], WEIGHTS).astype(np.float32)
        np.testing.assert_allclose(result.resolution.assigned_score[rows], own, rtol=1e-6)
    assert stacked_total > 20  # the case really stacks orders


def test_a_window_without_stacking_is_one_plain_solve() -> None:
    window, args = case(1, riders=300)
    # Capacity one: nobody can take two new orders, so nothing stacks.
    one = np.minimum(window.rider_load + 1, window.rider_capacity).astype(np.int32)
    args["rider_capacity"] = one
    result = resolve_stack_aware(**args)  # type: ignore[arg-type]
    plain = resolve(
        args["objectives"],
        args["candidate_rider_index"],
        window.rider_ids,  # type: ignore[arg-type]
        window.rider_load,
        one,
        WEIGHTS,
    )
    assert result.rounds == 1 and result.converged
    for name, value in plain.as_tensors().items():
        np.testing.assert_array_equal(result.resolution.as_tensors()[name], value)


def test_pipeline_wiring_runs_the_stack_aware_resolution() -> None:
    """Wiring: DispatchPipeline(stack_aware=True) answers what resolve_stack_aware does
    with the pipeline's own model, and differs from the plain pipeline on a stacked window."""
    from dispatch_service.domain.window import window_to_wire
    from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline

    window = simulator.generate_window(np.random.default_rng(2), 48, 40)
    tensors = window_to_wire(window)
    plain = DispatchPipeline.from_repository()
    aware = DispatchPipeline.from_repository(stack_aware=True)
    encoded = aware.encoder.run(tensors)
    scores = aware.model.scorer.infer(encoded["PAIR_FEATURES"])
    direct = resolve_stack_aware(
        scores,
        encoded["PAIR_FEATURES"],
        encoded["CANDIDATE_RIDER_INDEX"],
        window.created_at,
        window.rider_ids,
        window.rider_load,
        window.rider_capacity,
        WEIGHTS,
        lambda rows, features: aware.model.scorer.infer(features),
        aware.resolver.settings,
    ).resolution.as_wire_tensors()
    got = aware.run(tensors)
    for name, value in direct.items():
        np.testing.assert_array_equal(got[name], value)
    assert not np.array_equal(plain.run(tensors)["ASSIGNED_SCORE"], got["ASSIGNED_SCORE"])


Outcome = tuple[dict[str, NDArray[Any]], NDArray[np.float32], NDArray[np.float32], int, bool]


def reference(args: dict[str, object], max_rounds: int) -> Outcome:
    """The rule of the module docstring, written plainly: a full `resolve` each round."""
    from dataclasses import replace

    from dispatch_service.domain.stacking import (
        joining_extra_load,
        stacked_extra_load,
        with_extra_load,
    )

    candidates = np.asarray(args["candidate_rider_index"]).astype(np.int64)
    base = np.asarray(args["objectives"], dtype=np.float32)
    created, rescore = args["created_at"], args["rescore"]
    features: NDArray[np.float32] = args["features"]  # type: ignore[assignment]
    riders = (args["rider_ids"], args["rider_load"], args["rider_capacity"], WEIGHTS)

    def solve(objectives: NDArray[np.float32]) -> Any:
        return resolve(objectives, candidates, *riders)  # type: ignore[arg-type]

    def assigned_rows(resolution: Any) -> NDArray[np.int64]:
        assigned = resolution.assigned_rider_index.astype(np.int64)
        orders = np.flatnonzero(assigned >= 0)
        columns: NDArray[np.int64] = np.argmax(candidates[orders] == assigned[orders, None], axis=1)
        return orders * width + columns

    current, width = base.copy(), candidates.shape[1]
    flat = candidates.reshape(-1)
    valid = np.flatnonzero(flat >= 0)
    position = np.full(flat.size, -1)
    position[valid] = np.arange(valid.size)
    scored = np.zeros(valid.size, dtype=np.int64)
    spare = np.maximum(np.asarray(args["rider_capacity"]) - np.asarray(args["rider_load"]), 0)
    resolution, rounds, converged = solve(current), 1, False
    while True:
        assigned = resolution.assigned_rider_index
        joining = joining_extra_load(created, assigned, valid // width, flat[valid])  # type: ignore[arg-type]
        extra = np.maximum(scored, np.where(joining < spare[flat[valid]], joining, 0))
        rows = assigned_rows(resolution)
        extra[position[rows]] = stacked_extra_load(created, assigned)[rows // width]  # type: ignore[arg-type]
        stale = np.flatnonzero(scored != extra)
        if not stale.size:
            converged = True
            break
        scored[stale] = extra[stale]
        rows, load = valid[stale], extra[stale]
        current[rows[load == 0]] = base[rows[load == 0]]
        if load.any():
            stacked = rows[load > 0]
            loaded = with_extra_load(features[stacked], load[load > 0])
            current[stacked] = rescore(stacked, loaded)  # type: ignore[operator]
        if rounds >= max_rounds:
            # The last assignment, its assigned pairs' figures from `current`.
            rows = assigned_rows(resolution)
            score = score_pairs(current[rows], WEIGHTS).astype(np.float32)
            figures = {
                name: getattr(resolution, name).copy()
                for name in (
                    "assigned_score",
                    "topk_score",
                    "topk_eta_minutes",
                    "topk_ontime_probability",
                    "topk_cost",
                )
            }
            for row, value in zip(rows.tolist(), score.tolist(), strict=True):
                b = row // width
                figures["assigned_score"][b] = value
                slots = resolution.topk_rider_index[b].tolist()
                if assigned[b] in slots:
                    slot = slots.index(assigned[b])
                    figures["topk_score"][b, slot] = value
                    for name, got in zip(list(figures)[2:], current[row], strict=True):
                        figures[name][b, slot] = got
            resolution = replace(resolution, **figures)
            break
        resolution, rounds = solve(current), rounds + 1
    mine = np.zeros((candidates.shape[0], 3), dtype=np.float32)
    rows = assigned_rows(resolution)
    mine[rows // width] = current[rows]
    return resolution.as_tensors(), current, mine, rounds, converged


@pytest.mark.parametrize("max_rounds", [1, 2, 3, 4, 6])
def test_the_incremental_rounds_answer_as_one_full_resolve_per_round(max_rounds: int) -> None:
    """Checked once, one graph, Top-K ranked once: the same answer, byte for byte, as a full
    `resolve` per round, whether the rounds converge or run out (patched figures)."""
    outcomes = []
    for seed in range(4):
        _, args = case(seed, riders=40 + 30 * seed)
        result = resolve_stack_aware(**args, max_rounds=max_rounds)  # type: ignore[arg-type]
        tensors, current, mine, rounds, converged = reference(args, max_rounds)
        for name, value in tensors.items():
            np.testing.assert_array_equal(result.resolution.as_tensors()[name], value)
        np.testing.assert_array_equal(result.objectives, current)
        np.testing.assert_array_equal(result.assigned_objectives, mine)
        assert (result.rounds, result.converged) == (rounds, converged)
        outcomes.append(converged)
    assert max_rounds < 4 or set(outcomes) == {True, False}  # both endings really ran


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
