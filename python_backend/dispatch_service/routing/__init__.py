"""Canary routing, shadow scoring and the fallback chain.

Only the light settings are re-exported here: `routing.engine` (routing, shadow, fallback)
is imported from its module, so that reading a router's settings never loads the engine.

The names below are re-exported lazily (module `__getattr__`): importing the package
loads none of its modules, so `import dispatch_service.routing.<module>` stays as light as
that module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatch_service.core.lazy import lazy_exports

if TYPE_CHECKING:
    from dispatch_service.routing.settings import (
        FUSED_MODEL_NAME,
        IN_PROCESS_ROUTING_MODELS,
        PRIORITY_MODEL_NAME,
        ROUTER_MODEL_NAME,
        ROUTING_BUCKETS,
        SCORING_MODEL_NAME,
        FusedSettings,
        RouterSettings,
    )

__all__ = [
    "FUSED_MODEL_NAME",
    "IN_PROCESS_ROUTING_MODELS",
    "PRIORITY_MODEL_NAME",
    "ROUTER_MODEL_NAME",
    "ROUTING_BUCKETS",
    "SCORING_MODEL_NAME",
    "FusedSettings",
    "RouterSettings",
]

# Hidden from the type checker, which reads the imports above: a misspelt name stays an
# error there instead of resolving to Any through __getattr__.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "settings": (
                "FUSED_MODEL_NAME",
                "IN_PROCESS_ROUTING_MODELS",
                "PRIORITY_MODEL_NAME",
                "ROUTER_MODEL_NAME",
                "ROUTING_BUCKETS",
                "SCORING_MODEL_NAME",
                "FusedSettings",
                "RouterSettings",
            ),
        },
    )
