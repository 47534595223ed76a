"""What every layer may use: errors, typed settings, the config.pbtxt reader, metrics, paths,
the model repository's layout.

The names below are re-exported lazily (module `__getattr__`): importing the package
loads none of its modules, so `import dispatch_service.core.<module>` stays as light as
that module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatch_service.core.lazy import lazy_exports

if TYPE_CHECKING:
    from dispatch_service.core.errors import (
        RULE_CODES,
        DispatchInputError,
    )
    from dispatch_service.core.metrics import (
        InMemoryMetrics,
        MetricKind,
        MetricSpec,
        MetricsSink,
        NullMetrics,
        Observation,
    )
    from dispatch_service.core.model_config import (
        CONFIG_NAME,
        config_parameters,
        profile_config_path,
        read_config_dict,
        read_model_config,
        write_model_config,
    )
    from dispatch_service.core.paths import (
        MODEL_REPOSITORY,
        REPO_ROOT,
    )
    from dispatch_service.core.repository_layout import (
        ModelLayout,
        model_layout,
    )
    from dispatch_service.core.settings import (
        SettingsError,
        load_settings,
        parameters_from_model_config,
        reject_unknown,
    )
    from dispatch_service.core.signing import (
        SigningError,
        TrustedKeys,
        sign_version,
        verify_version,
    )

__all__ = [
    "CONFIG_NAME",
    "MODEL_REPOSITORY",
    "REPO_ROOT",
    "RULE_CODES",
    "DispatchInputError",
    "InMemoryMetrics",
    "MetricKind",
    "MetricSpec",
    "MetricsSink",
    "ModelLayout",
    "NullMetrics",
    "Observation",
    "SettingsError",
    "SigningError",
    "TrustedKeys",
    "config_parameters",
    "load_settings",
    "model_layout",
    "parameters_from_model_config",
    "profile_config_path",
    "read_config_dict",
    "read_model_config",
    "reject_unknown",
    "sign_version",
    "verify_version",
    "write_model_config",
]

# Hidden from the type checker, which reads the imports above: a misspelt name stays an
# error there instead of resolving to Any through __getattr__.
if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "errors": (
                "RULE_CODES",
                "DispatchInputError",
            ),
            "metrics": (
                "InMemoryMetrics",
                "MetricKind",
                "MetricSpec",
                "MetricsSink",
                "NullMetrics",
                "Observation",
            ),
            "model_config": (
                "CONFIG_NAME",
                "config_parameters",
                "profile_config_path",
                "read_config_dict",
                "read_model_config",
                "write_model_config",
            ),
            "paths": (
                "MODEL_REPOSITORY",
                "REPO_ROOT",
            ),
            "repository_layout": (
                "ModelLayout",
                "model_layout",
            ),
            "signing": (
                "SigningError",
                "TrustedKeys",
                "sign_version",
                "verify_version",
            ),
            "settings": (
                "SettingsError",
                "load_settings",
                "parameters_from_model_config",
                "reject_unknown",
            ),
        },
    )
