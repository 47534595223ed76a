"""`dispatch-admin`'s routing commands: every change a signed revision of the fleet state.

    deploy   --version N [--canary-percent P] [--city ID]   a canary (signature + golden check)
    canary   --percent P [--city ID]                        the canary's share of users
    shadow   --version N --percent P                        a share of requests also scored by N
    promote  [--city ID] [--unload]                         the canary becomes stable
    rollback [--city ID] [--unload-canary]                  the stable version only
    restore  --revision N                                   re-sign a kept revision as the next
    history                                                 the kept revisions
    status   [--replica HOST:PORT ...]                      what every entry point routes by

The writers change no server: each writes the next revision of the store's signed document
(`fleet_revisions.write_revision`, with ``--note`` added to what changed), which every
replica's launcher applies (`fleet_watch`); a single `make serve` follows its own store,
``.triton/fleet``. The document is signed with ``--key FILE`` (or the PEM text in
``DISPATCH_SIGNING_KEY``), whose public key must be among ``--trusted-keys``, the keys the
replicas verify it with. ``--wait-s S`` waits until every replica's entry points route by it.

``status`` verifies the stored document and asks every replica it can find -- registered in
the store, or named with ``--replica HOST:PORT`` (a launcher's health endpoint) -- which
revision it serves and which routing each of its entry points reads now; one JSON document.
Exit codes: 0 every replica and entry point routes by the document's revision, 1 one does not
(behind, refusing, unreachable, an entry point on other routing) or a check failed, 2 usage
or a stored document that does not verify.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TextIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dispatch_contract.version import host_port_argument
from dispatch_service.core.paths import MODEL_REPOSITORY
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
    load_private_key,
    verify_version,
)
from dispatch_service.domain.cities import CitySettings, RegistryError
from dispatch_service.ops.fleet_revisions import (
    Change,
    StoredDocumentError,
    canary_share,
    deployed,
    promoted,
    restore_revision,
    rolled_back,
    shadowed,
    write_revision,
)
from dispatch_service.ops.fleet_state import (
    STATE_STORE_ENV,
    FleetState,
    SignedState,
    StateError,
    StateStore,
    initial_state,
)
from dispatch_service.ops.fleet_status import fleet_status
from dispatch_service.ops.verified_load import read_config
from dispatch_service.routing.live import routing_digest
from dispatch_service.routing.settings import INITIAL_ROUTING, SCORING_MODEL_NAME, RouterSettings

__all__ = [
    "DEFAULT_STATE_STORE",
    "ROUTING_COMMANDS",
    "SIGNING_KEY_ENV",
    "AdminUsageError",
    "add_commands",
    "registered_city",
    "routed",
    "signing_key",
    "state_store",
    "trusted_keys",
]

SIGNING_KEY_ENV: Final = "DISPATCH_SIGNING_KEY"
# `make serve`'s store (relative to the checkout, where the Makefile runs).
DEFAULT_STATE_STORE: Final = ".triton/fleet"
_EXIT_OK, _EXIT_FAILED, _EXIT_USAGE = 0, 1, 2


class AdminUsageError(Exception):
    """Exit 2: arguments, keys, or a stored document that does not verify."""


class _FailedError(Exception):
    """Exit 1: a check failed or the fleet did not converge."""


def _guard(command: str, run: Callable[[], int]) -> int:
    try:
        return run()
    except AdminUsageError as exc:
        print(f"usage error: {exc}", file=sys.stderr)
        return _EXIT_USAGE
    except _FailedError as exc:
        print(f"{command} failed: {exc}", file=sys.stderr)
        return _EXIT_FAILED


def trusted_keys(args: argparse.Namespace) -> TrustedKeys:
    directory = args.trusted_keys or os.environ.get(TRUSTED_KEYS_ENV)
    if not directory:
        raise AdminUsageError(f"--trusted-keys DIR (or {TRUSTED_KEYS_ENV}) is required")
    try:
        return TrustedKeys.required_in(Path(directory))
    except SigningError as exc:
        raise AdminUsageError(str(exc)) from None


def signing_key(args: argparse.Namespace) -> Ed25519PrivateKey:
    if args.key is not None:
        try:
            pem = Path(args.key).read_bytes()
        except OSError as exc:
            raise AdminUsageError(f"cannot read the signing key: {exc}") from None
    elif os.environ.get(SIGNING_KEY_ENV):
        pem = os.environ[SIGNING_KEY_ENV].encode()
    else:
        raise AdminUsageError(
            f"--key FILE or the environment variable {SIGNING_KEY_ENV} is required"
        )
    try:
        return load_private_key(pem)
    except SigningError as exc:
        raise AdminUsageError(f"signing key: {exc}") from None


def state_store(args: argparse.Namespace) -> StateStore:
    return StateStore(Path(args.state_store))


def registered_city(city: str | None, repository: Path) -> str | None:
    """``city`` when the repository's city registry holds it (usage error otherwise)."""
    if city is None:
        return None
    try:
        encoder = model_layout(repository, ENCODER_MODEL).folder
        parameters = parameters_from_model_config(read_config(encoder))
        ids = load_settings(CitySettings, parameters).registry().ids
    except (RegistryError, SettingsError, OSError, ValueError) as exc:
        raise AdminUsageError(f"--city {city}: the city registry cannot be read: {exc}") from None
    if city not in ids:
        raise AdminUsageError(f"--city {city}: no registered city has that id ({', '.join(ids)})")
    return city


def _verify_versions(
    repository: Path, model: str, versions: tuple[int, ...], trusted: TrustedKeys
) -> list[str]:
    """Each of ``versions`` must verify here, as on each replica; one line per version."""
    lines = []
    for version in versions:
        folder = repository / model / str(version)
        if not folder.is_dir():
            raise _FailedError(f"{model} version {version}: no folder {folder}")
        verdict = verify_version(folder, trusted)
        if verdict.outcome is not Outcome.VERIFIED:
            raise _FailedError(f"{model} version {version} refused: {verdict.reason}")
        lines.append(verdict.line())
    return lines


def routed(settings: RouterSettings) -> str:
    """Where orders go under ``settings``, in words."""
    line = f"stable version {settings.stable_version}"
    if settings.canary_version and settings.canary_percent:
        line += f", canary version {settings.canary_version} for {settings.canary_percent}%"
    if settings.shadow_percent and settings.canary_version:
        line += f", {settings.shadow_percent}% shadow-scored by {settings.canary_version}"
    for route in settings.city_routes:
        line += f"; {route.city}: " + ", ".join(f"{k}={v}" for k, v in route.values().items())
    return line


# -- the writers ------------------------------------------------------------------------------


def _write(
    args: argparse.Namespace,
    out: TextIO,
    change: Change,
    what: str,
    check: Callable[[FleetState, FleetState], None] | None = None,
    *,
    trusted: TrustedKeys,
    read: Callable[[FleetState], tuple[int, ...]] = lambda base: (),
) -> int:
    """Write ``change`` as the next revision (note: ``what``, then ``--note``), report it,
    then wait for the fleet when asked."""
    store = state_store(args)
    repository = Path(args.model_repository)
    note = f"{what}: {args.note}" if args.note else what

    def checked(base: FleetState, proposed: FleetState) -> None:
        """The versions the revision adds must verify here, as they will on each replica
        (a change that only routes among served versions verifies nothing), and those
        ``check`` reads (``read``)."""
        added = {v for v in proposed.versions if v not in base.versions}
        versions = tuple(sorted(added | set(read(base))))
        for line in _verify_versions(repository, proposed.model, versions, trusted):
            print(line, file=out)
        if check is not None:
            check(base, proposed)

    key = signing_key(args)
    try:
        signed = write_revision(
            store,
            change,
            note,
            key,
            trusted=trusted,
            initial=lambda: initial_state(repository),
            check=checked,
        )
    except StoredDocumentError as exc:
        raise AdminUsageError(f"{exc}; nothing written") from None
    except StateError as exc:
        if exc.code == "unknown_key":  # the signer: the replicas would refuse its revision
            raise AdminUsageError(str(exc)) from None
        raise _FailedError(str(exc)) from None
    except OSError as exc:
        raise AdminUsageError(f"{store.path}: {exc}") from None
    return _written(store, trusted, signed, args.wait_s, out)


def _written(
    store: StateStore, trusted: TrustedKeys, signed: SignedState, wait_s: float, out: TextIO
) -> int:
    """Say what was written, then wait for the fleet when asked."""
    state = signed.state
    print(f"wrote revision {state.revision} to {store.document}: {state.note}", file=out)
    print(f"routed: {routed(state.routing)}; versions {list(state.versions)}", file=out)
    return _wait(store, trusted, signed, wait_s, out)


def cmd_deploy(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        # Imported here: the golden check loads ONNX Runtime and the pipeline.
        from dispatch_service.ops.golden import GoldenSettings, check_candidate

        if args.model != SCORING_MODEL_NAME:
            raise AdminUsageError(f"deploy supports {SCORING_MODEL_NAME}, not {args.model}")
        repository = Path(args.model_repository)
        city = registered_city(args.city, repository)
        trusted = trusted_keys(args)
        try:
            golden_settings = GoldenSettings(
                min_top1_agreement=args.min_top1_agreement,
                max_mean_eta_diff_minutes=args.max_eta_diff_minutes,
            )
        except ValueError as exc:
            raise AdminUsageError(str(exc)) from None

        def golden(base: FleetState, proposed: FleetState) -> None:
            stable = base.routing.for_city(city).stable_version
            try:
                report = check_candidate(repository, args.version, stable, golden_settings)
            except Exception as exc:  # an artifact ONNX Runtime cannot run fails the check
                raise _FailedError(
                    f"golden check could not run version {args.version}: {exc}"
                ) from None
            print(report.summary(), file=out)
            if not report.passed:
                raise _FailedError(f"golden check failed: {'; '.join(report.problems)}")

        where = f" in {city}" if city else ""
        what = f"deploy version {args.version} as canary at {args.canary_percent}%{where}"
        change = deployed(args.version, args.canary_percent, city)

        def read(base: FleetState) -> tuple[int, ...]:  # by the golden check: verified first
            return (base.routing.for_city(city).stable_version, args.version)

        return _write(args, out, change, what, golden, trusted=trusted, read=read)

    return _guard("deploy", run)


def cmd_canary(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        city = registered_city(args.city, Path(args.model_repository))
        where = f" in {city}" if city else ""
        what = f"canary share {args.percent}%{where}"
        return _write(args, out, canary_share(args.percent, city), what, trusted=trusted_keys(args))

    return _guard("canary", run)


def cmd_shadow(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        what = f"shadow {args.percent}% of requests with version {args.version}"
        return _write(
            args, out, shadowed(args.version, args.percent), what, trusted=trusted_keys(args)
        )

    return _guard("shadow", run)


def cmd_promote(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        city = registered_city(args.city, Path(args.model_repository))
        where = f" in {city}" if city else ""
        what = f"promote the canary to stable{where}{' with unload' if args.unload else ''}"
        return _write(args, out, promoted(city, args.unload), what, trusted=trusted_keys(args))

    return _guard("promote", run)


def cmd_rollback(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        city = registered_city(args.city, Path(args.model_repository))
        where = f" in {city}" if city else ""
        what = f"rollback{where}{' with unload' if args.unload_canary else ''}"
        return _write(
            args, out, rolled_back(city, args.unload_canary), what, trusted=trusted_keys(args)
        )

    return _guard("rollback", run)


def cmd_restore(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        store, trusted = state_store(args), trusted_keys(args)
        key = signing_key(args)
        note = f"restore revision {args.revision}" + (f": {args.note}" if args.note else "")
        repository = Path(args.model_repository)

        def verified(kept: FleetState) -> None:  # its versions' files may have changed since
            for line in _verify_versions(repository, kept.model, kept.versions, trusted):
                print(line, file=out)

        try:
            signed = restore_revision(
                store, args.revision, key, trusted=trusted, note=note, check=verified
            )
        except StateError as exc:
            if exc.code == "unknown_key":
                raise AdminUsageError(str(exc)) from None
            raise _FailedError(str(exc)) from None
        except OSError as exc:
            raise AdminUsageError(f"{store.path}: {exc}") from None
        return _written(store, trusted, signed, args.wait_s, out)

    return _guard("restore", run)


def cmd_history(args: argparse.Namespace, out: TextIO) -> int:
    """The kept revisions, oldest first, one JSON document; the one stored now is marked."""

    def run() -> int:
        store, trusted = state_store(args), trusted_keys(args)
        try:
            current = store.current(trusted)
            current_error = ""
        except (StateError, OSError) as exc:
            current, current_error = None, str(exc)
        revisions = []
        for kept in store.history(trusted):
            entry: dict[str, Any] = {"revision": kept.revision}
            if kept.signed is None:
                entry["refused"] = kept.error
            else:
                state = kept.signed.state
                entry.update(
                    note=state.note,
                    key_id=kept.signed.key_id,
                    digest=kept.signed.short,
                    versions=list(state.versions),
                    routed=routed(state.routing),
                    stored=current is not None and current.digest == kept.signed.digest,
                )
            revisions.append(entry)
        document: dict[str, Any] = {"store": str(store.path), "revisions": revisions}
        if current_error:
            document["stored_refused"] = current_error
        print(json.dumps(document, indent=2, sort_keys=True), file=out)
        return _EXIT_USAGE if current_error else _EXIT_OK

    return _guard("history", run)


def _wait(
    store: StateStore, trusted: TrustedKeys, signed: SignedState, wait_s: float, out: TextIO
) -> int:
    if wait_s <= 0:
        return _EXIT_OK
    revision = signed.state.revision
    deadline = time.monotonic() + wait_s
    while True:
        replicas = [r for r in fleet_status(store, signed, []) if r["state"] != "gone"]
        current = [r for r in replicas if r["state"] == "current"]
        if len(current) == len(replicas) or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    print(f"revision {revision} routed by {len(current)} of {len(replicas)} replicas", file=out)
    if len(current) != len(replicas):
        lagging = ", ".join(
            f"{r['health_url']} ({r['state']})" for r in replicas if r not in current
        )
        raise _FailedError(
            f"not every replica routes by revision {revision} after {wait_s} s: {lagging}"
        )
    return _EXIT_OK


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        store, trusted = state_store(args), trusted_keys(args)
        document: dict[str, Any] = {"path": str(store.document)}
        code = _EXIT_OK
        try:
            signed = store.current(trusted)
        except (StateError, OSError) as exc:
            signed = None
            document["refused"] = str(exc)
            code = _EXIT_USAGE
        if signed is not None:
            document.update(
                revision=signed.state.revision,
                digest=signed.short,
                routing=routing_digest(signed.state.routing),
                key_id=signed.key_id,
                note=signed.state.note,
                versions=list(signed.state.versions),
                routed=routed(signed.state.routing),
            )
        elif code == _EXIT_OK:
            # Nothing stored yet: every entry point routes by the initial routing.
            document.update(
                revision=None,
                note="no revision yet: the initial routing",
                routed=routed(INITIAL_ROUTING),
            )
        replicas = fleet_status(store, signed, list(args.replica))
        counted = [r for r in replicas if r["state"] != "gone"]
        converged = bool(counted) and all(r["state"] == "current" for r in counted)
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


# -- the parser -------------------------------------------------------------------------------

# Every command that changes routing, each through `write_revision` (or `restore_revision`).
ROUTING_COMMANDS: Final = ("deploy", "canary", "shadow", "promote", "rollback", "restore")


def add_commands(
    command: Callable[[str, str], argparse.ArgumentParser], golden_defaults: tuple[float, float]
) -> None:
    """Add the routing commands with ``command(name, help)`` (`admin.build_parser`'s)."""
    city_help = "a registered city id: change only its route (default: every city)"
    trusted_help = f"folder of trusted *.pub keys (else env {TRUSTED_KEYS_ENV})"

    def store_options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--state-store",
            default=os.environ.get(STATE_STORE_ENV) or DEFAULT_STATE_STORE,
            help=f"the fleet's state folder, `make serve`'s by default (env {STATE_STORE_ENV})",
        )
        parser.add_argument("--trusted-keys", help=trusted_help)

    def writer(name: str, text: str) -> argparse.ArgumentParser:
        parser = command(name, text)
        store_options(parser)
        parser.add_argument(
            "--key", help=f"signing key PEM file for the document (else env {SIGNING_KEY_ENV})"
        )
        parser.add_argument("--note", default="", help="why: kept with the revision")
        parser.add_argument(
            "--wait-s",
            type=float,
            default=0.0,
            help="wait this long for every replica's entry points to route by the new "
            "revision (0: do not wait; exit 1 if they do not)",
        )
        parser.add_argument(
            "--model-repository",
            default=str(MODEL_REPOSITORY),
            help="the versions' folders (verified) and city registry",
        )
        return parser

    deploy = writer("deploy", "verify and check a version, then route a share of users to it")
    deploy.add_argument("--version", type=int, required=True, help="the canary version")
    deploy.add_argument(
        "--canary-percent", type=int, default=10, help="share of users routed to the canary"
    )
    deploy.add_argument("--city", help=city_help)
    deploy.add_argument("--model", default=SCORING_MODEL_NAME, help="the routed model")
    deploy.add_argument(
        "--min-top1-agreement",
        type=float,
        default=golden_defaults[0],
        help="golden check: least share of orders with the same best rider",
    )
    deploy.add_argument(
        "--max-eta-diff-minutes",
        type=float,
        default=golden_defaults[1],
        help="golden check: largest mean |ETA difference|",
    )
    deploy.set_defaults(handler=cmd_deploy)

    canary = writer("canary", "change the canary's share of users")
    canary.add_argument("--percent", type=int, required=True, help="share of users (0..100)")
    canary.add_argument("--city", help=city_help)
    canary.set_defaults(handler=cmd_canary)

    shadow = writer("shadow", "also score a share of requests with a version, to compare")
    shadow.add_argument("--version", type=int, required=True, help="the shadow version")
    shadow.add_argument("--percent", type=int, required=True, help="share of requests (0..100)")
    shadow.set_defaults(handler=cmd_shadow)

    promote = writer("promote", "make the canary the stable version for every user")
    promote.add_argument("--city", help=city_help)
    promote.add_argument("--unload", action="store_true", help="unload versions no longer routed")
    promote.set_defaults(handler=cmd_promote)

    rollback = writer("rollback", "every order on the stable version: no canary, no shadow")
    rollback.add_argument("--city", help=city_help)
    rollback.add_argument(
        "--unload-canary", action="store_true", help="unload versions no longer routed"
    )
    rollback.set_defaults(handler=cmd_rollback)

    restore = writer("restore", "re-sign a kept revision as the next revision")
    restore.add_argument("--revision", type=int, required=True, help="a revision `history` lists")
    restore.set_defaults(handler=cmd_restore)

    history = command("history", "the revisions the store keeps, as one JSON document")
    store_options(history)
    history.set_defaults(handler=cmd_history)

    status = command(
        "status", "the stored revision and what every replica's entry points route by, as JSON"
    )
    store_options(status)
    status.add_argument(
        "--replica",
        action="append",
        default=[],
        type=host_port_argument,
        help="a replica's health endpoint HOST:PORT to ask (repeatable), besides those "
        "registered in the store",
    )
    status.set_defaults(handler=cmd_status)
