"""Operations: the launcher, model control, verified loads, the admin CLI.

The names below are re-exported lazily (module `__getattr__`): importing the package
loads none of its modules, so `import dispatch_service.ops.<module>` stays as light as
that module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatch_service.core.lazy import lazy_exports

if TYPE_CHECKING:
    from dispatch_service.ops.child_process import ServerError
    from dispatch_service.ops.model_control import (
        ADMIN_KEY_HEADER,
        ModelControlError,
        load_model,
        unload_model,
    )
    from dispatch_service.ops.server import (
        TRUSTED_KEYS_ENV,
        Ports,
        ServerOptions,
        TritonRuntime,
        TritonServer,
    )
    from dispatch_service.ops.server_cli import ADMIN_KEY_ENV
    from dispatch_service.ops.verified_load import (
        LoadPlan,
        plan_load,
    )

__all__ = [
    "ADMIN_KEY_ENV",
    "ADMIN_KEY_HEADER",
    "TRUSTED_KEYS_ENV",
    "LoadPlan",
    "ModelControlError",
    "Ports",
    "ServerError",
    "ServerOptions",
    "TritonRuntime",
    "TritonServer",
    "load_model",
    "plan_load",
    "unload_model",
]

# Hidden from the type checker, which reads the imports above: a misspelt name stays an
# error there instead of resolving to Any through __getattr__.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "model_control": (
                "ADMIN_KEY_HEADER",
                "ModelControlError",
                "load_model",
                "unload_model",
            ),
            "child_process": ("ServerError",),
            "server": (
                "TRUSTED_KEYS_ENV",
                "Ports",
                "ServerOptions",
                "TritonRuntime",
                "TritonServer",
            ),
            "server_cli": ("ADMIN_KEY_ENV",),
            "verified_load": (
                "LoadPlan",
                "plan_load",
            ),
        },
    )
