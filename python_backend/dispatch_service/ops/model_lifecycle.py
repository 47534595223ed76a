"""The model lifecycle of a live server: deploy a canary, roll back, read what is served.

The library behind `dispatch-admin` (`ops.admin`, the command line): no environment, no argv;
keys and folders come in as arguments.

``deploy`` verifies the version folder's signature (and the stable one's, every version it
will serve, and the served versions of the router and the in-process routing models, which
the new routing reloads: each refusal names the digest of the file found), checks the
candidate on the golden windows (`golden`), loads it next to the versions Triton serves now
(a config override naming the versions), then points the router's canary at it
(`router_control.apply_router_settings`). A failure at any step changes nothing -- a load
that fails leaves Triton as it was, a router update that fails is followed by a reload of the
versions served before -- and raises one line. It reads the served versions through the
model-repository API before the golden check, so a missing or wrong admin key fails at once.
``sign_repository`` signs every version folder a server could load (`signable_versions`).
``rollback`` sets the routing of both entry points back to the stable version only (no
canary, no shadow) and, with ``unload_canary``, unloads every other version (the canary,
or one an earlier rollback left loaded); it returns what the server then routes and serves,
read back from it. With a ``city`` (a registered city) ``deploy`` and ``rollback`` change
only that city's route (``RouterSettings.city_routes``; the stable version it is checked
against is the city's); without it they change every city's. `routed_line` and
`disagreements` are what ``status`` reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dispatch_contract.keys import ADMIN_KEY_ENV
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import ENCODER_MODEL, model_layout
from dispatch_service.core.settings import (
    SettingsError,
    load_settings,
    parameters_from_model_config,
)
from dispatch_service.core.signing import (
    Manifest,
    Outcome,
    SigningError,
    TrustedKeys,
    Verification,
    artifact_files,
    sign_version,
    verify_version,
)
from dispatch_service.domain.cities import CitySettings, RegistryError
from dispatch_service.ops import router_control
from dispatch_service.ops.golden import GoldenReport, GoldenSettings, check_candidate
from dispatch_service.ops.model_control import (
    ModelControlError,
    load_model,
    model_config,
    ready_versions,
    with_versions,
)
from dispatch_service.ops.verified_load import (
    LoadVerifier,
    read_config,
    refusal_fields,
    repository_models,
)
from dispatch_service.routing.settings import (
    IN_PROCESS_ROUTING_MODELS,
    ROUTER_MODEL_NAME,
    RouterSettings,
)

__all__ = [
    "DEPLOYABLE",
    "DeployRequest",
    "DeployResult",
    "LifecycleError",
    "RollbackResult",
    "UsageError",
    "city_suffix",
    "deploy",
    "disagreements",
    "registered_city",
    "rollback",
    "routed_line",
    "server_call",
    "sign_repository",
    "signable_versions",
]

DEPLOYABLE: Final = ("dispatch_model",)

T = TypeVar("T")


class UsageError(Exception):
    """Arguments, files or keys that cannot be used (exit 2)."""


class LifecycleError(Exception):
    """A check failed or the server refused (exit 1); the message is one line."""


def signable_versions(repository: Path) -> list[tuple[str, int]]:
    """Every version folder a server could load from ``repository``: (model, version).

    That is every numeric version folder of every model with a config, whatever its
    version policy says today (a deploy loads versions the policy does not serve, and
    `verify` checks every folder), except ensembles' (Triton reads nothing there) and folders
    with no files at all.
    """
    if not repository.is_dir():
        raise UsageError(f"{repository} is not a folder")
    found: list[tuple[str, int]] = []
    for name, entry in repository_models(repository).items():
        if entry.is_ensemble:
            continue
        for version in entry.versions:
            try:
                files = artifact_files(repository / name / str(version))
            except SigningError as exc:
                raise UsageError(f"{name} version {version}: {exc}") from None
            if files:
                found.append((name, version))
    return found


def sign_repository(
    repository: Path, private_key: Ed25519PrivateKey
) -> list[tuple[str, int, Manifest]]:
    """Sign every folder of `signable_versions`; returns what was signed, in order."""
    signed = []
    for model, version in signable_versions(repository):
        try:
            manifest = sign_version(repository / model / str(version), private_key)
        except (SigningError, OSError) as exc:
            raise UsageError(f"{model} version {version}: {exc}") from None
        signed.append((model, version, manifest))
    return signed


@dataclass(frozen=True)
class DeployRequest:
    http_url: str
    model: str
    version: int
    canary_percent: int
    repository: Path
    trusted: TrustedKeys
    admin_key: str | None = None
    golden: GoldenSettings = dataclasses.field(default_factory=GoldenSettings)
    profile: str = "cpu"  # whose config file to start from when the model is not loaded
    timeout_s: float = 300.0  # per server call (a model load included)
    city: str | None = None  # a registered city id: route the canary there only; None: every


@dataclass(frozen=True)
class DeployResult:
    stable: int
    canary: int
    canary_percent: int
    loaded_versions: tuple[int, ...]
    golden: GoldenReport
    city: str | None = None


def registered_city(
    http_url: str, city: str | None, timeout_s: float, repository: Path = MODEL_REPOSITORY
) -> str | None:
    """``city`` when the city registry the server's feature_encoder serves (its
    ``city_registry``; the repository's config when the server cannot say) holds it; None
    stays None (every city). UsageError naming an unknown city."""
    if city is None:
        return None
    try:
        config = model_config(http_url, "feature_encoder", timeout_s)
        parameters = parameters_from_model_config(config)
    except ModelControlError:
        file = model_layout(repository, ENCODER_MODEL).config
        parameters = config_parameters(file) if file.is_file() else {}
    try:
        ids = load_settings(CitySettings, parameters).registry().ids
    except (RegistryError, SettingsError) as exc:
        raise UsageError(f"--city {city}: the city registry cannot be read here: {exc}") from None
    if city not in ids:
        raise UsageError(f"--city {city}: no registered city has that id ({', '.join(ids)})")
    return city


def city_suffix(city: str | None) -> str:
    """`` in CITY`` for the lines people read; nothing for every city."""
    return f" in {city}" if city else ""


def _verified(repository: Path, model: str, version: int, trusted: TrustedKeys) -> Verification:
    folder = repository / model / str(version)
    if not folder.is_dir():
        raise LifecycleError(f"{model} version {version}: no folder {folder}")
    verdict = verify_version(folder, trusted)
    if verdict.outcome is not Outcome.VERIFIED:
        raise LifecycleError(_refusal(repository, verdict))
    return verdict


def _refusal(repository: Path, verdict: Verification) -> str:
    """One line: the refused version, why, and the digest of the files found."""
    fields = refusal_fields(repository, verdict)
    found = f"folder sha256 {fields['folder_sha256']}"
    if "file" in fields:
        found = f"{fields['file']} sha256 {fields['file_sha256']}; {found}"
    return f"{verdict.model} version {verdict.version} refused: {verdict.reason} ({found})"


def _verify_reloads(request: DeployRequest, wanted: tuple[int, ...]) -> None:
    """Every folder the deploy makes Triton read, verified from the files as they are now:
    each version of ``wanted`` (Triton reads a served version again when its folder changed)
    and the served versions of the router and the in-process routing models, which the new
    routing reloads (their model.py runs anew)."""
    for served in wanted:
        _verified(request.repository, request.model, served, request.trusted)
    verifier = LoadVerifier(request.repository, request.trusted)
    for name in (ROUTER_MODEL_NAME, *IN_PROCESS_ROUTING_MODELS):
        try:
            config = model_config(request.http_url, name, request.timeout_s)
        except ModelControlError:
            continue  # not loaded: the routing change does not load it
        check = verifier.check(name, config)
        if not check.clean:
            raise LifecycleError(_refusal(request.repository, check.refused[0]))


def server_call(what: str, call: Callable[[], T]) -> T:
    """``call()``, a server's refusal turned into a LifecycleError naming what failed."""
    try:
        return call()
    except ModelControlError as exc:  # RouterControlError too
        raise LifecycleError(f"{what}: {exc}") from None


def _current_config(request: DeployRequest) -> dict[str, Any]:
    """The config the model runs with now, or its file's when it is not loaded at all."""
    try:
        return model_config(request.http_url, request.model, request.timeout_s)
    except ModelControlError as exc:
        if exc.status != 400:  # 400: unknown or unavailable model; anything else is fatal
            raise LifecycleError(f"reading the model config: {exc}") from None
    return read_config(request.repository / request.model, request.profile)


def deploy(request: DeployRequest, report: Callable[[str], None] = print) -> DeployResult:
    """Verify, check on golden windows, load next to the stable version, route the canary."""
    if request.model not in DEPLOYABLE:
        raise UsageError(f"deploy supports {', '.join(DEPLOYABLE)}, not {request.model}")
    if not 0 <= request.canary_percent <= 100:
        raise UsageError(f"--canary-percent must lie in [0, 100], got {request.canary_percent}")
    url, key, model, version = request.http_url, request.admin_key, request.model, request.version
    timeout = request.timeout_s
    city = registered_city(url, request.city, timeout, request.repository)
    report(_verified(request.repository, model, version, request.trusted).line())
    settings = server_call(
        "reading the router settings",
        lambda: router_control.read_router_settings(url, key, timeout),
    )
    stable = int(settings.for_city(city).stable_version)
    if version == stable:
        raise LifecycleError(
            f"{model} version {version} is the stable version{city_suffix(city)} already"
        )
    try:  # the routing it will apply, checked before anything is loaded
        routed = settings.with_route(
            city, canary_version=version, canary_percent=request.canary_percent
        )
    except ValueError as exc:
        raise LifecycleError(f"the new routing breaks a rule: {exc}") from None
    report(_verified(request.repository, model, stable, request.trusted).line())
    # Before the golden check (tens of seconds): the model-repository endpoints answer 403
    # without the right admin key, and the deploy cannot load anything then.
    before = server_call(
        "reading the served versions (the model-repository API; --admin-key or "
        f"{ADMIN_KEY_ENV} when the server has one)",
        lambda: ready_versions(url, model, key, timeout),
    )
    wanted = tuple(sorted({*before, stable, version}))
    _verify_reloads(request, wanted)  # before the golden check: a refusal fails at once
    try:
        golden = check_candidate(request.repository, version, stable, request.golden)
    except Exception as exc:  # an artifact ONNX Runtime cannot run is a failed check
        raise LifecycleError(f"golden check could not run version {version}: {exc}") from None
    report(golden.summary())
    if not golden.passed:
        raise LifecycleError(f"golden check failed: {'; '.join(golden.problems)}")

    _verify_reloads(request, wanted)  # and again from the files as they are at the load
    config: dict[str, Any] | None = None
    if wanted != before:
        config = _current_config(request)
        server_call(
            f"loading {model} versions {list(wanted)}",
            lambda: load_model(url, model, with_versions(config or {}, wanted), key, timeout),
        )
        report(f"loaded {model} versions {list(wanted)}")
    canary = dataclasses.replace(routed, scoring_versions=wanted)
    try:
        router_control.apply_router_settings(url, canary, admin_key=key, timeout_s=timeout)
    except ModelControlError as exc:  # put the versions back as they were
        if config is not None and before:
            try:
                load_model(url, model, with_versions(config, before), key, timeout)
            except ModelControlError as restore:
                raise LifecycleError(
                    f"router update failed ({exc}); restoring versions {list(before)} "
                    f"failed too ({restore})"
                ) from None
        raise LifecycleError(f"router update failed: {exc}") from None
    return DeployResult(stable, version, request.canary_percent, wanted, golden, city)


@dataclass(frozen=True)
class RollbackResult:
    """What a rollback left, read back from the server after it."""

    stable: int
    removed_canary: int  # the canary routing had before; 0 when there was none
    unloaded: tuple[int, ...]  # versions this rollback unloaded
    loaded: tuple[int, ...]  # versions Triton serves now
    routing: RouterSettings  # the router's settings now
    city: str | None = None  # the city rolled back; None: every city

    def summary(self, model: str) -> str:
        """One line that says what is routed and what is loaded, as the server reports it."""
        before = (
            f"canary {self.removed_canary} no longer routed"
            if self.removed_canary
            else "there was no canary"
        )
        line = (
            f"rolled back {model}: every order{city_suffix(self.city)} routed to stable version "
            f"{self.stable} ({before}); loaded versions {list(self.loaded)}"
        )
        if self.unloaded:
            line += f" (unloaded {list(self.unloaded)})"
        routed = {self.stable, *self.routing.routed_versions()}
        extra = [v for v in self.loaded if v not in routed]
        if extra:
            line += (
                f"; {', '.join(map(str, extra))} still loaded and reachable by version tag "
                "(rollback --unload-canary unloads them)"
            )
        return line


def rollback(
    http_url: str,
    *,
    admin_key: str | None = None,
    model: str = "dispatch_model",
    unload_canary: bool = False,
    timeout_s: float = 300.0,
    city: str | None = None,
) -> RollbackResult:
    """Route everything to the stable version (no canary, no shadow); with ``unload_canary``
    unload every other version (the canary, or one an earlier rollback left loaded).

    ``city`` (a registered city id): only that city's orders go back to its stable version
    (its route's canary off; shadowing, a global setting, stays), and ``unload_canary``
    keeps every version another city is still routed to.

    Routing changes first (both entry points, `router_control.apply_router_settings`), with
    ``scoring_versions`` naming what stays loaded, then the versions are unloaded: no request
    is routed to a version while it goes away. The result is read back from the server.
    """
    city = registered_city(http_url, city, timeout_s)
    settings = server_call(
        "reading the router settings",
        lambda: router_control.read_router_settings(http_url, admin_key, timeout_s),
    )
    in_force = settings.for_city(city)
    stable, canary = int(in_force.stable_version), int(in_force.canary_version)
    served = server_call(
        "reading the served versions",
        lambda: ready_versions(http_url, model, admin_key, timeout_s),
    )
    try:
        stable_only = settings.with_route(city, canary_version=0, canary_percent=0)
    except ValueError as exc:
        raise LifecycleError(f"the new routing breaks a rule: {exc}") from None
    if city is None:
        stable_only = dataclasses.replace(stable_only, shadow_percent=0)
    routed = stable_only.routed_versions()
    kept = tuple(v for v in served if v in routed)
    keep = (kept or served) if unload_canary else served
    stable_only = dataclasses.replace(stable_only, scoring_versions=keep)
    server_call(
        "updating the router",
        lambda: router_control.apply_router_settings(http_url, stable_only, admin_key, timeout_s),
    )
    unloaded: tuple[int, ...] = ()
    if unload_canary and set(served) - set(keep):
        config = server_call(
            "reading the model config", lambda: model_config(http_url, model, timeout_s)
        )
        try:
            load_model(http_url, model, with_versions(config, keep), admin_key, timeout_s)
        except ModelControlError as exc:
            _still_served(
                http_url,
                routing=stable_only,
                served=served,
                admin_key=admin_key,
                timeout_s=timeout_s,
                cause=exc,
            )
        unloaded = tuple(sorted(set(served) - set(keep)))
    loaded = server_call(
        "reading the served versions back",
        lambda: ready_versions(http_url, model, admin_key, timeout_s),
    )
    now = server_call(
        "reading the router settings back",
        lambda: router_control.read_router_settings(http_url, admin_key, timeout_s),
    )
    return RollbackResult(stable, canary, unloaded, loaded, now, city)


def _still_served(
    http_url: str,
    *,
    routing: RouterSettings,
    served: tuple[int, ...],
    admin_key: str | None,
    timeout_s: float,
    cause: ModelControlError,
) -> None:
    """A failed unload: routing stays on the stable version, but says again that the other
    versions are served (they are), so status and the server agree; then fail."""
    truth = dataclasses.replace(routing, scoring_versions=served)
    try:
        router_control.apply_router_settings(http_url, truth, admin_key, timeout_s)
    except ModelControlError as exc:
        raise LifecycleError(
            f"unloading failed ({cause}) and the routing could not be told so ({exc}); "
            "run dispatch-admin status"
        ) from None
    raise LifecycleError(
        f"unloading failed ({cause}); every order is routed to stable version "
        f"{routing.stable_version}, versions {list(served)} stay loaded"
    )


def routed_line(settings: RouterSettings) -> str:
    """Where orders go under these settings, in words."""
    stable, canary = settings.stable_version, settings.canary_version
    routed = f"stable version {stable}"
    if canary and settings.serves(canary) and settings.canary_percent:
        routed += f", canary version {canary} for {settings.canary_percent}% of users"
    elif canary:
        routed += f" only (canary {canary} at {settings.canary_percent}%"
        routed += ", not served)" if not settings.serves(canary) else ")"
    else:
        routed += " only"
    if settings.shadow_percent and canary and settings.serves(canary):
        routed += f"; {settings.shadow_percent}% of requests shadow-scored"
    return routed


def disagreements(
    router: RouterSettings,
    followers: Mapping[str, RouterSettings | None],
    served: tuple[int, ...],
) -> list[str]:
    """Where the router, the in-process routing models (`followers`, by name; None: not
    loaded) and the loaded versions tell different stories."""
    problems = [
        f"{name} routes with other settings than {ROUTER_MODEL_NAME}"
        for name, settings in followers.items()
        if settings is not None and settings != router
    ]
    if router.scoring_versions and tuple(router.scoring_versions) != tuple(served):
        problems.append(
            f"routing assumes versions {list(router.scoring_versions)} are served, "
            f"Triton serves {list(served)}"
        )
    if router.stable_version not in served:
        problems.append(f"the stable version {router.stable_version} is not served")
    for route in router.city_routes:
        stable = router.for_city(route.city).stable_version
        if stable != router.stable_version and stable not in served:
            problems.append(f"the stable version {stable} of {route.city} is not served")
    return problems
