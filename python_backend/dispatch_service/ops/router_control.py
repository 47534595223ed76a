"""Read and change the config parameters a running server's routing models load with, live:
the GPU monitor's path (`ops.gpu`) to the node's own settings (`NODE_PARAMETERS`:
``cpu_scoring``, ``bls_timeout_ms``, ``scoring_versions``).

Not the way to route: routing changes only as a signed fleet revision (`fleet_revisions`),
which the launcher writes to the live routing file that every entry point routes by
(`routing.live`); a model config holds no routing, and `apply_router_settings` refuses
settings whose routing is not the config's (`INITIAL_ROUTING`).

The in-process routing models (`IN_PROCESS_ROUTING_MODELS`: dispatch_fused, the one-process
entry point, and dispatch_priority, its priority lane) route with the same settings: each
one loaded is reloaded with them too, after the router, so that every entry point answers a
user from the same version. The change is atomic across them: if one refuses it, the models
already changed are put back to the configuration they ran with before.

The node's settings live in dispatch_router's config ``parameters`` (`RouterSettings`).
`apply_router_settings` takes the configuration the router runs with now, replaces those
parameters and loads the model with that configuration as an override
(``POST /v2/repository/models/dispatch_router/load {"parameters": {"config": ...}}``, with
header ``admin-key`` where the server has one). Triton builds the new router instances while
the old ones keep answering, then switches: no restart, no dropped request. A load Triton
refuses (bad settings fail the router's ``initialize``) leaves the old router serving and
raises `RouterControlError`.

An override stays until another override replaces it, the model is unloaded and loaded
again, or the server restarts: those go back to model_repository/dispatch_router/config.pbtxt.
A plain load of a model whose files did not change keeps the override (checked on 2.51).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from dispatch_service.core.settings import SettingsError, parameters_from_model_config
from dispatch_service.ops.model_control import (
    ModelControlError,
    load_model,
    model_config,
    ready_versions,
)
from dispatch_service.routing.settings import (
    FUSED_MODEL_NAME,
    IN_PROCESS_ROUTING_MODELS,
    NODE_PARAMETERS,
    ROUTER_MODEL_NAME,
    FusedSettings,
    RouterSettings,
)

__all__ = [
    "ROUTER_MODEL_NAME",
    "RouterControlError",
    "apply_router_settings",
    "read_fused_settings",
    "read_router_settings",
    "router_config_with",
]


logger = logging.getLogger(__name__)


class RouterControlError(ModelControlError):
    """Reading or changing the router settings failed; the previous settings keep serving."""


def _current_config(
    http_url: str, timeout_s: float, model: str = ROUTER_MODEL_NAME
) -> dict[str, Any]:
    try:
        return model_config(http_url, model, timeout_s)
    except ModelControlError as exc:
        raise RouterControlError(
            f"cannot read the {model} configuration from {http_url}: {exc}", exc.status
        ) from None


def _routing_of(model: str, parameters: dict[str, str]) -> RouterSettings:
    if model in IN_PROCESS_ROUTING_MODELS:
        return FusedSettings.from_parameters(parameters).routing
    return RouterSettings.from_parameters(parameters)


def read_router_settings(
    http_url: str, admin_key: str | None = None, timeout_s: float = 30.0
) -> RouterSettings:
    """The settings the server's router runs with now (from its model config endpoint).

    ``admin_key`` is accepted for symmetry: the config endpoint is not a model-repository
    endpoint, so a server with an admin key answers it without one.
    """
    del admin_key
    config = _current_config(http_url, timeout_s)
    try:
        return RouterSettings.from_parameters(parameters_from_model_config(config))
    except (SettingsError, ValueError) as exc:
        raise RouterControlError(
            f"{ROUTER_MODEL_NAME} runs with unreadable settings: {exc}"
        ) from None


def read_fused_settings(
    http_url: str,
    admin_key: str | None = None,
    timeout_s: float = 30.0,
    model: str = FUSED_MODEL_NAME,
) -> RouterSettings | None:
    """The routing settings an in-process routing model (default dispatch_fused) runs with
    now, or None when it is not loaded."""
    try:
        if not ready_versions(http_url, model, admin_key, timeout_s):
            return None
    except ModelControlError as exc:
        raise RouterControlError(f"cannot read whether {model} is loaded: {exc}") from None
    config = _current_config(http_url, timeout_s, model)
    try:
        return _routing_of(model, parameters_from_model_config(config))
    except (SettingsError, ValueError) as exc:
        raise RouterControlError(f"{model} runs with unreadable settings: {exc}") from None


def router_config_with(config: Mapping[str, Any], settings: RouterSettings) -> dict[str, Any]:
    """A copy of a router config (Triton's JSON form) whose parameters hold `settings`."""
    parameters = dict(config.get("parameters") or {})
    for key, value in settings.to_parameters().items():
        parameters[key] = {"string_value": value}
    return {**config, "parameters": parameters}


def apply_router_settings(
    http_url: str,
    settings: RouterSettings,
    admin_key: str | None = None,
    timeout_s: float = 120.0,
) -> None:
    """Reload dispatch_router and each loaded in-process routing model with `settings`,
    live: all or none. Raise RouterControlError if refused.

    Builds each override from the configuration the model runs with now, so every other
    field (instances, inputs, outputs) stays as it is. The router goes first; when a later
    model refuses (or whether it is loaded cannot be read), the models changed so far are
    loaded again with the configurations they ran with before, so the entry points never
    route with different settings. Returns once Triton reports the loads done and every
    model reads back the new settings.
    """
    if RouterSettings.from_parameters(settings.to_parameters()) != settings:
        raise RouterControlError(
            "a model config carries no routing: only a signed fleet revision changes it "
            "(dispatch-admin, docs/fleet.md); apply_router_settings changes "
            f"{', '.join(NODE_PARAMETERS)} only"
        )
    changed: list[tuple[str, dict[str, Any]]] = []
    try:
        for model in (ROUTER_MODEL_NAME, *IN_PROCESS_ROUTING_MODELS):
            if model != ROUTER_MODEL_NAME and not _loaded(http_url, model, admin_key, timeout_s):
                continue
            before = _current_config(http_url, timeout_s, model)
            _apply(http_url, model, settings, admin_key, timeout_s)
            changed.append((model, before))
    except RouterControlError as exc:
        for model, before in reversed(changed):
            _put_back(http_url, model, before, admin_key=admin_key, timeout_s=timeout_s, cause=exc)
        if changed:
            names = ", ".join(model for model, _ in changed)
            raise RouterControlError(
                f"{exc}; {names} put back to the previous settings", exc.status
            ) from None
        raise


def _loaded(http_url: str, model: str, admin_key: str | None, timeout_s: float) -> bool:
    try:
        return bool(ready_versions(http_url, model, admin_key, timeout_s))
    except ModelControlError as exc:
        raise RouterControlError(
            f"whether {model} is loaded could not be read ({exc})", exc.status
        ) from None


def _put_back(
    http_url: str,
    model: str,
    config: Mapping[str, Any],
    *,
    admin_key: str | None,
    timeout_s: float,
    cause: RouterControlError,
) -> None:
    """Reload `model` with the configuration it ran with before a failed change."""
    try:
        load_model(http_url, model, config, admin_key=admin_key, timeout_s=timeout_s)
    except ModelControlError as exc:
        raise RouterControlError(
            f"{cause}; putting {model} back failed too ({exc}): the entry points may now "
            "route with different settings",
            exc.status,
        ) from None
    logger.warning(
        json.dumps(
            {
                "event": "router_settings_restored",
                "model": model,
                "server": http_url,
                "cause": str(cause),
            },
            sort_keys=True,
        )
    )


def _apply(
    http_url: str, model: str, settings: RouterSettings, admin_key: str | None, timeout_s: float
) -> None:
    override = router_config_with(_current_config(http_url, timeout_s, model), settings)
    try:
        load_model(http_url, model, override, admin_key=admin_key, timeout_s=timeout_s)
    except ModelControlError as exc:
        raise RouterControlError(
            f"loading {model} with {asdict(settings)} failed ({exc}); "
            "its previous settings keep serving",
            exc.status,
        ) from None
    config = _current_config(http_url, timeout_s, model)
    try:
        now = _routing_of(model, parameters_from_model_config(config))
    except (SettingsError, ValueError) as exc:
        raise RouterControlError(f"{model} runs with unreadable settings: {exc}") from None
    if now != settings:
        raise RouterControlError(f"{model} reports {asdict(now)} after loading {asdict(settings)}")
    logger.info(
        json.dumps(
            {
                "event": "router_settings_applied",
                "model": model,
                "server": http_url,
                **asdict(settings),
            },
            sort_keys=True,
        )
    )
