"""The steps as plain objects, the in-process pipeline, the fused model and the ONNX runner.

The names below are re-exported lazily (module `__getattr__`): importing the package
loads none of its modules, so `import dispatch_service.pipeline.<module>` stays as light as
that module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatch_service.core.lazy import lazy_exports

if TYPE_CHECKING:
    from dispatch_service.pipeline.dispatch_pipeline import (
        DispatchPipeline,
        repository_steps,
    )
    from dispatch_service.pipeline.fused import (
        FusedDispatch,
        FusedResult,
    )
    from dispatch_service.pipeline.onnx_runner import (
        OnnxScorer,
        OrtSettings,
    )
    from dispatch_service.pipeline.stacking import (
        StackedResolution,
        resolve_stack_aware,
    )
    from dispatch_service.pipeline.steps import (
        DispatchModelStep,
        FeatureEncoderStep,
        Step,
        TopKResolverStep,
    )

__all__ = [
    "DispatchModelStep",
    "DispatchPipeline",
    "FeatureEncoderStep",
    "FusedDispatch",
    "FusedResult",
    "OnnxScorer",
    "OrtSettings",
    "StackedResolution",
    "Step",
    "TopKResolverStep",
    "repository_steps",
    "resolve_stack_aware",
]

# Hidden from the type checker, which reads the imports above: a misspelt name stays an
# error there instead of resolving to Any through __getattr__.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "dispatch_pipeline": (
                "DispatchPipeline",
                "repository_steps",
            ),
            "fused": (
                "FusedDispatch",
                "FusedResult",
            ),
            "onnx_runner": (
                "OnnxScorer",
                "OrtSettings",
            ),
            "stacking": (
                "StackedResolution",
                "resolve_stack_aware",
            ),
            "steps": (
                "DispatchModelStep",
                "FeatureEncoderStep",
                "Step",
                "TopKResolverStep",
            ),
        },
    )
