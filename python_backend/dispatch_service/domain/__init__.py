"""Domain rules: window validation, geo, feasibility, pair features, coverage, Top-K, assignment.

The names below are re-exported lazily (module `__getattr__`): importing the package
loads none of its modules, so `import dispatch_service.domain.<module>` stays as light as
that module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatch_service.core.lazy import lazy_exports

if TYPE_CHECKING:
    from dispatch_service.domain.assignment import assign
    from dispatch_service.domain.coverage import cover_maximum_assignment
    from dispatch_service.domain.feasibility import (
        THERMAL_EQUIPMENT_BIT,
        feasible,
        meets_hard_constraints,
        spare_slots,
    )
    from dispatch_service.domain.features import (
        EncodedWindow,
        EncoderSettings,
        encode_window,
        feasible_mask,
    )
    from dispatch_service.domain.resolver import Resolution, resolve
    from dispatch_service.domain.scoring import ResolverSettings, score_pairs
    from dispatch_service.domain.stacking import (
        joining_extra_load,
        stacked_extra_load,
        with_extra_load,
    )
    from dispatch_service.domain.window import (
        DispatchWindow,
        WindowLimits,
        check_objective_weights,
        parse_objective_weights,
        window_from_tensors,
        window_to_tensors,
    )

__all__ = [
    "THERMAL_EQUIPMENT_BIT",
    "DispatchWindow",
    "EncodedWindow",
    "EncoderSettings",
    "Resolution",
    "ResolverSettings",
    "WindowLimits",
    "assign",
    "check_objective_weights",
    "cover_maximum_assignment",
    "encode_window",
    "feasible",
    "feasible_mask",
    "joining_extra_load",
    "meets_hard_constraints",
    "parse_objective_weights",
    "resolve",
    "score_pairs",
    "spare_slots",
    "stacked_extra_load",
    "window_from_tensors",
    "window_to_tensors",
    "with_extra_load",
]

# Hidden from the type checker, which reads the imports above: a misspelt name stays an
# error there instead of resolving to Any through __getattr__.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "coverage": ("cover_maximum_assignment",),
            "feasibility": (
                "THERMAL_EQUIPMENT_BIT",
                "feasible",
                "meets_hard_constraints",
                "spare_slots",
            ),
            "features": (
                "EncodedWindow",
                "EncoderSettings",
                "encode_window",
                "feasible_mask",
            ),
            "stacking": (
                "joining_extra_load",
                "stacked_extra_load",
                "with_extra_load",
            ),
            "assignment": ("assign",),
            "resolver": ("Resolution", "resolve"),
            "scoring": ("ResolverSettings", "score_pairs"),
            "window": (
                "DispatchWindow",
                "WindowLimits",
                "check_objective_weights",
                "parse_objective_weights",
                "window_from_tensors",
                "window_to_tensors",
            ),
        },
    )
