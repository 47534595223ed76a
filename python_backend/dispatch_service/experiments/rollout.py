"""A progressive rollout's decisions: hold, advance to the next share, promote, or roll back,
from the outcomes of the step in force. Pure: the controller (`ops`) reads the evidence,
calls `decide`, writes the fleet revision the action asks for and stores the new state.

Each step is its own experiment over the decisions made while that step was in force
(canary arm: the rollout's version; control: the stable version; the plan's city or every
city). A fresh experiment per step keeps the arms comparable when the share changes during
the day (a cumulative one would give the canary more of the later hours). The error is
split over the steps that have a control arm, so the whole rollout rolls back a version no
worse than stable with probability at most ``alpha`` (`analysis` splits each step's share
over its metrics in turn).

The rules, at every look:

1. a guardrail declared worse (beyond its margin) rolls back at once, whatever the step's age;
2. a step is held until both arms have ``min_outcomes`` and ``min_seconds`` have passed;
   the arms hold only decisions made at least ``maturity_s`` before the latest event the
   platform reported (their outcomes are in), so a step lasts at least that long;
3. then the next step's share is written, except that going to 100 % is the promotion, which
   also needs the primary metric shown non-inferior (its interval below its margin).
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from dispatch_service.experiments.analysis import (
    DEFAULT_ALPHA,
    METRIC_NAMES,
    ArmOutcomes,
    Experiment,
    MetricSpec,
    metric_specs,
)
from dispatch_service.experiments.sequential import Interval, SequentialMonitor

__all__ = [
    "DEFAULT_GUARDRAILS",
    "DEFAULT_PRIMARY",
    "DEFAULT_STEPS",
    "Action",
    "ActionKind",
    "Phase",
    "RolloutPlan",
    "RolloutState",
    "decide",
]

DEFAULT_STEPS: Final = (1, 5, 25, 50, 100)
# Guardrails a delivery platform will not let a version worsen: broken promises, orders left
# without a rider, and the minutes customers wait. The primary metric (what promotes) is the
# minutes customers wait.
DEFAULT_GUARDRAILS: Final = ("late", "unassigned", "delivery_minutes")
DEFAULT_PRIMARY: Final = "delivery_minutes"
# At 1 % of a city's orders, 300 outcomes per arm arrive within hours on a busy city and are
# enough for the normal approximation; 10 minutes spans several dispatch windows per user.
DEFAULT_MIN_OUTCOMES: Final = 300
DEFAULT_MIN_SECONDS: Final = 600.0
# A decision is judged only once its outcome must be in: an order is delivered, cancelled or
# reassigned within three hours of its dispatch (the simulator's slowest deliveries, a bad
# assignment at peak, take nearly that), and reported minutes later. Judging younger
# decisions would compare only the fast deliveries (the slow ones not reported yet), which
# hides exactly the version that makes deliveries slower.
DEFAULT_MATURITY_S: Final = 10_800.0


class Phase(enum.StrEnum):
    RUNNING = "running"
    PAUSED = "paused"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled back"
    ABORTED = "aborted"

    @property
    def final(self) -> bool:
        return self in (Phase.PROMOTED, Phase.ROLLED_BACK, Phase.ABORTED)


class ActionKind(enum.StrEnum):
    HOLD = "hold"
    ADVANCE = "advance"
    PROMOTE = "promote"
    ROLL_BACK = "roll back"


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    reason: str
    percent: int | None = None  # ADVANCE: the next share
    # the figures the step was judged on (`Experiment.report`), for the audit trail; an
    # advance starts the next step's experiment afresh, so the state no longer holds them
    evidence: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class RolloutPlan:
    """What the operator asked for; checked whole before anything is written."""

    version: int
    steps: tuple[int, ...] = DEFAULT_STEPS
    city: str | None = None
    min_outcomes: int = DEFAULT_MIN_OUTCOMES
    min_seconds: float = DEFAULT_MIN_SECONDS
    guardrails: tuple[str, ...] = DEFAULT_GUARDRAILS
    primary: str = DEFAULT_PRIMARY
    margins: Mapping[str, float] = field(default_factory=dict)
    alpha: float = DEFAULT_ALPHA
    maturity_s: float = DEFAULT_MATURITY_S

    def __post_init__(self) -> None:
        if not isinstance(self.version, int) or self.version < 1:
            raise ValueError(f"version must be a model version >= 1, got {self.version!r}")
        steps = self.steps
        if len(steps) < 2:
            raise ValueError("steps: at least two shares, the last 100 (e.g. 1,5,25,50,100)")
        if any(not isinstance(s, int) or not 1 <= s <= 100 for s in steps):
            raise ValueError(f"steps must be whole percents in 1..100, got {list(steps)}")
        if any(b <= a for a, b in itertools.pairwise(steps)):
            raise ValueError(f"steps must increase, got {list(steps)}")
        if steps[-1] != 100:
            raise ValueError(f"the last step must be 100 (the promotion), got {steps[-1]}")
        if self.min_outcomes < 1:
            raise ValueError(f"min_outcomes must be >= 1, got {self.min_outcomes}")
        if not (math.isfinite(self.min_seconds) and self.min_seconds >= 0):
            raise ValueError(f"min_seconds must be a number >= 0, got {self.min_seconds}")
        if not (math.isfinite(self.maturity_s) and self.maturity_s >= 0):
            raise ValueError(f"maturity_s must be a number >= 0, got {self.maturity_s}")
        for name in (*self.guardrails, self.primary):
            if name not in METRIC_NAMES:
                raise ValueError(f"metric {name!r}: not one of {', '.join(METRIC_NAMES)}")
        metric_specs(self.margins)  # refuses unknown names and bad margins
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")

    @property
    def metrics(self) -> tuple[MetricSpec, ...]:
        wanted = {*self.guardrails, self.primary}
        return tuple(spec for spec in metric_specs(self.margins) if spec.name in wanted)

    @property
    def alpha_per_step(self) -> float:
        return self.alpha / (len(self.steps) - 1)

    def new_experiment(self) -> Experiment:
        return Experiment(self.metrics, self.alpha_per_step)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "steps": list(self.steps),
            "city": self.city,
            "min_outcomes": self.min_outcomes,
            "min_seconds": self.min_seconds,
            "guardrails": list(self.guardrails),
            "primary": self.primary,
            "margins": dict(self.margins),
            "alpha": self.alpha,
            "maturity_s": self.maturity_s,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutPlan:
        return cls(
            version=int(data["version"]),
            steps=tuple(int(s) for s in data["steps"]),
            city=data.get("city"),
            min_outcomes=int(data["min_outcomes"]),
            min_seconds=float(data["min_seconds"]),
            guardrails=tuple(data["guardrails"]),
            primary=str(data["primary"]),
            margins={str(k): float(v) for k, v in dict(data.get("margins", {})).items()},
            alpha=float(data["alpha"]),
            maturity_s=float(data.get("maturity_s", DEFAULT_MATURITY_S)),
        )


def _monitors_to_dict(experiment: Experiment) -> dict[str, Any]:
    def number(value: float) -> float | None:
        return value if math.isfinite(value) else None

    return {
        name: {
            "interval": [number(m.interval.lower), number(m.interval.upper)],
            "estimate": number(m.interval.estimate),
            "p_value": m.p_value,
            "looks": m.looks,
        }
        for name, m in experiment.monitors.items()
    }


def _monitors_from_dict(plan: RolloutPlan, data: Mapping[str, Any]) -> Experiment:
    experiment = plan.new_experiment()

    def bound(value: Any, default: float) -> float:
        return default if value is None else float(value)

    monitors = {}
    for spec in experiment.metrics:
        saved = data.get(spec.name)
        if saved is None:
            continue
        lower, upper = saved["interval"]
        monitors[spec.name] = SequentialMonitor(
            tau=spec.mixing_scale,
            alpha=experiment.alpha_per_metric,
            binary=spec.binary,
            interval=Interval(
                bound(saved.get("estimate"), math.nan),
                bound(lower, -math.inf),
                bound(upper, math.inf),
            ),
            p_value=float(saved["p_value"]),
            looks=int(saved["looks"]),
        )
    return replace(experiment, monitors=monitors)


@dataclass(frozen=True)
class RolloutState:
    """Where a rollout stands: kept in the store after every look, so a restarted
    controller resumes at the same step with the same running intervals."""

    plan: RolloutPlan
    phase: Phase = Phase.RUNNING
    step: int = 0
    step_started_at: float = 0.0
    experiment: Experiment | None = None
    last_action: Action | None = None

    @property
    def percent(self) -> int:
        return self.plan.steps[self.step]

    def current_experiment(self) -> Experiment:
        return self.experiment if self.experiment is not None else self.plan.new_experiment()

    def to_dict(self) -> dict[str, Any]:
        experiment = self.current_experiment()
        return {
            "plan": self.plan.to_dict(),
            "phase": str(self.phase),
            "step": self.step,
            "percent": self.percent,
            "step_started_at": self.step_started_at,
            "monitors": _monitors_to_dict(experiment),
            "evidence": experiment.report(),
            "last_action": None
            if self.last_action is None
            else {
                "kind": str(self.last_action.kind),
                "reason": self.last_action.reason,
                "percent": self.last_action.percent,
                "evidence": list(self.last_action.evidence),
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RolloutState:
        plan = RolloutPlan.from_dict(data["plan"])
        action = data.get("last_action")
        return cls(
            plan=plan,
            phase=Phase(data["phase"]),
            step=int(data["step"]),
            step_started_at=float(data["step_started_at"]),
            experiment=_monitors_from_dict(plan, data.get("monitors", {})),
            last_action=None
            if action is None
            else Action(
                ActionKind(action["kind"]),
                str(action["reason"]),
                action.get("percent"),
                tuple(action.get("evidence", ())),
            ),
        )


def _describe(results: Sequence[Any]) -> str:
    parts = []
    for result in results:
        lower, upper = result.interval.lower, result.interval.upper
        parts.append(
            f"{result.spec.name} worse by {result.interval.estimate:+.4g} "
            f"[{lower:+.4g}, {upper:+.4g}] beyond its margin {result.spec.margin:g}"
        )
    return "; ".join(parts)


def decide(
    state: RolloutState, *, now: float, treatment: ArmOutcomes, control: ArmOutcomes
) -> tuple[Action, RolloutState]:
    """The action for this look and the state after it (the step's experiment updated;
    the step and phase moved as the action says). ``treatment`` and ``control`` are the
    step's totals so far."""
    if state.phase is not Phase.RUNNING:
        action = Action(ActionKind.HOLD, f"the rollout is {state.phase}")
        return action, replace(state, last_action=action)
    plan = state.plan
    experiment = state.current_experiment().look(treatment, control)
    looked = replace(state, experiment=experiment)
    judged = tuple(experiment.report())
    breaches = experiment.breaches(plan.guardrails)
    if breaches:
        action = Action(
            ActionKind.ROLL_BACK, f"guardrail breached: {_describe(breaches)}", evidence=judged
        )
        return action, replace(looked, phase=Phase.ROLLED_BACK, last_action=action)
    waited = now - state.step_started_at
    fewest = min(treatment.orders, control.orders)
    if fewest < plan.min_outcomes or waited < plan.min_seconds:
        action = Action(
            ActionKind.HOLD,
            f"step {state.step + 1} at {state.percent}%: {fewest} of {plan.min_outcomes} "
            f"outcomes per arm, {waited:.0f} of {plan.min_seconds:.0f} s",
            evidence=judged,
        )
        return action, replace(looked, last_action=action)
    following = plan.steps[state.step + 1]
    if following == 100:
        primary = experiment.results[plan.primary]
        if not primary.non_inferior:
            action = Action(
                ActionKind.HOLD,
                f"waiting for {plan.primary} to be shown non-inferior "
                f"(interval upper {primary.interval.upper:+.4g} >= margin {primary.spec.margin:g})",
                evidence=judged,
            )
            return action, replace(looked, last_action=action)
        action = Action(
            ActionKind.PROMOTE,
            f"{plan.primary} non-inferior ({primary.interval.estimate:+.4g} "
            f"[{primary.interval.lower:+.4g}, {primary.interval.upper:+.4g}]), "
            "no guardrail breached",
            100,
            evidence=judged,
        )
        return action, replace(
            looked, phase=Phase.PROMOTED, step=len(plan.steps) - 1, last_action=action
        )
    action = Action(
        ActionKind.ADVANCE,
        f"no guardrail breached after {fewest} outcomes per arm and {waited:.0f} s",
        following,
        evidence=judged,
    )
    return action, replace(
        looked,
        step=state.step + 1,
        step_started_at=now,
        experiment=plan.new_experiment(),
        last_action=action,
    )
