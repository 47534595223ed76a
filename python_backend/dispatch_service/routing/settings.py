"""The routing settings of dispatch_router and the in-process routing models, apart from the
routing itself.

Routing (stable and canary versions, the canary's and the shadow's shares, per-city routes)
is no model config parameter: it changes only as a signed fleet revision, which every entry
point reads from the launcher's live routing file (`routing.live`). Before a fleet's first
revision every entry point routes by `INITIAL_ROUTING`. A model config sets only what belongs
to its node (`NODE_PARAMETERS`).

Kept free of numpy and the model code, so the launcher (`verified_load`) and the live-change
tools (`router_control`) can read a config's settings without importing ONNX Runtime or SciPy.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import cached_property, lru_cache
from typing import Any, Final, TypedDict, Unpack

from dispatch_service.core.repository_layout import (
    FUSED_MODEL,
    PRIORITY_MODEL,
    ROUTER_MODEL,
    SCORING_MODEL,
)
from dispatch_service.core.settings import SettingsError, load_settings, reject_unknown

__all__ = [
    "CITY_ROUTE_FIELDS",
    "FUSED_MODEL_NAME",
    "INITIAL_ROUTING",
    "IN_PROCESS_ROUTING_MODELS",
    "NODE_PARAMETERS",
    "PRIORITY_MODEL_NAME",
    "ROUTER_MODEL_NAME",
    "ROUTING_BUCKETS",
    "ROUTING_DOCUMENT_FIELDS",
    "SCORING_MODEL_NAME",
    "CityRoute",
    "FusedSettings",
    "RouteValues",
    "RouterSettings",
    "parse_versions",
    "settings_record",
]

ROUTING_BUCKETS: Final = 100
# The repository's model names that routing settings and their tools refer to
# (`core.repository_layout` names every model).
FUSED_MODEL_NAME: Final = FUSED_MODEL
PRIORITY_MODEL_NAME: Final = PRIORITY_MODEL
# The models that run the scoring versions in their own process (`FusedSettings`) and route
# with the router's settings: every routing change reaches each of them.
IN_PROCESS_ROUTING_MODELS: Final = (FUSED_MODEL_NAME, PRIORITY_MODEL_NAME)
ROUTER_MODEL_NAME: Final = ROUTER_MODEL
SCORING_MODEL_NAME: Final = SCORING_MODEL  # the versioned ONNX model routing picks among
# The settings a city may set for its own windows (`CityRoute`); the others are global.
CITY_ROUTE_FIELDS: Final = ("stable_version", "canary_version", "canary_percent")
# The fields of the routing's JSON form (`RouterSettings.to_document`): every field but
# ``cpu_scoring``, which each node's GPU monitor sets for itself.
ROUTING_DOCUMENT_FIELDS: Final = (
    "stable_version",
    "canary_version",
    "canary_percent",
    "shadow_percent",
    "bls_timeout_ms",
    "scoring_versions",
    "city_routes",
)
# The `RouterSettings` fields a model config's parameters may set: the node's own. The GPU
# monitor changes the deadline and CPU scoring on its node (`ops.gpu`); the launcher names the
# scoring versions its server serves when it refused some (`ops.verified_load`). Every other
# field is routing.
NODE_PARAMETERS: Final = ("bls_timeout_ms", "cpu_scoring", "scoring_versions")
# A city id of a route: a word (the ids themselves are the registry's, `domain.cities`; the
# models check the routes' cities against it, `check_cities`).
_CITY_WORD: Final = re.compile(r"^[^\s:;,=]+$")


class RouteValues(TypedDict, total=False):
    """The `CITY_ROUTE_FIELDS` a route sets, by name."""

    stable_version: int
    canary_version: int
    canary_percent: int


@dataclass(frozen=True)
class CityRoute:
    """One city's own routing: the `CITY_ROUTE_FIELDS` it sets (None: the global value).

    Its windows are routed with the global settings and these values in place
    (`RouterSettings.for_city`); a user keeps the same bucket in every city.
    """

    city: str
    stable_version: int | None = None
    canary_version: int | None = None
    canary_percent: int | None = None

    def values(self) -> RouteValues:
        """The fields this route sets, by name."""
        out = RouteValues()
        if self.stable_version is not None:
            out["stable_version"] = self.stable_version
        if self.canary_version is not None:
            out["canary_version"] = self.canary_version
        if self.canary_percent is not None:
            out["canary_percent"] = self.canary_percent
        return out

    def without(self, names: Sequence[str]) -> CityRoute | None:
        """This route with ``names`` back to the global values; None when it sets nothing then."""
        kept = (None if name in names else getattr(self, name) for name in CITY_ROUTE_FIELDS)
        route = CityRoute(self.city, *kept)
        return route if route.values() else None


@dataclass(frozen=True)
class RouterSettings:
    """The routing every entry point applies (`to_document`: the fleet document's and the
    live routing file's form) and the node's own settings (`NODE_PARAMETERS`)."""

    stable_version: int = 1  # the version every order gets without a rule, and the retry
    canary_version: int = 0  # 0 = no canary
    canary_percent: int = 0  # share of users (of 100 hash buckets) routed to the canary
    shadow_percent: int = 0  # share of requests also scored by the other version
    bls_timeout_ms: int = 2000  # per version call; a slower call counts as a failure
    # The scoring model's versions Triton serves, as the control plane loaded them (the
    # launcher, deploy, rollback write it with the versions); () = not stated: the versions
    # the routing names count as served (`serves`). Both entry points route over it
    # (`policy.routable`).
    scoring_versions: tuple[int, ...] = ()
    # 1 while dispatch_model runs on CPU instances because no GPU of the node is healthy
    # (the GPU monitor's device-level L2, ops.gpu): orders the chosen version scored then
    # report FallbackLevel.CPU_SCORED. Set and cleared by the monitor, never by hand.
    cpu_scoring: int = 0
    # Per-city routes (`CityRoute`), one per city at most, ordered by city id; in a document
    # a list of objects: [{"city": "beijing", "canary_version": 2, "canary_percent": 10}].
    city_routes: tuple[CityRoute, ...] = ()

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name in ("scoring_versions", "city_routes"):
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
        self._check_city_routes()

    def _check_city_routes(self) -> None:
        """Each route names a city once, sets a field, and gives its windows settings that
        pass every rule above (checked by building them); kept in city order."""
        routes = self.city_routes
        if not isinstance(routes, tuple) or not all(isinstance(r, CityRoute) for r in routes):
            raise ValueError(f"city_routes must be a tuple of CityRoute, got {routes!r}")
        ordered = tuple(sorted(routes, key=lambda route: route.city))
        object.__setattr__(self, "city_routes", ordered)
        for before, route in zip((None, *ordered), ordered, strict=False):
            if not isinstance(route.city, str) or not _CITY_WORD.match(route.city):
                raise ValueError(f"city_routes: {route.city!r} is not a city id")
            if before is not None and before.city == route.city:
                raise ValueError(f"city_routes: {route.city} has more than one route")
            if not route.values():
                raise ValueError(f"city_routes {route.city}: sets none of {CITY_ROUTE_FIELDS}")
            try:
                replace(self, city_routes=(), **route.values())
            except (TypeError, ValueError) as exc:
                raise ValueError(f"city_routes {route.city}: {exc}") from None

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> RouterSettings:
        """`INITIAL_ROUTING` with a model config's `NODE_PARAMETERS`; SettingsError naming a
        routing key (only a fleet revision routes), an unknown key or a bad value."""
        routing = sorted(set(parameters) & {f.name for f in fields(cls)} - set(NODE_PARAMETERS))
        if routing:
            raise SettingsError(
                f"{cls.__name__}: parameter(s) {', '.join(routing)} are routing, which only a "
                "fleet revision changes (docs/fleet.md): remove them from the model config"
            )
        reject_unknown(parameters, cls)
        node = load_settings(_NodeParameters, parameters)
        versions = parse_versions("scoring_versions", parameters.get("scoring_versions", ""))
        try:
            return replace(INITIAL_ROUTING, **asdict(node), scoring_versions=versions)
        except ValueError as exc:
            raise SettingsError(f"{cls.__name__}: {exc}") from exc

    def to_parameters(self) -> dict[str, str]:
        """The config ``parameters`` (string values) of these settings: the
        `NODE_PARAMETERS` only (the routing is the fleet revision's)."""
        return {
            "bls_timeout_ms": str(self.bls_timeout_ms),
            "cpu_scoring": str(self.cpu_scoring),
            "scoring_versions": ",".join(str(v) for v in self.scoring_versions),
        }

    def to_document(self) -> dict[str, Any]:
        """The routing as JSON (`ROUTING_DOCUMENT_FIELDS`; city routes as objects): the one
        form the fleet document, the live routing file, status and the CLI use."""
        return {
            "stable_version": self.stable_version,
            "canary_version": self.canary_version,
            "canary_percent": self.canary_percent,
            "shadow_percent": self.shadow_percent,
            "bls_timeout_ms": self.bls_timeout_ms,
            "scoring_versions": list(self.scoring_versions),
            "city_routes": [{"city": r.city, **r.values()} for r in self.city_routes],
        }

    @classmethod
    def from_document(cls, document: Any, where: str = "routing") -> RouterSettings:
        """`to_document`'s form back (every field required, none other); SettingsError
        naming ``where``, the field and the rule it breaks."""
        if not isinstance(document, dict):
            raise SettingsError(f"{where} must be an object")
        unknown = sorted(set(document) - set(ROUTING_DOCUMENT_FIELDS))
        if unknown:
            raise SettingsError(
                f"{where}: unknown field(s) {', '.join(unknown)} "
                f"(fields: {', '.join(ROUTING_DOCUMENT_FIELDS)})"
            )
        missing = [name for name in ROUTING_DOCUMENT_FIELDS if name not in document]
        if missing:
            raise SettingsError(f"{where}: missing field(s) {', '.join(missing)}")
        values: dict[str, Any] = {}
        for name in ROUTING_DOCUMENT_FIELDS[:5]:
            values[name] = _whole(document[name], f"{where}.{name}")
        versions = document["scoring_versions"]
        if not isinstance(versions, list):
            raise SettingsError(f"{where}.scoring_versions must be a list of version numbers")
        values["scoring_versions"] = tuple(
            sorted({_whole(v, f"{where}.scoring_versions[{i}]") for i, v in enumerate(versions)})
        )
        routes = document["city_routes"]
        if not isinstance(routes, list):
            raise SettingsError(f"{where}.city_routes must be a list of objects")
        values["city_routes"] = tuple(
            _route_from_document(route, f"{where}.city_routes[{i}]")
            for i, route in enumerate(routes)
        )
        try:
            return cls(**values)
        except ValueError as exc:
            raise SettingsError(f"{where}: {exc}") from None

    def for_city(self, city: str | None) -> RouterSettings:
        """The settings in force for a window of ``city`` (a registry id): its route's values
        in place of the global ones; without a route (or city), these settings."""
        if city is None or not self.city_routes:
            return self
        return _settings_for_city(self, city)

    def check_cities(self, registered: Collection[str]) -> None:
        """ValueError naming the first route whose city is not one of ``registered`` (the
        city registry's ids): a route no window can match is a mistake, not a no-op."""
        for route in self.city_routes:
            if route.city not in registered:
                raise ValueError(
                    f"city_routes {route.city}: not a registered city ({', '.join(registered)})"
                )

    def route_of(self, city: str) -> CityRoute | None:
        """``city``'s own route, or None when it follows the global settings."""
        return next((route for route in self.city_routes if route.city == city), None)

    def with_route(self, city: str | None, **values: Unpack[RouteValues]) -> RouterSettings:
        """These settings with ``values`` (`CITY_ROUTE_FIELDS`) in force for ``city``'s
        windows only, or for every city (None: the global values, which no city then sets
        for itself). Raises ValueError naming the city when the result breaks a rule."""
        unknown = set(values) - set(CITY_ROUTE_FIELDS)
        if unknown:
            raise ValueError(f"not a per-city setting: {', '.join(sorted(unknown))}")
        if city is None:
            kept = (route.without(tuple(values)) for route in self.city_routes)
            routes = tuple(route for route in kept if route is not None)
            return replace(self, city_routes=routes, **values)
        old = self.route_of(city)
        merged: RouteValues = {**(old.values() if old else RouteValues()), **values}
        route = CityRoute(city, **merged)
        others = tuple(r for r in self.city_routes if r.city != city)
        return replace(self, city_routes=(*others, route))

    def routed_versions(self) -> tuple[int, ...]:
        """Every version some window may be routed to (stable and canary, globally and in
        each city), ascending."""
        found = set()
        for settings in (self, *(self.for_city(r.city) for r in self.city_routes)):
            found.add(settings.stable_version)
            if settings.canary_version:
                found.add(settings.canary_version)
        return tuple(sorted(found))

    def serves(self, version: int) -> bool:
        """Whether the scoring model serves ``version`` as far as these settings know: one of
        ``scoring_versions``, or while they are not stated one the routing names (so that a
        tag naming any other version is never called, with or without a revision)."""
        return version in self._served

    @cached_property
    def _served(self) -> frozenset[int]:
        """`serves`' versions, found once per settings (every window asks, settings are
        immutable; the cache is no field: equality and `asdict` ignore it)."""
        return frozenset(self.scoring_versions or self.routed_versions())


def _whole(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingsError(f"{where} must be a whole number, got {value!r}")
    return value


def _route_from_document(route: Any, where: str) -> CityRoute:
    if not isinstance(route, dict) or not isinstance(route.get("city"), str):
        raise SettingsError(f'{where} must be an object with a city id ("city")')
    unknown = sorted(set(route) - {"city", *CITY_ROUTE_FIELDS})
    if unknown:
        raise SettingsError(
            f"{where} ({route['city']}): unknown field(s) {', '.join(unknown)}; "
            f"a city sets {', '.join(CITY_ROUTE_FIELDS)}"
        )
    values = {
        name: _whole(route[name], f"{where}.{name}") for name in CITY_ROUTE_FIELDS if name in route
    }
    return CityRoute(route["city"], **values)


@lru_cache(maxsize=1024)
def _settings_for_city(settings: RouterSettings, city: str) -> RouterSettings:
    """`RouterSettings.for_city`, built once per settings and city (routing asks per window)."""
    route = settings.route_of(city)
    return settings if route is None else replace(settings, city_routes=(), **route.values())


def parse_versions(name: str, text: str) -> tuple[int, ...]:
    """``"1,2"`` -> (1, 2); empty -> (); anything else raises SettingsError naming ``name``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not all(p.isdigit() and len(p) <= 9 for p in parts):
        raise SettingsError(f"parameter {name!r}: {text!r} is not a list of version numbers")
    return tuple(sorted({int(p) for p in parts}))


@dataclass(frozen=True)
class _NodeParameters:
    """The `NODE_PARAMETERS` as a model config gives them (`RouterSettings.from_parameters`)."""

    bls_timeout_ms: int = RouterSettings.bls_timeout_ms
    cpu_scoring: int = RouterSettings.cpu_scoring


# The routing of every entry point before its fleet's first revision (revision 0,
# `ops.fleet_state.initial_state`): version 1 for every user; version 2 named the canary at
# 0 %, which a MODEL_VERSION_TAG "canary" reaches; no shadow; the versions served are the
# launcher's verified ones where it refused some, else the two the routing names (`serves`).
INITIAL_ROUTING: Final = RouterSettings(stable_version=1, canary_version=2)


@dataclass(frozen=True)
class FusedSettings:
    """`dispatch_fused` parameters: the router's (`RouterSettings`) plus where models live."""

    routing: RouterSettings = INITIAL_ROUTING
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
        then every other version some city is routed to and every other version the scoring
        model serves (``scoring_versions``)."""
        canary = self.routing.canary_version
        first = (self.routing.stable_version, *((canary,) if canary else ()))
        rest = (*self.routing.routed_versions(), *self.routing.scoring_versions)
        return (*first, *dict.fromkeys(v for v in rest if v not in first))


def settings_record(settings: RouterSettings, **context: Any) -> dict[str, Any]:
    """The structured log record of a router (re)load with these settings (the routing in
    its document form)."""
    record = {**settings.to_document(), "cpu_scoring": settings.cpu_scoring}
    return {"event": "router_settings_loaded", **context, **record}
