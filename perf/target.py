"""One judged figure (`Target`) and the small lookups every judging module shares.

Pure: reads a `perf.results.BenchResults`, measures nothing. `perf.targets` (the sweep's and
the storms' targets) and `perf.serving_targets` (open loop, rounds, single windows) build on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perf.results import BenchResults
from perf.stats import LevelStats

__all__ = [
    "Target",
    "at_level",
    "divide",
]


def divide(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, or None when either is missing or the denominator is not > 0."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def at_level(results: BenchResults, entry: str, size: str, concurrency: int) -> LevelStats | None:
    """The row of one series at one concurrency, if measured."""
    series = results.find(entry, size)
    return series.at(concurrency) if series else None


@dataclass(frozen=True)
class Target:
    """A measured figure against its goal.

    `robustness`: a check reported beside the targets (closed-loop storms), not a target.
    `invalid`: why the measurement cannot be judged (e.g. the load generator fell behind its
    schedule); an invalid target has no verdict whatever it measured.
    """

    name: str
    model: str  # the Triton model measured: "dispatch" (ensemble) or "dispatch_fused"
    measured: float | None
    limit: float
    at_most: bool  # True: measured <= limit passes; False: measured >= limit passes
    unit: str
    detail: str = ""
    robustness: bool = False
    invalid: str = ""

    @property
    def met(self) -> bool | None:
        if self.measured is None or self.invalid:
            return None
        return self.measured <= self.limit if self.at_most else self.measured >= self.limit

    @property
    def goal(self) -> str:
        return f"{'<=' if self.at_most else '>='} {self.limit:g}{self.unit}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "goal": self.goal,
            "measured": self.measured,
            "unit": self.unit,
            "met": self.met,
            "detail": self.detail,
            "robustness": self.robustness,
            "invalid": self.invalid,
        }
