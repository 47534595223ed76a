"""Experiments on delivery outcomes: anytime-valid comparison of two arms (`sequential`) and
the per-metric verdicts a rollout acts on (`analysis`). Pure numpy: no Triton, no store.

The names below are re-exported lazily (module `__getattr__`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatch_service.core.lazy import lazy_exports

if TYPE_CHECKING:
    from dispatch_service.experiments.analysis import (
        DEFAULT_METRICS,
        ArmOutcomes,
        Experiment,
        MetricSpec,
        Observation,
        Verdict,
    )
    from dispatch_service.experiments.sequential import ArmStats, SequentialMonitor

__all__ = [
    "DEFAULT_METRICS",
    "ArmOutcomes",
    "ArmStats",
    "Experiment",
    "MetricSpec",
    "Observation",
    "SequentialMonitor",
    "Verdict",
]

# Hidden from the type checker, which reads the imports above.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "analysis": (
                "DEFAULT_METRICS",
                "ArmOutcomes",
                "Experiment",
                "MetricSpec",
                "Observation",
                "Verdict",
            ),
            "sequential": ("ArmStats", "SequentialMonitor"),
        },
    )
