"""The rollout's decisions at each look, on arms drawn with known differences."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dispatch_service.experiments.analysis import ArmOutcomes
from dispatch_service.experiments.rollout import (
    ActionKind,
    Phase,
    RolloutPlan,
    RolloutState,
    decide,
)


def _arm(
    rng: np.random.Generator, n: int, *, minutes: float = 30.0, late: float = 0.1
) -> ArmOutcomes:
    return ArmOutcomes().add_columns(
        {
            "delivery_minutes": rng.normal(minutes, 6.0, n),
            "late": (rng.random(n) < late).astype(float),
            "unassigned": (rng.random(n) < 0.01).astype(float),
            "eta_abs_error": np.abs(rng.normal(0.0, 4.0, n)),
        }
    )


PLAN = RolloutPlan(version=2, steps=(1, 5, 50, 100), min_outcomes=500, min_seconds=60.0)


def test_an_equal_version_advances_step_by_step_and_is_promoted() -> None:
    rng = np.random.default_rng(7)
    state = RolloutState(PLAN, step_started_at=0.0)
    percents, now = [state.percent], 0.0
    for _ in range(10):
        now += 30.0
        # before min_seconds: held whatever the evidence
        action, held = decide(state, now=now, treatment=_arm(rng, 9000), control=_arm(rng, 9000))
        assert action.kind is ActionKind.HOLD and held.step == state.step
        now += 60.0
        action, state = decide(state, now=now, treatment=_arm(rng, 9000), control=_arm(rng, 9000))
        if action.kind is ActionKind.PROMOTE:
            break
        assert action.kind is ActionKind.ADVANCE, action.reason
        assert state.step_started_at == now and state.percent == action.percent
        percents.append(state.percent)
    assert percents == [1, 5, 50]
    assert state.phase is Phase.PROMOTED
    assert action.percent == 100


def test_a_step_is_held_until_each_arm_has_its_outcomes() -> None:
    rng = np.random.default_rng(1)
    state = RolloutState(PLAN, step_started_at=0.0)
    action, after = decide(state, now=1_000.0, treatment=_arm(rng, 120), control=_arm(rng, 9000))
    assert action.kind is ActionKind.HOLD
    assert "120 of 500 outcomes per arm" in action.reason
    assert after.step == 0 and after.phase is Phase.RUNNING


def test_a_breached_guardrail_rolls_back_at_once() -> None:
    rng = np.random.default_rng(2)
    state = RolloutState(PLAN, step_started_at=0.0)
    # ten more late points: found before the step's minimum time
    action, after = decide(
        state, now=5.0, treatment=_arm(rng, 1000, late=0.2), control=_arm(rng, 4000)
    )
    assert action.kind is ActionKind.ROLL_BACK
    assert action.reason.startswith("guardrail breached: late worse by")
    assert after.phase is Phase.ROLLED_BACK
    again, _ = decide(after, now=10.0, treatment=_arm(rng, 10), control=_arm(rng, 10))
    assert again.kind is ActionKind.HOLD and "rolled back" in again.reason


def test_promotion_waits_for_the_primary_metric() -> None:
    rng = np.random.default_rng(3)
    state = RolloutState(PLAN, step=2, step_started_at=0.0)  # at 50 %, next is 100
    # half a minute slower: within no guardrail's breach yet, but not non-inferior either
    action, after = decide(
        state, now=100.0, treatment=_arm(rng, 600, minutes=30.5), control=_arm(rng, 600)
    )
    assert action.kind is ActionKind.HOLD
    assert "delivery_minutes to be shown non-inferior" in action.reason
    assert after.phase is Phase.RUNNING


def test_the_state_survives_a_round_trip_through_json() -> None:
    rng = np.random.default_rng(4)
    state = RolloutState(PLAN, step=1, step_started_at=10.0)
    _, state = decide(state, now=20.0, treatment=_arm(rng, 200), control=_arm(rng, 200))
    restored = RolloutState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert restored.plan == state.plan
    assert (restored.phase, restored.step, restored.step_started_at) == (Phase.RUNNING, 1, 10.0)
    assert restored.last_action == state.last_action
    for name, monitor in state.current_experiment().monitors.items():
        again = restored.current_experiment().monitors[name]
        assert (again.p_value, again.looks) == (monitor.p_value, monitor.looks)
        assert again.interval.lower == monitor.interval.lower
        assert again.interval.upper == monitor.interval.upper


def test_a_paused_rollout_only_holds() -> None:
    rng = np.random.default_rng(5)
    state = RolloutState(PLAN, phase=Phase.PAUSED)
    action, after = decide(state, now=1e6, treatment=_arm(rng, 9000), control=_arm(rng, 9000))
    assert action.kind is ActionKind.HOLD and after.step == 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"version": 0}, "version must be a model version"),
        ({"steps": (100,)}, "at least two shares"),
        ({"steps": (0, 100)}, "whole percents in 1..100"),
        ({"steps": (5, 120)}, "whole percents in 1..100"),
        ({"steps": (5, 5, 100)}, "must increase"),
        ({"steps": (1, 50)}, "the last step must be 100"),
        ({"min_outcomes": 0}, "min_outcomes must be >= 1"),
        ({"min_seconds": float("nan")}, "min_seconds must be a number"),
        ({"guardrails": ("speed",)}, "metric 'speed'"),
        ({"primary": "happiness"}, "metric 'happiness'"),
        ({"margins": {"late": -1.0}}, "margin must be a number > 0"),
        ({"alpha": 0.0}, "alpha must be in"),
    ],
)
def test_bad_plans_are_refused_by_name(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RolloutPlan(**{"version": 2, **changes})  # type: ignore[arg-type]
