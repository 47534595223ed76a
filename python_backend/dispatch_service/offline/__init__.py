"""Offline work, never on the request path: the simulated city, baselines, evaluation.

`offline.training` and `offline.profiling` are run as modules (`make model`,
`make profile`) and imported from their own modules.

The names below are re-exported lazily (module `__getattr__`): importing the package
loads none of its modules, so `import dispatch_service.offline.<module>` stays as light as
that module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatch_service.core.lazy import lazy_exports

if TYPE_CHECKING:
    from dispatch_service.offline.baseline import (
        distance_matching_assignment,
        nearest_rider_assignment,
        rule_objectives,
    )
    from dispatch_service.offline.evaluation_policies import default_policies
    from dispatch_service.offline.evaluation_run import EvaluationConfig, evaluate
    from dispatch_service.offline.simulator import (
        DEFAULT_CITY,
        REGIMES,
        CityConfig,
        evaluate_assignment,
        expected_outcome,
        generate_regime_window,
        generate_window,
        order_outcomes,
        sample_outcome,
    )

__all__ = [
    "DEFAULT_CITY",
    "REGIMES",
    "CityConfig",
    "EvaluationConfig",
    "default_policies",
    "distance_matching_assignment",
    "evaluate",
    "evaluate_assignment",
    "expected_outcome",
    "generate_regime_window",
    "generate_window",
    "nearest_rider_assignment",
    "order_outcomes",
    "rule_objectives",
    "sample_outcome",
]

# Hidden from the type checker, which reads the imports above: a misspelt name stays an
# error there instead of resolving to Any through __getattr__.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "baseline": (
                "distance_matching_assignment",
                "nearest_rider_assignment",
                "rule_objectives",
            ),
            "evaluation_policies": ("default_policies",),
            "evaluation_run": ("EvaluationConfig", "evaluate"),
            "simulator": (
                "DEFAULT_CITY",
                "REGIMES",
                "CityConfig",
                "evaluate_assignment",
                "expected_outcome",
                "generate_regime_window",
                "generate_window",
                "order_outcomes",
                "sample_outcome",
            ),
        },
    )
