"""Triton Python-backend adapters: pb_utils tensors in, library calls, tensors out.

The names below are re-exported lazily (module `__getattr__`): importing the package
loads none of its modules, so `import dispatch_service.serving.<module>` stays as light as
that module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatch_service.core.lazy import lazy_exports

if TYPE_CHECKING:
    from dispatch_service.serving.fused_adapter import (
        FusedDispatchAdapter,
        fused_adapter_for,
    )
    from dispatch_service.serving.responder import TritonResponder
    from dispatch_service.serving.router_adapter import (
        DispatchRouterAdapter,
        router_adapter_for,
    )
    from dispatch_service.serving.step_adapters import (
        TritonBatchedModelAdapter,
        TritonEncoderAdapter,
        TritonResolverAdapter,
        TritonStepAdapter,
    )

__all__ = [
    "DispatchRouterAdapter",
    "FusedDispatchAdapter",
    "TritonBatchedModelAdapter",
    "TritonEncoderAdapter",
    "TritonResolverAdapter",
    "TritonResponder",
    "TritonStepAdapter",
    "fused_adapter_for",
    "router_adapter_for",
]

# Hidden from the type checker, which reads the imports above: a misspelt name stays an
# error there instead of resolving to Any through __getattr__.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "fused_adapter": (
                "FusedDispatchAdapter",
                "fused_adapter_for",
            ),
            "router_adapter": (
                "DispatchRouterAdapter",
                "router_adapter_for",
            ),
            "responder": ("TritonResponder",),
            "step_adapters": (
                "TritonBatchedModelAdapter",
                "TritonEncoderAdapter",
                "TritonResolverAdapter",
                "TritonStepAdapter",
            ),
        },
    )
