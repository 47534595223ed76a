"""`dispatch-admin deploy|rollback|status --state-store DIR`: the fleet's commands.

With ``--state-store`` (or ``DISPATCH_STATE_STORE``) ``deploy`` and ``rollback`` change no
server: they write the next revision of the fleet's signed state document (`fleet_state`),
which every replica's launcher applies (`fleet_watch`). ``deploy`` verifies the signatures of
every version the document names and runs the golden check first, as the one-server deploy
does; the document is signed with ``--key FILE`` (or the PEM text in ``DISPATCH_SIGNING_KEY``),
whose public key must be among ``--trusted-keys``, the keys the replicas verify it with.
``--wait-s S`` waits until every registered replica serves the new revision.

``status`` verifies the stored document and asks every replica it can find -- registered in
the store, or named with ``--replica HOST:PORT`` (a launcher's health endpoint) -- which
revision it serves; one JSON document. Exit codes: 0 every replica serves the document's
revision, 1 one does not (behind, refusing or unreachable) or a check failed, 2 usage or a
stored document that does not verify (bad signature, unsigned, unknown key, broken rule).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TextIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dispatch_service.core.repository_layout import ENCODER_MODEL, model_layout
from dispatch_service.core.settings import (
    SettingsError,
    load_settings,
    parameters_from_model_config,
)
from dispatch_service.core.signing import (
    TRUSTED_KEYS_ENV,
    Outcome,
    SigningError,
    TrustedKeys,
    key_id,
    load_private_key,
    verify_version,
)
from dispatch_service.domain.cities import CitySettings, RegistryError
from dispatch_service.ops.fleet_state import (
    STATE_STORE_ENV,
    FleetState,
    ReplicaReport,
    SignedState,
    StateError,
    StateStore,
    deployed,
    initial_state,
    rolled_back,
    sign_state,
)
from dispatch_service.ops.verified_load import read_config
from dispatch_service.routing.settings import RouterSettings

__all__ = [
    "GONE_AFTER_S",
    "SIGNING_KEY_ENV",
    "add_store_options",
    "cmd_deploy",
    "cmd_rollback",
    "cmd_status",
    "fleet_status",
    "replica_detail",
]

SIGNING_KEY_ENV: Final = "DISPATCH_SIGNING_KEY"
# A registered replica unreachable and silent this long has left the fleet (killed, scaled
# in): listed as gone, not waited for.
GONE_AFTER_S: Final = 10.0
_EXIT_OK, _EXIT_FAILED, _EXIT_USAGE = 0, 1, 2


class _UsageError(Exception):
    """Exit 2: arguments, keys, or a stored document that does not verify."""


class _FailedError(Exception):
    """Exit 1: a check failed or the fleet did not converge."""


def add_store_options(command: argparse.ArgumentParser, *, writes: bool, trusted: bool) -> None:
    """The store options of deploy, rollback (``writes``) and status."""
    command.add_argument(
        "--state-store",
        default=os.environ.get(STATE_STORE_ENV) or None,
        help="the fleet's state folder: write (or read) the signed document there instead "
        f"of calling one server (env {STATE_STORE_ENV})",
    )
    if trusted:
        command.add_argument(
            "--trusted-keys", help=f"folder of trusted *.pub keys (else env {TRUSTED_KEYS_ENV})"
        )
    if writes:
        command.add_argument(
            "--key", help=f"signing key PEM file for the document (else env {SIGNING_KEY_ENV})"
        )
        command.add_argument(
            "--wait-s",
            type=float,
            default=0.0,
            help="with --state-store: wait this long for every registered replica to serve "
            "the new revision (0: do not wait)",
        )
    else:
        command.add_argument(
            "--replica",
            action="append",
            default=[],
            help="a replica's health endpoint HOST:PORT to ask (repeatable), besides those "
            "registered in the store",
        )


def _guard(command: str, run: Callable[[], int]) -> int:
    try:
        return run()
    except _UsageError as exc:
        print(f"usage error: {exc}", file=sys.stderr)
        return _EXIT_USAGE
    except _FailedError as exc:
        print(f"{command} failed: {exc}", file=sys.stderr)
        return _EXIT_FAILED


def _trusted(args: argparse.Namespace) -> TrustedKeys:
    directory = args.trusted_keys or os.environ.get(TRUSTED_KEYS_ENV)
    if not directory:
        raise _UsageError(
            f"--trusted-keys DIR (or {TRUSTED_KEYS_ENV}) is required with --state-store"
        )
    try:
        return TrustedKeys.required_in(Path(directory))
    except SigningError as exc:
        raise _UsageError(str(exc)) from None


def _signing_key(args: argparse.Namespace, trusted: TrustedKeys) -> Ed25519PrivateKey:
    """The document's signing key; it must be one the replicas trust."""
    if args.key is not None:
        try:
            pem = Path(args.key).read_bytes()
        except OSError as exc:
            raise _UsageError(f"cannot read the signing key: {exc}") from None
    elif os.environ.get(SIGNING_KEY_ENV):
        pem = os.environ[SIGNING_KEY_ENV].encode()
    else:
        raise _UsageError(f"--key FILE or the environment variable {SIGNING_KEY_ENV} is required")
    try:
        key = load_private_key(pem)
    except SigningError as exc:
        raise _UsageError(f"signing key: {exc}") from None
    kid = key_id(key.public_key())
    if kid not in trusted.keys:
        raise _UsageError(f"signing key {kid} is not among the trusted keys: replicas would refuse")
    return key


def _store(args: argparse.Namespace) -> StateStore:
    return StateStore(Path(args.state_store))


def _stored(store: StateStore, trusted: TrustedKeys) -> SignedState | None:
    try:
        return store.current(trusted)
    except StateError as exc:
        raise _UsageError(f"{store.document} does not verify: {exc}; nothing written") from None
    except OSError as exc:
        raise _UsageError(f"cannot read {store.document}: {exc}") from None


def _base(store: StateStore, trusted: TrustedKeys, args: argparse.Namespace) -> FleetState:
    """The stored state, or the repository files' (revision 0) when none is stored yet."""
    signed = _stored(store, trusted)
    if signed is not None:
        return signed.state
    try:
        return initial_state(Path(args.model_repository), getattr(args, "profile", "cpu"))
    except (StateError, OSError, ValueError) as exc:
        raise _UsageError(
            f"no document in the store, and the repository's routing: {exc}"
        ) from None


def _city(city: str | None, repository: Path) -> str | None:
    """``city`` when the repository's city registry holds it (UsageError otherwise)."""
    if city is None:
        return None
    try:
        encoder = model_layout(repository, ENCODER_MODEL).folder
        parameters = parameters_from_model_config(read_config(encoder))
        ids = load_settings(CitySettings, parameters).registry().ids
    except (RegistryError, SettingsError, OSError, ValueError) as exc:
        raise _UsageError(f"--city {city}: the city registry cannot be read: {exc}") from None
    if city not in ids:
        raise _UsageError(f"--city {city}: no registered city has that id ({', '.join(ids)})")
    return city


def _verify_versions(repository: Path, state: FleetState, trusted: TrustedKeys) -> list[str]:
    """Every version the document names must verify here, as on each replica."""
    lines = []
    for version in state.versions:
        folder = repository / state.model / str(version)
        if not folder.is_dir():
            raise _FailedError(f"{state.model} version {version}: no folder {folder}")
        verdict = verify_version(folder, trusted)
        if verdict.outcome is not Outcome.VERIFIED:
            raise _FailedError(f"{state.model} version {version} refused: {verdict.reason}")
        lines.append(verdict.line())
    return lines


def _write(store: StateStore, state: FleetState, key: Ed25519PrivateKey, out: TextIO) -> None:
    store.write(sign_state(state, key))
    print(f"wrote revision {state.revision} to {store.document}: {state.note}", file=out)
    print(f"routed: {routed(state.routing)}; versions {list(state.versions)}", file=out)


def routed(settings: RouterSettings) -> str:
    """Where orders go under ``settings``, in words."""
    line = f"stable version {settings.stable_version}"
    if settings.canary_version and settings.canary_percent:
        line += f", canary version {settings.canary_version} for {settings.canary_percent}%"
    if settings.shadow_percent:
        line += f", {settings.shadow_percent}% shadow-scored"
    for route in settings.city_routes:
        line += f"; {route.city}: " + ", ".join(f"{k}={v}" for k, v in route.values().items())
    return line


def cmd_deploy(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        # Imported here: the golden check loads ONNX Runtime and the pipeline.
        from dispatch_service.ops.golden import GoldenSettings, check_candidate

        store, trusted = _store(args), _trusted(args)
        key = _signing_key(args, trusted)
        repository = Path(args.model_repository)
        if args.model != "dispatch_model":
            raise _UsageError(f"deploy supports dispatch_model, not {args.model}")
        city = _city(args.city, repository)
        try:
            golden_settings = GoldenSettings(
                min_top1_agreement=args.min_top1_agreement,
                max_mean_eta_diff_minutes=args.max_eta_diff_minutes,
            )
        except ValueError as exc:
            raise _UsageError(str(exc)) from None
        with store.locked():
            base = _base(store, trusted, args)
            try:
                state = deployed(base, args.version, args.canary_percent, city)
            except StateError as exc:
                raise _FailedError(str(exc)) from None
            for line in _verify_versions(repository, state, trusted):
                print(line, file=out)
            stable = base.routing.for_city(city).stable_version
            try:
                golden = check_candidate(repository, args.version, stable, golden_settings)
            except Exception as exc:  # an artifact ONNX Runtime cannot run fails the check
                raise _FailedError(
                    f"golden check could not run version {args.version}: {exc}"
                ) from None
            print(golden.summary(), file=out)
            if not golden.passed:
                raise _FailedError(f"golden check failed: {'; '.join(golden.problems)}")
            _write(store, state, key, out)
        return _wait(store, state.revision, args.wait_s, out)

    return _guard("deploy", run)


def cmd_rollback(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        store, trusted = _store(args), _trusted(args)
        key = _signing_key(args, trusted)
        city = _city(args.city, Path(args.model_repository))
        with store.locked():
            base = _base(store, trusted, args)
            try:
                state = rolled_back(base, city, args.unload_canary)
            except StateError as exc:
                raise _FailedError(str(exc)) from None
            _write(store, state, key, out)
        return _wait(store, state.revision, args.wait_s, out)

    return _guard("rollback", run)


def replica_detail(health_url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The ``fleet_state`` field of a launcher's ``/healthz`` (None when it cannot answer)."""
    url = health_url if "://" in health_url else f"http://{health_url}"
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:  # 503 while not ready: the detail is still there
        body = exc.read()
    except (urllib.error.URLError, OSError):
        return None
    try:
        detail = json.loads(body).get("fleet_state")
    except (ValueError, AttributeError):
        return None
    return detail if isinstance(detail, dict) else {"status": "not_following_a_store"}


def fleet_status(
    store: StateStore, revision: int | None, extra: list[str], timeout_s: float = 2.0
) -> list[dict[str, Any]]:
    """Every replica found (registered or named) and how it stands against ``revision``."""
    reports: dict[str, ReplicaReport | None] = {r.health_url: r for r in store.replicas()}
    for url in extra:
        reports.setdefault(url if "://" in url else f"http://{url}", None)
    found = []
    for url, report in sorted(reports.items()):
        detail = replica_detail(url, timeout_s)
        entry: dict[str, Any] = {"health_url": url}
        if report is not None:
            entry["replica"] = report.replica
        if detail is None:
            silent = None if report is None else time.time() - report.seen
            gone = silent is not None and silent > GONE_AFTER_S
            entry["state"] = "gone" if gone else "unreachable"
        else:
            served = detail.get("revision")
            entry.update(
                revision=served,
                digest=detail.get("digest"),
                status=detail.get("status"),
                refused=detail.get("refused"),
            )
            entry["state"] = (
                "current"
                if served == revision
                else "refusing"
                if detail.get("refused")
                else "behind"
            )
        found.append(entry)
    return found


def _wait(store: StateStore, revision: int, wait_s: float, out: TextIO) -> int:
    if wait_s <= 0:
        return _EXIT_OK
    deadline = time.monotonic() + wait_s
    while True:
        replicas = [r for r in fleet_status(store, revision, []) if r["state"] != "gone"]
        current = [r for r in replicas if r["state"] == "current"]
        if len(current) == len(replicas) or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    print(f"revision {revision} served by {len(current)} of {len(replicas)} replicas", file=out)
    if len(current) != len(replicas):
        lagging = ", ".join(
            f"{r['health_url']} ({r['state']})" for r in replicas if r not in current
        )
        raise _FailedError(
            f"not every replica serves revision {revision} after {wait_s} s: {lagging}"
        )
    return _EXIT_OK


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        store, trusted = _store(args), _trusted(args)
        document: dict[str, Any] = {"path": str(store.document)}
        code = _EXIT_OK
        revision: int | None = None
        try:
            signed = store.current(trusted)
        except (StateError, OSError) as exc:
            signed = None
            document["refused"] = str(exc)
            code = _EXIT_USAGE
        if signed is not None:
            revision = signed.state.revision
            document.update(
                revision=revision,
                digest=signed.short,
                key_id=signed.key_id,
                note=signed.state.note,
                versions=list(signed.state.versions),
                routed=routed(signed.state.routing),
            )
        elif code == _EXIT_OK:
            document["revision"] = None  # nothing stored yet: the replicas serve their files
        replicas = fleet_status(store, revision, list(args.replica))
        counted = [r for r in replicas if r["state"] != "gone"]
        converged = all(r["state"] == "current" for r in counted)
        result = {
            "store": str(store.path),
            "document": document,
            "replicas": replicas,
            "converged": converged and code == _EXIT_OK,
        }
        print(json.dumps(result, indent=2, sort_keys=True), file=out)
        if code == _EXIT_OK and not converged:
            code = _EXIT_FAILED
        return code

    return _guard("status", run)
