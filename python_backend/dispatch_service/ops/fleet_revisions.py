"""The only writer of routing: each lifecycle step is a new signed revision of the fleet state.

A change (`Change`) maps the state in force to the next one: `deployed` (a canary at a
share), `canary_share`, `shadowed`, `promoted` (the canary becomes stable), `rolled_back`,
each for every city or one. `write_revision` applies one under the store's lock: it reads
and verifies the stored document (a document that does not verify is never built on), builds
the next state with the next revision number and the operator's note, signs it with a key the
replicas trust, keeps a copy (`StateStore.history`) and replaces the document. `restore_revision`
re-signs a kept revision as the next one: the way back from a tampered or lost document.

`dispatch-admin` (`fleet_admin`) is one caller; a rollout controller is another:

    signed = write_revision(store, canary_share(25), "raise beijing to 25%",
                            signer=key, trusted=trusted)

Versions follow the document: every version some window is routed to is in ``versions``
(`FleetState`), so a version still routed is never unloaded; only ``unload`` changes drop
versions, and only those no route names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dispatch_service.core.signing import TrustedKeys, key_id
from dispatch_service.ops.fleet_state import (
    FleetState,
    SignedState,
    StateError,
    StateStore,
    sign_state,
    verify_state,
)
from dispatch_service.routing.settings import RouterSettings

__all__ = [
    "MAX_NOTE_CHARS",
    "Change",
    "StoredDocumentError",
    "canary_share",
    "deployed",
    "promoted",
    "restore_revision",
    "rolled_back",
    "shadowed",
    "write_revision",
]


class StoredDocumentError(StateError):
    """The stored document cannot be read or does not verify: nothing is built on it."""


# A change: the state in force -> the next state (its revision and note are the writer's).
Change = Callable[[FleetState], FleetState]
MAX_NOTE_CHARS: Final = 500


def _next(state: FleetState, routing: RouterSettings, versions: tuple[int, ...]) -> FleetState:
    try:
        return FleetState(state.revision, versions, routing)
    except ValueError as exc:
        raise StateError(f"the new routing breaks a rule: {exc}", "rule") from None


def _routed(state: FleetState, city: str | None, **values: int) -> RouterSettings:
    try:
        return state.routing.with_route(city, **values)
    except ValueError as exc:
        raise StateError(f"the new routing breaks a rule: {exc}", "rule") from None


def _where(city: str | None) -> str:
    return f" in {city}" if city else ""


def deployed(version: int, canary_percent: int, city: str | None = None) -> Change:
    """``version`` served and routed as the canary at ``canary_percent`` (in ``city`` only)."""

    def change(state: FleetState) -> FleetState:
        if not 0 <= canary_percent <= 100:
            raise StateError(f"canary_percent must lie in [0, 100], got {canary_percent}", "rule")
        if version == state.routing.for_city(city).stable_version:
            raise StateError(f"version {version} is the stable version{_where(city)}", "rule")
        routing = _routed(state, city, canary_version=version, canary_percent=canary_percent)
        return _next(state, routing, tuple(sorted({*state.versions, version})))

    return change


def canary_share(canary_percent: int, city: str | None = None) -> Change:
    """The canary in force (of ``city``) keeps its version; ``canary_percent`` of users."""

    def change(state: FleetState) -> FleetState:
        if not state.routing.for_city(city).canary_version:
            raise StateError(f"no canary{_where(city)} to change the share of", "rule")
        routing = _routed(state, city, canary_percent=canary_percent)
        return _next(state, routing, state.versions)

    return change


def shadowed(version: int, shadow_percent: int) -> Change:
    """``shadow_percent`` of requests also scored by ``version`` (the global canary version,
    at its share: 0 % when it was not the canary), for comparison only."""

    def change(state: FleetState) -> FleetState:
        routing = state.routing
        if version == routing.stable_version:
            raise StateError(f"version {version} is the stable version: it cannot shadow it")
        if routing.canary_version not in (0, version) and routing.canary_percent:
            raise StateError(
                f"version {routing.canary_version} is the canary at {routing.canary_percent}%: "
                "promote or roll it back before shadowing another version",
                "rule",
            )
        share = routing.canary_percent if routing.canary_version == version else 0
        try:
            routing = dataclasses.replace(
                routing, canary_version=version, canary_percent=share, shadow_percent=shadow_percent
            )
        except ValueError as exc:
            raise StateError(f"the new routing breaks a rule: {exc}", "rule") from None
        return _next(state, routing, tuple(sorted({*state.versions, version})))

    return change


def promoted(city: str | None = None, unload: bool = False) -> Change:
    """The canary (of ``city``) becomes its stable version, for every user; no canary, and
    globally no shadow. ``unload``: only the versions still routed stay served."""

    def change(state: FleetState) -> FleetState:
        canary = state.routing.for_city(city).canary_version
        if not canary:
            raise StateError(f"no canary{_where(city)} to promote", "rule")
        routing = _routed(state, city, stable_version=canary, canary_version=0, canary_percent=0)
        if city is None:
            routing = dataclasses.replace(routing, shadow_percent=0)
        versions = routing.routed_versions() if unload else state.versions
        return _next(state, routing, versions)

    return change


def rolled_back(city: str | None = None, unload: bool = False) -> Change:
    """Every order (of ``city``) on its stable version: no canary, and globally no shadow.
    ``unload``: only the versions still routed stay served."""

    def change(state: FleetState) -> FleetState:
        routing = _routed(state, city, canary_version=0, canary_percent=0)
        if city is None:
            routing = dataclasses.replace(routing, shadow_percent=0)
        versions = routing.routed_versions() if unload else state.versions
        return _next(state, routing, versions)

    return change


def _check_signer(signer: Ed25519PrivateKey, trusted: TrustedKeys) -> None:
    kid = key_id(signer.public_key())
    if kid not in trusted.keys:
        raise StateError(
            f"signing key {kid} is not among the trusted keys: replicas would refuse",
            "unknown_key",
        )


def _check_note(note: str) -> str:
    note = note.strip()
    if not note:
        raise StateError("a revision needs a note (what changed and why)", "rule")
    if len(note) > MAX_NOTE_CHARS or not note.isprintable():
        raise StateError(f"note: at most {MAX_NOTE_CHARS} printable characters", "rule")
    return note


def _sign_and_store(
    store: StateStore, state: FleetState, signer: Ed25519PrivateKey, trusted: TrustedKeys
) -> SignedState:
    data = sign_state(state, signer)
    signed = verify_state(data, trusted)  # what every replica will do with these bytes
    store.write(data, state.revision)
    return signed


def write_revision(
    store: StateStore,
    change: Change,
    note: str,
    signer: Ed25519PrivateKey,
    *,
    trusted: TrustedKeys,
    initial: Callable[[], FleetState] | None = None,
    check: Callable[[FleetState, FleetState], None] | None = None,
) -> SignedState:
    """Write the next revision: ``change`` applied to the stored state (or to ``initial()``
    when none is stored yet), ``note`` kept with it. Under the store's lock, so two writers
    never build on the same revision. ``check(base, proposed)`` runs before anything is
    written (deploy's signature and golden checks); it raises to refuse.

    StateError (nothing written): the change breaks a rule, the signer is not trusted
    (code ``unknown_key``), the note is empty; `StoredDocumentError` while the stored
    document cannot be read or does not verify (restore a kept revision)."""
    _check_signer(signer, trusted)
    note = _check_note(note)
    with store.locked():
        try:
            current = store.current(trusted)
        except OSError as exc:
            raise StoredDocumentError(f"cannot read {store.document}: {exc}") from None
        except StateError as exc:
            raise StoredDocumentError(
                f"{store.document} does not verify ({exc}); nothing is built on it: "
                "restore a kept revision (dispatch-admin history, restore --revision N)",
                exc.code,
            ) from None
        if current is not None:
            base = current.state
        elif initial is not None:
            base = initial()
        else:
            raise StateError(f"no document in {store.path} to change", "no_document")
        proposed = change(base)
        if check is not None:
            check(base, proposed)
        state = FleetState(store.next_revision(), proposed.versions, proposed.routing, note=note)
        return _sign_and_store(store, state, signer, trusted)


def restore_revision(
    store: StateStore,
    revision: int,
    signer: Ed25519PrivateKey,
    *,
    trusted: TrustedKeys,
    note: str = "",
    check: Callable[[FleetState], None] | None = None,
) -> SignedState:
    """Re-sign kept ``revision``'s versions and routing as the next revision, whatever the
    stored document is now (tampered, unsigned, lost): the replicas refuse an older revision
    number, so the known good state comes back under a new one. ``check(kept)`` runs
    before anything is written."""
    _check_signer(signer, trusted)
    note = _check_note(note or f"restore revision {revision}")
    with store.locked():
        kept = store.revision(revision, trusted).state
        if check is not None:
            check(kept)
        state = FleetState(store.next_revision(), kept.versions, kept.routing, note=note)
        return _sign_and_store(store, state, signer, trusted)
