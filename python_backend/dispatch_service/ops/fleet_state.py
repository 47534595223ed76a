"""The fleet's desired state: one signed document every replica converges to.

What it holds (`FleetState`): a ``revision`` number that only grows, the scoring model's
``versions`` to serve, and the ``routing`` of both entry points (stable, canary and its share,
shadow share, per-city routes: `RouterSettings` without the node-local ``cpu_scoring``, which
the GPU monitor of each node sets for itself). Rules: every version some window is routed to
is in ``versions``; the routing passes every `RouterSettings` rule.

How it is stored (`StateStore`): a folder holding ``fleet-state.json``, a signed envelope

    {"format": "dispatch-fleet-state-signed/1", "algorithm": "Ed25519", "key_id": "...",
     "signature": "<base64 over the exact bytes of state>", "state": "<canonical JSON text>"}

signed with the same Ed25519 keys as model versions (`core.signing`) and checked against the
same trusted keys. Locally the folder is ``.triton/fleet`` (`make serve`); on Kubernetes a
ConfigMap mounted read-only into every pod. Where the folder is writable, each launcher
also registers itself under ``replicas/<id>.json`` with the revision it serves
(`ReplicaReport`), so `dispatch-admin status` can find every replica.

Writes replace the file atomically (a temporary file renamed over it), under an exclusive
lock of ``.lock`` so that two writers never build on the same revision.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dispatch_service.core.settings import SettingsError, parameters_from_model_config
from dispatch_service.core.signing import ALGORITHM, TrustedKeys, key_id
from dispatch_service.ops.verified_load import read_config, served_versions
from dispatch_service.routing.settings import (
    ROUTER_MODEL_NAME,
    SCORING_MODEL_NAME,
    RouterSettings,
    format_city_routes,
    parse_city_routes,
)

__all__ = [
    "ENVELOPE_FORMAT",
    "REPLICAS_DIR",
    "ROUTING_FIELDS",
    "STATE_FILE",
    "STATE_FORMAT",
    "STATE_STORE_ENV",
    "FleetState",
    "ReplicaReport",
    "SignedState",
    "StateError",
    "StateStore",
    "deployed",
    "initial_state",
    "rolled_back",
    "sign_state",
    "verify_state",
]

STATE_FILE: Final = "fleet-state.json"
REPLICAS_DIR: Final = "replicas"
STATE_FORMAT: Final = "dispatch-fleet-state/1"
ENVELOPE_FORMAT: Final = "dispatch-fleet-state-signed/1"
# The launcher's and dispatch-admin's default store when no --state-store is given.
STATE_STORE_ENV: Final = "DISPATCH_STATE_STORE"
# The `RouterSettings` fields the document sets; cpu_scoring stays each node's own.
ROUTING_FIELDS: Final = (
    "stable_version",
    "canary_version",
    "canary_percent",
    "shadow_percent",
    "bls_timeout_ms",
    "city_routes",
)
_STATE_KEYS: Final = frozenset({"format", "revision", "model", "versions", "routing", "note"})
_ENVELOPE_KEYS: Final = frozenset({"format", "algorithm", "key_id", "signature", "state"})
_MAX_DOCUMENT_BYTES: Final = 1 << 20
_REPLICA_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class StateError(ValueError):
    """A state document that cannot be used; ``code`` is a short reason for metrics."""

    def __init__(self, message: str, code: str = "malformed") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class FleetState:
    """What every replica serves: the scoring versions and both entry points' routing."""

    revision: int
    versions: tuple[int, ...]
    routing: RouterSettings
    model: str = SCORING_MODEL_NAME
    note: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.revision, bool) or not isinstance(self.revision, int):
            raise StateError(f"revision must be an integer, got {self.revision!r}", "rule")
        if self.revision < 0:
            raise StateError(f"revision must be >= 0, got {self.revision}", "rule")
        if self.model != SCORING_MODEL_NAME:
            raise StateError(f"model must be {SCORING_MODEL_NAME}, got {self.model!r}", "rule")
        if not self.versions:
            raise StateError("versions must name at least one version", "rule")
        missing = [v for v in self.routing.routed_versions() if v not in self.versions]
        if missing:
            raise StateError(
                f"versions {list(self.versions)} must include every routed version "
                f"(missing {missing})",
                "rule",
            )
        try:
            settings = dataclasses.replace(self.routing, scoring_versions=self.versions)
        except ValueError as exc:
            raise StateError(f"versions: {exc}", "rule") from None
        object.__setattr__(self, "routing", dataclasses.replace(settings, cpu_scoring=0))

    def router_settings(self, cpu_scoring: int = 0) -> RouterSettings:
        """The settings a replica loads: this routing over these versions, its own
        ``cpu_scoring`` kept."""
        return dataclasses.replace(self.routing, cpu_scoring=cpu_scoring)

    def to_dict(self) -> dict[str, Any]:
        routing = {name: getattr(self.routing, name) for name in ROUTING_FIELDS}
        routing["city_routes"] = format_city_routes(self.routing.city_routes)
        return {
            "format": STATE_FORMAT,
            "revision": self.revision,
            "model": self.model,
            "versions": list(self.versions),
            "routing": routing,
            "note": self.note,
        }

    def to_text(self) -> str:
        """Canonical JSON: the exact text the signature covers."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, document: Any) -> FleetState:
        """Parse a state document; StateError names the field and the rule it breaks."""
        if not isinstance(document, dict):
            raise StateError("state must be a JSON object")
        unknown = sorted(set(document) - _STATE_KEYS)
        if unknown:
            raise StateError(f"state: unknown field(s) {', '.join(unknown)}")
        if document.get("format") != STATE_FORMAT:
            raise StateError(f"state: format must be {STATE_FORMAT!r}")
        revision = document.get("revision")
        if isinstance(revision, bool) or not isinstance(revision, int):
            raise StateError(f"state: revision must be an integer, got {revision!r}")
        versions = document.get("versions")
        if not isinstance(versions, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in versions
        ):
            raise StateError("state: versions must be a list of version numbers >= 1")
        note = document.get("note", "")
        if not isinstance(note, str):
            raise StateError("state: note must be a string")
        model = document.get("model", SCORING_MODEL_NAME)
        routing = document.get("routing")
        if not isinstance(routing, dict):
            raise StateError("state: routing must be an object")
        extra = sorted(set(routing) - set(ROUTING_FIELDS))
        if extra:
            raise StateError(f"state: routing: unknown field(s) {', '.join(extra)}")
        values: dict[str, Any] = {}
        for name, value in routing.items():
            if name == "city_routes":
                if not isinstance(value, str):
                    raise StateError("state: routing.city_routes must be a string")
                try:
                    values[name] = parse_city_routes(value)
                except SettingsError as exc:
                    raise StateError(f"state: routing.city_routes: {exc}", "rule") from None
            elif isinstance(value, bool) or not isinstance(value, int):
                raise StateError(f"state: routing.{name} must be an integer, got {value!r}")
            else:
                values[name] = value
        try:
            settings = RouterSettings(**values)
        except ValueError as exc:
            raise StateError(f"state: routing: {exc}", "rule") from None
        return cls(int(revision), tuple(sorted(set(versions))), settings, str(model), note)


@dataclass(frozen=True)
class SignedState:
    """A state whose signature verified: by which key, and the digest of its text."""

    state: FleetState
    key_id: str
    digest: str  # sha256 hex of the signed state text: names this exact document

    @property
    def short(self) -> str:
        return self.digest[:12]


def document_digest(data: bytes) -> str:
    """sha256 hex of a stored document's bytes (what a refusal names)."""
    return hashlib.sha256(data).hexdigest()


def sign_state(state: FleetState, private_key: Ed25519PrivateKey) -> bytes:
    """The signed envelope of ``state``, as stored."""
    text = state.to_text()
    envelope = {
        "format": ENVELOPE_FORMAT,
        "algorithm": ALGORITHM,
        "key_id": key_id(private_key.public_key()),
        "signature": base64.b64encode(private_key.sign(text.encode())).decode("ascii"),
        "state": text,
    }
    return (json.dumps(envelope, indent=2, sort_keys=True) + "\n").encode()


def verify_state(data: bytes, trusted: TrustedKeys) -> SignedState:
    """Check a stored envelope against the trusted keys, then parse its state.

    StateError codes: ``malformed`` (not an envelope), ``unsigned`` (no signature),
    ``unknown_key``, ``bad_signature`` (tampered or another key's), ``rule`` (a signed state
    that breaks a rule)."""
    if len(data) > _MAX_DOCUMENT_BYTES:
        raise StateError(f"document is larger than {_MAX_DOCUMENT_BYTES} bytes")
    try:
        envelope = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateError(f"not JSON: {exc}") from None
    if not isinstance(envelope, dict):
        raise StateError("document must be a JSON object")
    if envelope.get("format") == STATE_FORMAT:
        raise StateError("unsigned: a bare state without a signature envelope", "unsigned")
    unknown = sorted(set(envelope) - _ENVELOPE_KEYS)
    if unknown:
        raise StateError(f"envelope: unknown field(s) {', '.join(unknown)}")
    if envelope.get("format") != ENVELOPE_FORMAT:
        raise StateError(f"envelope: format must be {ENVELOPE_FORMAT!r}")
    if not envelope.get("signature") or not envelope.get("key_id"):
        raise StateError("unsigned: envelope has no signature or key_id", "unsigned")
    if envelope.get("algorithm") != ALGORITHM:
        raise StateError(f"envelope: algorithm must be {ALGORITHM}")
    kid, signature, text = envelope["key_id"], envelope["signature"], envelope.get("state")
    if not isinstance(kid, str) or not isinstance(signature, str) or not isinstance(text, str):
        raise StateError("envelope: key_id, signature and state must be strings")
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise StateError("envelope: signature is not base64") from None
    public_key = trusted.keys.get(kid)
    if public_key is None:
        raise StateError(f"signed by key {kid}, which is not trusted", "unknown_key")
    try:
        public_key.verify(raw, text.encode())
    except InvalidSignature:
        raise StateError(
            f"bad signature (key {kid}): the state was changed", "bad_signature"
        ) from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StateError(f"state is not JSON: {exc}") from None
    state = FleetState.from_dict(document)
    return SignedState(state, kid, hashlib.sha256(text.encode()).hexdigest())


def initial_state(repository: Path, profile: str = "cpu") -> FleetState:
    """Revision 0: what a server started from the repository's files serves."""
    router = read_config(repository / ROUTER_MODEL_NAME, profile)
    try:
        routing = RouterSettings.from_parameters(parameters_from_model_config(router))
    except (SettingsError, ValueError) as exc:
        raise StateError(f"{ROUTER_MODEL_NAME} config: {exc}", "rule") from None
    folder = repository / SCORING_MODEL_NAME
    present = sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
    versions = served_versions(read_config(folder, profile), present)
    versions = tuple(sorted({*versions, *routing.routed_versions()}))
    return FleetState(0, versions, routing, note="the repository's files")


def deployed(
    state: FleetState, version: int, canary_percent: int, city: str | None = None
) -> FleetState:
    """The next revision: ``version`` served and routed as the canary (in ``city`` only)."""
    if not 0 <= canary_percent <= 100:
        raise StateError(f"canary_percent must lie in [0, 100], got {canary_percent}", "rule")
    stable = state.routing.for_city(city).stable_version
    if version == stable:
        raise StateError(f"version {version} is the stable version already", "rule")
    try:
        routing = state.routing.with_route(
            city, canary_version=version, canary_percent=canary_percent
        )
    except ValueError as exc:
        raise StateError(f"the new routing breaks a rule: {exc}", "rule") from None
    where = f" in {city}" if city else ""
    return FleetState(
        state.revision + 1,
        tuple(sorted({*state.versions, version})),
        routing,
        note=f"deploy version {version} as canary at {canary_percent}%{where}",
    )


def rolled_back(state: FleetState, city: str | None = None, unload: bool = False) -> FleetState:
    """The next revision: every order (of ``city``) on its stable version, no canary (and,
    globally, no shadow); with ``unload`` only the versions still routed stay served."""
    try:
        routing = state.routing.with_route(city, canary_version=0, canary_percent=0)
    except ValueError as exc:
        raise StateError(f"the new routing breaks a rule: {exc}", "rule") from None
    if city is None:
        routing = dataclasses.replace(routing, shadow_percent=0)
    versions = routing.routed_versions() if unload else state.versions
    where = f" in {city}" if city else ""
    return FleetState(
        state.revision + 1,
        versions,
        dataclasses.replace(routing, scoring_versions=()),
        note=f"rollback{where}{' with unload' if unload else ''}",
    )


@dataclass(frozen=True)
class ReplicaReport:
    """What one launcher says of itself in the store (``replicas/<id>.json``)."""

    replica: str
    health_url: str
    revision: int | None  # the revision it serves; None: none applied (the files' state)
    digest: str
    status: str  # current | refused | applying | no_document | unverifiable
    seen: float  # unix time of this report
    refused: Mapping[str, Any] | None = None

    def to_bytes(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> ReplicaReport:
        try:
            document = json.loads(data)
            return cls(**document)
        except (UnicodeDecodeError, json.JSONDecodeError, TypeError) as exc:
            raise StateError(f"replica report: {exc}") from None


@dataclass(frozen=True)
class StateStore:
    """The folder holding the document and the replicas' reports."""

    path: Path

    @property
    def document(self) -> Path:
        return self.path / STATE_FILE

    @property
    def replicas_dir(self) -> Path:
        return self.path / REPLICAS_DIR

    def read(self) -> bytes | None:
        """The stored document's bytes; None when there is none yet (no file, or an empty
        one: a ConfigMap key exported before any deploy)."""
        try:
            data = self.document.read_bytes()
        except FileNotFoundError:
            return None
        return data or None

    def current(self, trusted: TrustedKeys) -> SignedState | None:
        """The stored state, verified; None when none is stored; StateError when bad."""
        data = self.read()
        return None if data is None else verify_state(data, trusted)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive for writers (an advisory lock on ``.lock``)."""
        self.path.mkdir(parents=True, exist_ok=True)
        with (self.path / ".lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def write(self, data: bytes) -> None:
        """Replace the document atomically (readers see the old or the new file whole)."""
        _atomic_write(self.document, data)

    def register(self, report: ReplicaReport) -> None:
        """Write this replica's report; OSError where the store is read-only."""
        self.replicas_dir.mkdir(parents=True, exist_ok=True)
        _atomic_write(self._report_path(report.replica), report.to_bytes())

    def unregister(self, replica: str) -> None:
        """Remove a replica's report (it stopped); nothing where there is none."""
        with contextlib.suppress(OSError, StateError):
            self._report_path(replica).unlink(missing_ok=True)

    def _report_path(self, replica: str) -> Path:
        if not _REPLICA_ID.match(replica):
            raise StateError(f"replica id {replica!r} is not [A-Za-z0-9._:-]")
        return self.replicas_dir / (replica.replace(":", "_") + ".json")

    def replicas(self) -> list[ReplicaReport]:
        """Every replica report in the store, unreadable ones left out."""
        if not self.replicas_dir.is_dir():
            return []
        found = []
        for path in sorted(self.replicas_dir.glob("*.json")):
            with contextlib.suppress(OSError, StateError):
                found.append(ReplicaReport.from_bytes(path.read_bytes()))
        return found


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
