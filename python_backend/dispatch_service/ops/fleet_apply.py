"""One server made to serve a fleet state, through its own repository API.

`switch_state` loads the scoring versions the state names next to the served ones (each
folder verified first) and reloads both entry points with the new routing at once (both or
neither: `_route`); from its return every request is served as the state says.
`retire_versions` then unloads what the state no longer names, which no request reaches any
more. The watcher (`fleet_watch`) decides when; this module only does.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final

from dispatch_service.core.settings import SettingsError, parameters_from_model_config
from dispatch_service.ops import router_control
from dispatch_service.ops.fleet_state import FleetState
from dispatch_service.ops.model_control import (
    ModelControlError,
    load_model,
    model_config,
    ready_versions,
    with_versions,
)
from dispatch_service.ops.verified_load import LoadVerifier, refusal_fields
from dispatch_service.routing.settings import (
    FUSED_MODEL_NAME,
    ROUTER_MODEL_NAME,
    FusedSettings,
    RouterSettings,
)

__all__ = [
    "APPLY_TIMEOUT_S",
    "ApplyRefusedError",
    "Switch",
    "retire_versions",
    "switch_state",
]

APPLY_TIMEOUT_S: Final = 120.0


class ApplyRefusedError(Exception):
    """The document cannot be served here (a version's files do not verify); ``code`` is a
    short reason for metrics. Never retried for the same document."""

    def __init__(self, message: str, code: str = "version_refused") -> None:
        super().__init__(message)
        self.code = code


def _check_verified(verifier: LoadVerifier | None, model: str, config: dict[str, Any]) -> None:
    if verifier is None:
        return
    check = verifier.check(model, config)
    if check.refused:
        verdict = check.refused[0]
        fields = refusal_fields(verifier.repository, verdict)
        raise ApplyRefusedError(
            f"{verdict.model} version {verdict.version} refused: {verdict.reason} "
            f"(folder sha256 {fields['folder_sha256']})"
        )


@dataclass(frozen=True)
class Switch:
    """What `switch_state` did: ``changed`` False when the server served the state already;
    ``retire`` the scoring model's configuration without the versions the state no longer
    names (None when none is left over); ``seconds`` per phase."""

    changed: bool
    model: str
    retire: dict[str, Any] | None
    seconds: dict[str, float]


def switch_state(
    http_url: str,
    admin_key: str | None,
    state: FleetState,
    verifier: LoadVerifier | None,
    timeout_s: float = APPLY_TIMEOUT_S,
) -> Switch:
    """Make the server route by ``state``: from its return every request is served as the
    state says. The versions it no longer names stay loaded (no request reaches them) until
    `retire_versions`: unloading them is not on the way to serving the new state.

    Order: load the new versions next to the served ones, route (both entry points). Every
    folder a load reads is verified first; a refusal raises ApplyRefusedError before anything
    changed. A failed routing change puts the versions back.
    ModelControlError: the server refused or did not answer (the caller tries again).
    """
    clock = time.monotonic()
    seconds: dict[str, float] = {}
    model, wanted = state.model, state.versions
    served = ready_versions(http_url, model, admin_key, timeout_s)
    current = router_control.read_router_settings(http_url, admin_key, timeout_s)
    desired = state.router_settings(current.cpu_scoring)
    fused = router_control.read_fused_settings(http_url, admin_key, timeout_s)
    if served == wanted and current == desired and fused in (None, desired):
        return Switch(False, model, None, seconds)
    config = model_config(http_url, model, timeout_s)
    union = tuple(sorted({*served, *wanted}))
    loading = with_versions(config, union)
    _check_verified(verifier, model, loading)
    for name in (ROUTER_MODEL_NAME, FUSED_MODEL_NAME):  # their model.py runs anew
        try:
            _check_verified(verifier, name, model_config(http_url, name, timeout_s))
        except ModelControlError:
            continue  # not loaded: the routing change does not load it
    seconds["verify"] = round(time.monotonic() - clock, 3)
    if union != served:
        clock = time.monotonic()
        load_model(http_url, model, loading, admin_key, timeout_s)
        seconds["load"] = round(time.monotonic() - clock, 3)
    clock = time.monotonic()
    if current != desired or fused not in (None, desired):
        try:
            _route(http_url, desired, fused is not None, admin_key, timeout_s)
        except ModelControlError:
            if union != served and served:
                load_model(http_url, model, with_versions(config, served), admin_key, timeout_s)
            raise
        seconds["route"] = round(time.monotonic() - clock, 3)
    retire = None if union == wanted else with_versions(config, wanted)
    return Switch(True, model, retire, seconds)


def retire_versions(
    http_url: str, admin_key: str | None, switch: Switch, timeout_s: float = APPLY_TIMEOUT_S
) -> float:
    """Unload the versions ``switch`` left over; the seconds it took (0.0: none left).
    ModelControlError: the server refused; the versions stay loaded, unused, until the next
    state is applied (it unloads every version it does not name)."""
    if switch.retire is None:
        return 0.0
    clock = time.monotonic()
    load_model(http_url, switch.model, switch.retire, admin_key, timeout_s)
    return round(time.monotonic() - clock, 3)


def _route(
    http_url: str,
    settings: RouterSettings,
    fused_loaded: bool,
    admin_key: str | None,
    timeout_s: float,
) -> None:
    """Reload both entry points with ``settings`` at once (one wait for new instances, not
    two, as `router_control.apply_router_settings` does one after the other): both or
    neither, since when either load is refused the other is put back to the configuration it
    ran with. Returns once both read back the new settings."""
    names = (ROUTER_MODEL_NAME, FUSED_MODEL_NAME) if fused_loaded else (ROUTER_MODEL_NAME,)
    before = {name: model_config(http_url, name, timeout_s) for name in names}
    with ThreadPoolExecutor(max_workers=len(names), thread_name_prefix="route") as pool:
        loads = {
            name: pool.submit(
                load_model,
                http_url,
                name,
                router_control.router_config_with(before[name], settings),
                admin_key,
                timeout_s,
            )
            for name in names
        }
        failed = {name: exc for name, done in loads.items() if (exc := done.exception())}
    if failed:
        for name in names:
            if name not in failed:
                load_model(http_url, name, before[name], admin_key, timeout_s)
        name, exc = next(iter(failed.items()))
        raise router_control.RouterControlError(
            f"loading {name} with the new routing failed ({exc}); both entry points keep "
            "their previous routing"
        )
    for name in names:
        parameters = parameters_from_model_config(model_config(http_url, name, timeout_s))
        try:
            now = (
                FusedSettings.from_parameters(parameters).routing
                if name == FUSED_MODEL_NAME
                else RouterSettings.from_parameters(parameters)
            )
        except (SettingsError, ValueError) as exc:
            raise router_control.RouterControlError(f"{name} reads back: {exc}") from None
        if now != settings:
            raise router_control.RouterControlError(f"{name} reports other settings after loading")
