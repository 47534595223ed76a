"""`dispatch-admin`: keys, signatures and the model lifecycle of a live server.

    dispatch-admin keygen [--out DIR] [--name NAME]       (default ~/keys/ops.key, ops.pub)
    dispatch-admin sign --model M --version N [--key FILE] [--model-repository R]
    dispatch-admin sign-repository [R] [--key FILE]
    dispatch-admin verify [R] --trusted-keys DIR
    dispatch-admin deploy --model dispatch_model --version N [--canary-percent P] [--city ID]
                          --url HOST:PORT --admin-key K --trusted-keys DIR
    dispatch-admin rollback --url HOST:PORT --admin-key K [--unload-canary] [--city ID]
    dispatch-admin status --url HOST:PORT --admin-key K

Secrets enter here and nowhere deeper: the signing key comes from ``--key FILE`` or the
environment variable ``DISPATCH_SIGNING_KEY`` (the PEM text), the admin key from
``--admin-key``, ``--admin-key-file``, ``DISPATCH_ADMIN_KEY`` or the file named by
``DISPATCH_ADMIN_KEY_FILE``, the trusted keys directory from ``--trusted-keys``
or ``DISPATCH_TRUSTED_KEYS``. The library functions take them as arguments.

``deploy`` verifies the version folder's signature (and the stable one's, every version it
will serve, and the served versions of the router and dispatch_fused, which the new routing
reloads: each refusal names the digest of the file found), checks the
candidate on the golden windows (`golden`), loads it next to the versions Triton serves now
(a config override naming the versions), then points the router's canary at it
(`router_control.apply_router_settings`). A failure at any step changes nothing -- a load
that fails leaves Triton as it was, a router update that fails is followed by a reload of the
versions served before -- and prints one line. It reads the served versions through the
model-repository API before the golden check, so a missing or wrong admin key fails at once.
``sign-repository`` signs every version folder a server could load (`signable_versions`).
``rollback`` sets the routing of both entry points back to the stable version only (no
canary, no shadow) and, with ``--unload-canary``, unloads every other version (the canary,
or one an earlier rollback left loaded); it prints what the server then routes and serves,
read back from it. With ``--city ID`` (a registered city) ``deploy`` and ``rollback`` change
only that city's route (``RouterSettings.city_routes``; the stable version it is checked
against is the city's); without it they change every city's. ``status`` prints one JSON
document: ``{"model", "serving_versions", "router", "dispatch_fused", "routed",
"routed_by_city", "disagreements"}``, and exits 1 when the entry points or the routing and
the loaded versions disagree.

Exit codes: 0 done, 1 a check failed or the server refused, 2 usage (bad arguments, a key
or folder that cannot be read).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dispatch_client.keys import KeyFileError, read_key
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY
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
    load_private_key,
    sign_version,
    verify_version,
    write_key_pair,
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
from dispatch_service.ops.server import ADMIN_KEY_ENV, TRUSTED_KEYS_ENV
from dispatch_service.ops.verified_load import (
    LoadVerifier,
    plan_load,
    read_config,
    refusal_fields,
    repository_models,
)
from dispatch_service.routing.settings import (
    FUSED_MODEL_NAME,
    ROUTER_MODEL_NAME,
    RouterSettings,
)

__all__ = [
    "ADMIN_KEY_ENV",
    "DEFAULT_KEY_DIR",
    "DEFAULT_KEY_NAME",
    "DEPLOYABLE",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "SIGNING_KEY_ENV",
    "TRUSTED_KEYS_ENV",
    "UNSIGNED",
    "DeployRequest",
    "DeployResult",
    "LifecycleError",
    "RollbackResult",
    "UsageError",
    "build_parser",
    "cmd_deploy",
    "cmd_keygen",
    "cmd_rollback",
    "cmd_sign",
    "cmd_sign_repository",
    "cmd_status",
    "cmd_verify",
    "deploy",
    "disagreements",
    "main",
    "plural",
    "registered_city",
    "rollback",
    "routed_line",
    "sign_repository",
    "signable_versions",
]

SIGNING_KEY_ENV: Final = "DISPATCH_SIGNING_KEY"
DEPLOYABLE: Final = ("dispatch_model",)
UNSIGNED: Final = frozenset({Outcome.MISSING_MANIFEST, Outcome.MISSING_SIGNATURE})
DEFAULT_KEY_DIR: Final = "~/keys"  # outside any checkout: a private key never lands in git
DEFAULT_KEY_NAME: Final = "ops"

T = TypeVar("T")

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2


class UsageError(Exception):
    """Arguments, files or keys that cannot be used (exit 2)."""


class LifecycleError(Exception):
    """A check failed or the server refused (exit 1); the message is one line."""


# ---- library-level operations (no environment, no argv) --------------------------------


def plural(count: int, noun: str) -> str:
    """``1 file``, ``2 files``: the CLI's lines are read by people."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


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
        file = repository / "feature_encoder" / "config.pbtxt"
        parameters = config_parameters(file) if file.is_file() else {}
    try:
        ids = load_settings(CitySettings, parameters).registry().ids
    except (RegistryError, SettingsError) as exc:
        raise UsageError(f"--city {city}: the city registry cannot be read here: {exc}") from None
    if city not in ids:
        raise UsageError(f"--city {city}: no registered city has that id ({', '.join(ids)})")
    return city


def _in_city(city: str | None) -> str:
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
    and the served versions of the router and dispatch_fused, which the new routing reloads
    (their model.py runs anew)."""
    for served in wanted:
        _verified(request.repository, request.model, served, request.trusted)
    verifier = LoadVerifier(request.repository, request.trusted)
    for name in (ROUTER_MODEL_NAME, FUSED_MODEL_NAME):
        try:
            config = model_config(request.http_url, name, request.timeout_s)
        except ModelControlError:
            continue  # not loaded: the routing change does not load it
        check = verifier.check(name, config)
        if not check.clean:
            raise LifecycleError(_refusal(request.repository, check.refused[0]))


def _server_call(what: str, call: Callable[[], T]) -> T:
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
    settings = _server_call(
        "reading the router settings",
        lambda: router_control.read_router_settings(url, key, timeout),
    )
    stable = int(settings.for_city(city).stable_version)
    if version == stable:
        raise LifecycleError(
            f"{model} version {version} is the stable version{_in_city(city)} already"
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
    before = _server_call(
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
        _server_call(
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
            f"rolled back {model}: every order{_in_city(self.city)} routed to stable version "
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
    settings = _server_call(
        "reading the router settings",
        lambda: router_control.read_router_settings(http_url, admin_key, timeout_s),
    )
    in_force = settings.for_city(city)
    stable, canary = int(in_force.stable_version), int(in_force.canary_version)
    served = _server_call(
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
    _server_call(
        "updating the router",
        lambda: router_control.apply_router_settings(http_url, stable_only, admin_key, timeout_s),
    )
    unloaded: tuple[int, ...] = ()
    if unload_canary and set(served) - set(keep):
        config = _server_call(
            "reading the model config", lambda: model_config(http_url, model, timeout_s)
        )
        try:
            load_model(http_url, model, with_versions(config, keep), admin_key, timeout_s)
        except ModelControlError as exc:
            _still_served(http_url, stable_only, served, admin_key, timeout_s, exc)
        unloaded = tuple(sorted(set(served) - set(keep)))
    loaded = _server_call(
        "reading the served versions back",
        lambda: ready_versions(http_url, model, admin_key, timeout_s),
    )
    now = _server_call(
        "reading the router settings back",
        lambda: router_control.read_router_settings(http_url, admin_key, timeout_s),
    )
    return RollbackResult(stable, canary, unloaded, loaded, now, city)


def _still_served(
    http_url: str,
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


# ---- command line ------------------------------------------------------------------------


def _trusted(args: argparse.Namespace) -> TrustedKeys:
    directory = args.trusted_keys or os.environ.get(TRUSTED_KEYS_ENV)
    if not directory:
        raise UsageError(f"--trusted-keys DIR (or {TRUSTED_KEYS_ENV}) is required")
    try:
        trusted = TrustedKeys.from_directory(Path(directory))
    except SigningError as exc:
        raise UsageError(str(exc)) from None
    if not len(trusted):
        raise UsageError(f"no trusted keys (*.pub) in {directory}")
    return trusted


def _admin_key(args: argparse.Namespace) -> str | None:
    """--admin-key, --admin-key-file, DISPATCH_ADMIN_KEY or the file DISPATCH_ADMIN_KEY_FILE."""
    try:
        return read_key(args.admin_key, ADMIN_KEY_ENV, file=args.admin_key_file)
    except KeyFileError as exc:
        raise UsageError(str(exc)) from None


def _signing_key_pem(args: argparse.Namespace) -> bytes:
    if args.key is not None:
        try:
            return Path(args.key).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read the signing key: {exc}") from None
    pem = os.environ.get(SIGNING_KEY_ENV)
    if not pem:
        raise UsageError(f"--key FILE or the environment variable {SIGNING_KEY_ENV} is required")
    return pem.encode()


def cmd_keygen(args: argparse.Namespace, out: TextIO) -> int:
    directory = Path(args.out).expanduser()
    private_path, public_path = directory / f"{args.name}.key", directory / f"{args.name}.pub"
    try:
        kid = write_key_pair(private_path, public_path)
    except (SigningError, OSError) as exc:
        raise UsageError(str(exc)) from None
    print(f"key id {kid}", file=out)
    print(f"private key {private_path} (mode 0600; never commit it)", file=out)
    print(f"public key  {public_path} (copy it into the trusted keys directory)", file=out)
    return EXIT_OK


def cmd_sign(args: argparse.Namespace, out: TextIO) -> int:
    try:
        key = load_private_key(_signing_key_pem(args))
    except SigningError as exc:
        raise UsageError(f"signing key: {exc}") from None
    folder = Path(args.model_repository) / args.model / str(args.version)
    try:
        manifest = sign_version(folder, key)
    except (SigningError, OSError) as exc:
        raise UsageError(str(exc)) from None
    print(
        f"signed {args.model} version {args.version}: {plural(len(manifest.files), 'file')}",
        file=out,
    )
    return EXIT_OK


def cmd_sign_repository(args: argparse.Namespace, out: TextIO) -> int:
    try:
        key = load_private_key(_signing_key_pem(args))
    except SigningError as exc:
        raise UsageError(f"signing key: {exc}") from None
    repository = Path(args.repository)
    signed = sign_repository(repository, key)
    for model, version, manifest in signed:
        print(f"signed {model} version {version}: {plural(len(manifest.files), 'file')}", file=out)
    models = len({model for model, _, _ in signed})
    print(
        f"signed {plural(len(signed), 'version folder')} of {plural(models, 'model')} "
        f"in {repository}",
        file=out,
    )
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    repository = Path(args.repository)
    if not repository.is_dir():
        raise UsageError(f"{repository} is not a folder")
    plan = plan_load(repository, _trusted(args), args.profile)
    for verdict in plan.verifications:
        print(verdict.line(), file=out)
    for name in plan.startup:
        print(f"{name}: loads", file=out)
    for name, versions in plan.restricted.items():
        if name in plan.scoring_versions:
            served = list(plan.scoring_versions[name])
            print(f"{name}: loads, routing over the verified versions {served} only", file=out)
        else:
            print(f"{name}: loads versions {list(versions)} only", file=out)
    for name in plan.deferred:
        print(f"{name}: loads (after the restricted models)", file=out)
    for name, reason in plan.refused.items():
        print(f"{name}: REFUSED: {reason}", file=out)
    unsigned = [v for v in plan.refused_versions if v.outcome in UNSIGNED]
    if unsigned:  # the usual cause on a fresh checkout; tampering is never "fixed" by signing
        print(
            f"{plural(len(unsigned), 'version folder')} unsigned; if their files are the ones "
            f"to trust, sign every loadable folder: dispatch-admin sign-repository "
            f"{repository} --key KEY (or make sign-all KEY=...)",
            file=out,
        )
    return EXIT_FAILED if plan.refused_versions or plan.refused else EXIT_OK


def cmd_deploy(args: argparse.Namespace, out: TextIO) -> int:
    try:
        golden = GoldenSettings(
            min_top1_agreement=args.min_top1_agreement,
            max_mean_eta_diff_minutes=args.max_eta_diff_minutes,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    request = DeployRequest(
        http_url=args.url,
        model=args.model,
        version=args.version,
        canary_percent=args.canary_percent,
        repository=Path(args.model_repository),
        trusted=_trusted(args),
        admin_key=_admin_key(args),
        golden=golden,
        timeout_s=args.timeout_s,
        city=args.city,
    )
    result = deploy(request, lambda line: print(line, file=out, flush=True))
    print(
        f"deployed {args.model} version {result.canary} as canary at "
        f"{result.canary_percent}%{_in_city(result.city)} (stable {result.stable})",
        file=out,
    )
    return EXIT_OK


def cmd_rollback(args: argparse.Namespace, out: TextIO) -> int:
    result = rollback(
        args.url, _admin_key(args), args.model, args.unload_canary, args.timeout_s, args.city
    )
    print(result.summary(args.model), file=out)
    return EXIT_OK


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    """What the server serves and routes, read from it, as one JSON document; exit 1 when the
    entry points or the routing and the loaded versions disagree."""
    key = _admin_key(args)
    settings = _server_call(
        "reading the router settings",
        lambda: router_control.read_router_settings(args.url, key, args.timeout_s),
    )
    fused = _server_call(
        "reading the dispatch_fused settings",
        lambda: router_control.read_fused_settings(args.url, key, args.timeout_s),
    )
    served = _server_call(
        "reading the served versions",
        lambda: ready_versions(args.url, args.model, key, args.timeout_s),
    )
    document = {
        "model": args.model,
        "serving_versions": list(served),
        "router": dataclasses.asdict(settings),
        "dispatch_fused": None if fused is None else dataclasses.asdict(fused),
        "routed": routed_line(settings),
        "routed_by_city": {
            route.city: routed_line(settings.for_city(route.city)) for route in settings.city_routes
        },
        "disagreements": disagreements(settings, fused, served),
    }
    print(json.dumps(document, indent=2, sort_keys=True), file=out)
    return EXIT_FAILED if document["disagreements"] else EXIT_OK


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
    fused: RouterSettings | None,
    served: tuple[int, ...],
) -> list[str]:
    """Where the router, dispatch_fused and the loaded versions tell different stories."""
    problems = []
    if fused is not None and fused != router:
        problems.append("dispatch_fused routes with other settings than dispatch_router")
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


class _HelpWithDefaults(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it has none or says it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.option_strings or action.nargs in ("?", "*")
        if (
            shown
            and "%(default)" not in text
            and action.default not in (None, False, argparse.SUPPRESS)
        ):
            text += " (default: %(default)s)"
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dispatch-admin",
        description="Signed models and their lifecycle on a live server. Exit codes: 0 done, "
        "1 a check failed or the server refused, 2 usage (bad arguments, unreadable keys or "
        "folders).",
        formatter_class=_HelpWithDefaults,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        made: argparse.ArgumentParser = commands.add_parser(
            name, help=text, description=text, formatter_class=_HelpWithDefaults
        )
        return made

    keygen = command("keygen", "make an Ed25519 key pair (refuses to overwrite one)")
    keygen.add_argument(
        "--out", default=DEFAULT_KEY_DIR, help="folder for NAME.key and NAME.pub (~ expands)"
    )
    keygen.add_argument("--name", default=DEFAULT_KEY_NAME, help="file name stem")
    keygen.set_defaults(handler=cmd_keygen)

    key_help = f"private key PEM file (else the PEM text in env {SIGNING_KEY_ENV})"
    sign = command("sign", "sign one model version folder")
    sign.add_argument("--model", required=True, help="model folder name, e.g. dispatch_model")
    sign.add_argument("--version", type=int, required=True, help="version folder number")
    sign.add_argument("--key", help=key_help)
    sign.add_argument("--model-repository", default=str(MODEL_REPOSITORY), help="repository")
    sign.set_defaults(handler=cmd_sign)

    sign_all = command(
        "sign-repository",
        "sign every version folder a server could load: each model's numeric folders, "
        "all but ensembles' and empty ones",
    )
    sign_all.add_argument(
        "repository", nargs="?", default=str(MODEL_REPOSITORY), help="model repository"
    )
    sign_all.add_argument("--key", help=key_help)
    sign_all.set_defaults(handler=cmd_sign_repository)

    trusted_help = f"folder of trusted *.pub keys (else env {TRUSTED_KEYS_ENV})"
    verify = command("verify", "verify every model version of a repository")
    verify.add_argument(
        "repository", nargs="?", default=str(MODEL_REPOSITORY), help="model repository"
    )
    verify.add_argument("--trusted-keys", help=trusted_help)
    verify.add_argument("--profile", default="cpu", help="config the server selects (cpu, gpu)")
    verify.set_defaults(handler=cmd_verify)

    def server_options(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--url",
            required=True,
            help="Triton HTTP endpoint: host:port, http://host:port or https://host:port",
        )
        command.add_argument(
            "--admin-key",
            help=f"admin key (else env {ADMIN_KEY_ENV}, else the file named by "
            f"{ADMIN_KEY_ENV}_FILE; `make serve` prints where it keeps one)",
        )
        command.add_argument("--admin-key-file", type=Path, help="file holding the admin key")
        command.add_argument("--model", default="dispatch_model", help="the routed model")
        command.add_argument(
            "--timeout-s", type=float, default=300.0, help="seconds per server call"
        )

    city_help = "a registered city id: change only its route (default: every city)"
    deploy_cmd = command("deploy", "verify, check and serve a canary version")
    server_options(deploy_cmd)
    deploy_cmd.add_argument("--version", type=int, required=True, help="the canary version")
    deploy_cmd.add_argument(
        "--canary-percent", type=int, default=10, help="share of users routed to the canary"
    )
    deploy_cmd.add_argument("--trusted-keys", help=trusted_help)
    deploy_cmd.add_argument(
        "--model-repository", default=str(MODEL_REPOSITORY), help="where the versions are"
    )
    deploy_cmd.add_argument(
        "--min-top1-agreement",
        type=float,
        default=GoldenSettings.min_top1_agreement,
        help="golden check: least share of orders with the same best rider",
    )
    deploy_cmd.add_argument(
        "--max-eta-diff-minutes",
        type=float,
        default=GoldenSettings.max_mean_eta_diff_minutes,
        help="golden check: largest mean |ETA difference|",
    )
    deploy_cmd.add_argument("--city", help=city_help)
    deploy_cmd.set_defaults(handler=cmd_deploy)

    rollback_cmd = command("rollback", "back to the stable version only")
    server_options(rollback_cmd)
    rollback_cmd.add_argument(
        "--unload-canary", action="store_true", help="also unload the canary version"
    )
    rollback_cmd.add_argument("--city", help=city_help)
    rollback_cmd.set_defaults(handler=cmd_rollback)

    status = command("status", "served versions and router settings, as one JSON document")
    server_options(status)
    status.set_defaults(handler=cmd_status)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage
        return EXIT_USAGE if exc.code else EXIT_OK
    handler: Callable[[argparse.Namespace, TextIO], int] = args.handler
    try:
        return handler(args, out)
    except UsageError as exc:
        print(f"usage error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LifecycleError as exc:
        print(f"{args.command} failed: {exc}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
