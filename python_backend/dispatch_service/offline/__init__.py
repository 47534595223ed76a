"""Offline work, never on the request path: the simulated city, the baseline, evaluation.

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
        nearest_rider_assignment,
    )
    from dispatch_service.offline.evaluation import (
        EvaluationConfig,
        evaluate_policies,
        evaluate_policy,
    )
    from dispatch_service.offline.simulator import (
        DEFAULT_CITY,
        CityConfig,
        evaluate_assignment,
        expected_outcome,
        generate_window,
        sample_outcome,
    )

__all__ = [
    "DEFAULT_CITY",
    "CityConfig",
    "EvaluationConfig",
    "evaluate_assignment",
    "evaluate_policies",
    "evaluate_policy",
    "expected_outcome",
    "generate_window",
    "nearest_rider_assignment",
    "sample_outcome",
]

# Hidden from the type checker, which reads the imports above: a misspelt name stays an
# error there instead of resolving to Any through __getattr__.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "baseline": ("nearest_rider_assignment",),
            "evaluation": (
                "EvaluationConfig",
                "evaluate_policies",
                "evaluate_policy",
            ),
            "simulator": (
                "DEFAULT_CITY",
                "CityConfig",
                "evaluate_assignment",
                "expected_outcome",
                "generate_window",
                "sample_outcome",
            ),
        },
    )
