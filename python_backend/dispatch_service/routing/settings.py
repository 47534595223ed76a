"""The routing settings of dispatch_router and dispatch_fused, apart from the routing itself.

Kept free of numpy and the model code, so the launcher (`verified_load`) and the live-change
tools (`router_control`) can read a config's routing without importing ONNX Runtime or SciPy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Final

from dispatch_service.core.settings import SettingsError, load_settings, reject_unknown

__all__ = [
    "FUSED_MODEL_NAME",
    "ROUTER_MODEL_NAME",
    "ROUTING_BUCKETS",
    "SCORING_MODEL_NAME",
    "FusedSettings",
    "RouterSettings",
    "parse_versions",
    "settings_record",
]

ROUTING_BUCKETS: Final = 100
# The repository's model names that routing settings and their tools refer to.
FUSED_MODEL_NAME: Final = "dispatch_fused"
ROUTER_MODEL_NAME: Final = "dispatch_router"
SCORING_MODEL_NAME: Final = "dispatch_model"  # the versioned ONNX model routing picks among


@dataclass(frozen=True)
class RouterSettings:
    """`dispatch_router` parameters (config.pbtxt); replaced live by a config-override load."""

    stable_version: int = 1  # the version every order gets without a rule, and the retry
    canary_version: int = 0  # 0 = no canary
    canary_percent: int = 0  # share of users (of 100 hash buckets) routed to the canary
    shadow_percent: int = 0  # share of requests also scored by the other version
    bls_timeout_ms: int = 2000  # per version call; a slower call counts as a failure
    # The scoring model's versions Triton serves, as the control plane loaded them (the
    # launcher, deploy, rollback write it with the versions); () = not stated: every version
    # may be called. Both entry points route over it (`policy.routable`).
    scoring_versions: tuple[int, ...] = ()
    # 1 while dispatch_model runs on CPU instances because no GPU of the node is healthy
    # (the GPU monitor's device-level L2, ops.gpu): orders the chosen version scored then
    # report FallbackLevel.CPU_SCORED. Set and cleared by the monitor, never by hand.
    cpu_scoring: int = 0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name == "scoring_versions":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        versions = self.scoring_versions
        if not isinstance(versions, tuple) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in versions
        ):
            raise ValueError(f"scoring_versions must be version numbers >= 1, got {versions!r}")
        if list(versions) != sorted(set(versions)):
            raise ValueError(f"scoring_versions must be ascending without repeats: {versions}")
        if self.stable_version < 1:
            raise ValueError(f"stable_version must be >= 1, got {self.stable_version}")
        if self.canary_version < 0:
            raise ValueError(f"canary_version must be >= 0 (0 = none), got {self.canary_version}")
        if self.canary_version == self.stable_version:
            raise ValueError("canary_version must differ from stable_version (or be 0)")
        for name in ("canary_percent", "shadow_percent"):
            value = getattr(self, name)
            if not 0 <= value <= ROUTING_BUCKETS:
                raise ValueError(f"{name} must be within [0, {ROUTING_BUCKETS}], got {value}")
        if self.canary_version == 0 and self.canary_percent > 0:
            raise ValueError("canary_percent > 0 needs a canary_version")
        if self.bls_timeout_ms < 1:
            raise ValueError(f"bls_timeout_ms must be >= 1, got {self.bls_timeout_ms}")
        if self.cpu_scoring not in (0, 1):
            raise ValueError(f"cpu_scoring must be 0 or 1, got {self.cpu_scoring}")

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> RouterSettings:
        """Parse config.pbtxt parameters; an unknown key or a bad value raises SettingsError."""
        reject_unknown(parameters, cls)
        plain = {k: v for k, v in parameters.items() if k != "scoring_versions"}
        settings = load_settings(cls, plain)
        if "scoring_versions" not in parameters:
            return settings
        versions = parse_versions("scoring_versions", parameters["scoring_versions"])
        try:
            return replace(settings, scoring_versions=versions)
        except ValueError as exc:
            raise SettingsError(f"{cls.__name__}: {exc}") from exc

    def to_parameters(self) -> dict[str, str]:
        """The config.pbtxt ``parameters`` map (string values) that reproduces these settings."""
        out = {name: str(value) for name, value in asdict(self).items()}
        out["scoring_versions"] = ",".join(str(v) for v in self.scoring_versions)
        return out

    def serves(self, version: int) -> bool:
        """Whether the scoring model serves ``version`` as far as these settings know."""
        return version >= 1 and (not self.scoring_versions or version in self.scoring_versions)


def parse_versions(name: str, text: str) -> tuple[int, ...]:
    """``"1,2"`` -> (1, 2); empty -> (); anything else raises SettingsError naming ``name``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not all(p.isdigit() and len(p) <= 9 for p in parts):
        raise SettingsError(f"parameter {name!r}: {text!r} is not a list of version numbers")
    return tuple(sorted({int(p) for p in parts}))


@dataclass(frozen=True)
class FusedSettings:
    """`dispatch_fused` parameters: the router's (`RouterSettings`) plus where models live."""

    routing: RouterSettings = field(default_factory=RouterSettings)
    scoring_model: str = SCORING_MODEL_NAME  # sibling folder holding <version>/model.onnx

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> FusedSettings:
        """Parse config.pbtxt parameters; unknown keys and bad values raise SettingsError."""
        routing = {k: v for k, v in parameters.items() if k != "scoring_model"}
        reject_unknown(routing, RouterSettings)
        scoring_model = parameters.get("scoring_model", cls.scoring_model)
        if not scoring_model or "/" in scoring_model or scoring_model.startswith("."):
            raise ValueError(f"scoring_model must be a model folder name, got {scoring_model!r}")
        return cls(RouterSettings.from_parameters(routing), scoring_model)

    def served_versions(self) -> tuple[int, ...]:
        """The versions this model reads when it loads: the stable one, the canary (if any),
        then every other version the scoring model serves (``scoring_versions``)."""
        canary = self.routing.canary_version
        first = (self.routing.stable_version, *((canary,) if canary else ()))
        return (*first, *(v for v in self.routing.scoring_versions if v not in first))


def settings_record(settings: RouterSettings, **context: Any) -> dict[str, Any]:
    """The structured log record of a router (re)load with these settings."""
    return {"event": "router_settings_loaded", **context, **asdict(settings)}
