"""Read and change the canary settings of a running server's `dispatch_router`, live.

`dispatch_fused` (the one-process entry point) routes with the same settings: when it is
loaded, `apply_router_settings` reloads it with them too, after the router, so that both
entry points answer a user from the same version. The change is atomic across the two: if
dispatch_fused refuses it, the router is put back to the configuration it ran with before.

The settings live in dispatch_router's config ``parameters`` (`routing_settings.RouterSettings`).
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
    if model == FUSED_MODEL_NAME:
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
    http_url: str, admin_key: str | None = None, timeout_s: float = 30.0
) -> RouterSettings | None:
    """The routing settings dispatch_fused runs with now, or None when it is not loaded."""
    try:
        if not ready_versions(http_url, FUSED_MODEL_NAME, admin_key, timeout_s):
            return None
    except ModelControlError as exc:
        raise RouterControlError(
            f"cannot read whether {FUSED_MODEL_NAME} is loaded: {exc}"
        ) from None
    config = _current_config(http_url, timeout_s, FUSED_MODEL_NAME)
    try:
        return _routing_of(FUSED_MODEL_NAME, parameters_from_model_config(config))
    except (SettingsError, ValueError) as exc:
        raise RouterControlError(
            f"{FUSED_MODEL_NAME} runs with unreadable settings: {exc}"
        ) from None


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
    """Reload dispatch_router and dispatch_fused (when loaded) with `settings`, live: both
    or neither. Raise RouterControlError if refused.

    Builds each override from the configuration the model runs with now, so every other
    field (instances, inputs, outputs) stays as it is. The router goes first; when
    dispatch_fused then refuses (or whether it is loaded cannot be read), the router is
    loaded again with the configuration it ran with before, so the two entry points never
    route with different settings. Returns once Triton reports the loads done and both
    models read back the new settings.
    """
    router_before = _current_config(http_url, timeout_s)
    _apply(http_url, ROUTER_MODEL_NAME, settings, admin_key, timeout_s)
    try:
        try:
            fused_loaded = bool(ready_versions(http_url, FUSED_MODEL_NAME, admin_key, timeout_s))
        except ModelControlError as exc:
            raise RouterControlError(
                f"whether {FUSED_MODEL_NAME} is loaded could not be read ({exc})", exc.status
            ) from None
        if fused_loaded:
            _apply(http_url, FUSED_MODEL_NAME, settings, admin_key, timeout_s)
    except RouterControlError as exc:
        _put_back(http_url, router_before, admin_key, timeout_s, exc)
        raise RouterControlError(
            f"{exc}; {ROUTER_MODEL_NAME} was put back to its previous settings", exc.status
        ) from None


def _put_back(
    http_url: str,
    config: Mapping[str, Any],
    admin_key: str | None,
    timeout_s: float,
    cause: RouterControlError,
) -> None:
    """Reload the router with the configuration it ran with before a failed change."""
    try:
        load_model(http_url, ROUTER_MODEL_NAME, config, admin_key=admin_key, timeout_s=timeout_s)
    except ModelControlError as exc:
        raise RouterControlError(
            f"{cause}; putting {ROUTER_MODEL_NAME} back failed too ({exc}): the two entry "
            "points may now route with different settings",
            exc.status,
        ) from None
    logger.warning(
        json.dumps(
            {"event": "router_settings_restored", "server": http_url, "cause": str(cause)},
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
