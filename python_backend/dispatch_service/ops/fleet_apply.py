"""One server made to serve a fleet state, through its own repository API.

`switch_state` loads the scoring versions the state names next to the served ones (each
folder verified first), then writes the state's routing to the file every entry point reads
(`routing.live`); from its return every request is served as the state says.
`retire_versions` then unloads what the state no longer names, which no request reaches any
more. The watcher (`fleet_watch`) decides when; this module only does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dispatch_service.ops.fleet_state import FleetState
from dispatch_service.ops.model_control import (
    ModelControlError,
    load_model,
    model_config,
    ready_versions,
    with_versions,
)
from dispatch_service.ops.verified_load import LoadVerifier, read_config
from dispatch_service.routing.live import read_routing_file, write_routing_file
from dispatch_service.routing.settings import RouterSettings

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
        fields = verifier.refusal_fields(verdict)
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
    *,
    routing_file: Path,
    profile: str = "cpu",
    timeout_s: float = APPLY_TIMEOUT_S,
) -> Switch:
    """Make the server route by ``state``: from its return every request is served as the
    state says. The versions it no longer names stay loaded (no request reaches them) until
    `retire_versions`: unloading them is not on the way to serving the new state.

    Order: load the new versions next to the served ones (every folder verified first; a
    refusal raises ApplyRefusedError before anything changed), then write the routing to
    ``routing_file``, which every entry point reads at its next `execute` (`routing.live`):
    a routing change reloads no model.
    ModelControlError: the server refused or did not answer (the caller tries again).
    """
    clock = time.monotonic()
    seconds: dict[str, float] = {}
    model, wanted = state.model, state.versions
    served = ready_versions(http_url, model, admin_key, timeout_s)
    routed = _routing_in(routing_file) == state.routing
    if served == wanted and routed:
        return Switch(False, model, None, seconds)
    config = _config(
        http_url, model, served, verifier=verifier, profile=profile, timeout_s=timeout_s
    )
    union = tuple(sorted({*served, *wanted}))
    loading = with_versions(config, union)
    _check_verified(verifier, model, loading)
    seconds["verify"] = round(time.monotonic() - clock, 3)
    if union != served:
        clock = time.monotonic()
        load_model(http_url, model, loading, admin_key, timeout_s)
        seconds["load"] = round(time.monotonic() - clock, 3)
    if not routed:
        clock = time.monotonic()
        try:
            write_routing_file(routing_file, state.routing, state.revision)
        except OSError as exc:
            raise ModelControlError(f"cannot write {routing_file}: {exc}") from None
        seconds["route"] = round(time.monotonic() - clock, 3)
    retire = None if union == wanted else with_versions(config, wanted)
    return Switch(True, model, retire, seconds)


def _config(
    http_url: str,
    model: str,
    served: tuple[int, ...],
    *,
    verifier: LoadVerifier | None,
    profile: str,
    timeout_s: float,
) -> dict[str, Any]:
    """The configuration to load ``model`` with: the one it runs with; while no version is
    served (unloaded, or every version failed) Triton has none to give, so the repository's
    file (``profile``'s), which the load's verification then covers like any other."""
    if served or verifier is None:
        return model_config(http_url, model, timeout_s)
    try:
        return read_config(verifier.repository / model, profile)
    except (OSError, ValueError) as exc:
        raise ModelControlError(
            f"{model} is not loaded and its config cannot be read: {exc}"
        ) from None


def _routing_in(routing_file: Path) -> RouterSettings | None:
    """The routing the file holds now (None: none written, or unreadable: write it anew)."""
    try:
        return read_routing_file(routing_file, RouterSettings())[0]
    except (OSError, ValueError):
        return None


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
