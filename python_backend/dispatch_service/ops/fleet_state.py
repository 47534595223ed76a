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
lock of ``.lock`` so that two writers never build on the same revision, and keep a copy of
each of the last `KEEP_REVISIONS` under ``revisions/`` (`StateStore.history`): a tampered or
lost document is replaced by re-signing one (`fleet_revisions.restore_revision`). Every read
of a stored file checks first that it is a regular file of at most `MAX_DOCUMENT_BYTES`
(`read_regular`): a FIFO, a device or a huge file in its place is refused unread.
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
import stat
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
)

__all__ = [
    "ENVELOPE_FORMAT",
    "KEEP_REVISIONS",
    "MAX_DOCUMENT_BYTES",
    "REPLICAS_DIR",
    "REVISIONS_DIR",
    "STATE_FILE",
    "STATE_FORMAT",
    "STATE_STORE_ENV",
    "FleetState",
    "ReplicaReport",
    "SignedState",
    "StateError",
    "StateStore",
    "StoredRevision",
    "claimed_revision",
    "initial_state",
    "read_regular",
    "sign_state",
    "verify_state",
]

STATE_FILE: Final = "fleet-state.json"
REPLICAS_DIR: Final = "replicas"
STATE_FORMAT: Final = "dispatch-fleet-state/2"
ENVELOPE_FORMAT: Final = "dispatch-fleet-state-signed/1"
# The launcher's and dispatch-admin's default store when no --state-store is given.
STATE_STORE_ENV: Final = "DISPATCH_STATE_STORE"
_STATE_KEYS: Final = frozenset({"format", "revision", "model", "versions", "routing", "note"})
_ENVELOPE_KEYS: Final = frozenset({"format", "algorithm", "key_id", "signature", "state"})
MAX_DOCUMENT_BYTES: Final = 1 << 20
# Signed revisions the store keeps beside the document (``revisions/<revision>.json``): a
# tampered or lost document is replaced by re-signing one of them (`restored`).
KEEP_REVISIONS: Final = 20
REVISIONS_DIR: Final = "revisions"
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
        routing = self.routing.to_document()
        del routing["scoring_versions"]  # the document's ``versions``
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
        if isinstance(routing, dict) and "scoring_versions" in routing:
            raise StateError("state: routing.scoring_versions is the document's versions")
        try:
            settings = RouterSettings.from_document(
                {**routing, "scoring_versions": []} if isinstance(routing, dict) else routing,
                "state: routing",
            )
        except SettingsError as exc:
            raise StateError(str(exc), "rule") from None
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
    if len(data) > MAX_DOCUMENT_BYTES:
        raise StateError(f"document is larger than {MAX_DOCUMENT_BYTES} bytes")
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
    """Revision 0, what a server serves before its fleet's first revision: the versions the
    scoring model's config serves, routed by `INITIAL_ROUTING` (with dispatch_router's node
    parameters: `RouterSettings.from_parameters`)."""
    router = read_config(repository / ROUTER_MODEL_NAME, profile)
    try:
        routing = RouterSettings.from_parameters(parameters_from_model_config(router))
    except (SettingsError, ValueError) as exc:
        raise StateError(f"{ROUTER_MODEL_NAME} config: {exc}", "rule") from None
    folder = repository / SCORING_MODEL_NAME
    present = sorted(int(p.name) for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
    versions = served_versions(read_config(folder, profile), present)
    versions = tuple(sorted({*versions, *routing.routed_versions()}))
    return FleetState(0, versions, routing, note="the initial routing")


@dataclass(frozen=True)
class StoredRevision:
    """One revision the store keeps: ``signed`` when it verifies, else ``error`` says why."""

    revision: int
    signed: SignedState | None
    error: str = ""


def claimed_revision(data: bytes) -> int | None:
    """The revision a document claims, verified or not (None where it cannot be read): what
    a refusal reports, and what the next revision must exceed."""
    try:
        envelope = json.loads(data)
        state = json.loads(envelope["state"]) if "state" in envelope else envelope
        revision = state.get("revision")
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return revision if isinstance(revision, int) and not isinstance(revision, bool) else None


def read_regular(path: Path, limit: int) -> bytes:
    """The bytes of ``path`` (symbolic links followed, as a ConfigMap mount has them), read
    only when it is a regular file of at most ``limit`` bytes. FileNotFoundError when absent
    (returns b""); StateError ``not_regular`` / ``too_large`` naming the file otherwise.
    Checked before the open (a device is never opened) and again on the open descriptor
    (a swap in between is caught); the read stops at ``limit`` + 1 bytes whatever happens."""
    try:
        before = os.stat(path)
    except FileNotFoundError:
        return b""
    _check_regular(path, before, limit)
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return b""
    try:
        _check_regular(path, os.fstat(handle), limit)
        with os.fdopen(handle, "rb", closefd=False) as stream:
            data = stream.read(limit + 1)
    finally:
        os.close(handle)
    if len(data) > limit:
        raise StateError(f"{path}: larger than {limit} bytes; not read", "too_large")
    return data


def _check_regular(path: Path, status: os.stat_result, limit: int) -> None:
    if not stat.S_ISREG(status.st_mode):
        kind = _FILE_KINDS.get(stat.S_IFMT(status.st_mode), "not a regular file")
        raise StateError(f"{path}: {kind}, not a regular file; not read", "not_regular")
    if status.st_size > limit:
        raise StateError(
            f"{path}: {status.st_size} bytes, larger than {limit}; not read", "too_large"
        )


_FILE_KINDS: Final = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
}


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
        one: a ConfigMap key exported before any deploy). StateError (codes ``not_regular``,
        ``too_large``) before a byte is read from anything but a regular file of at most
        `MAX_DOCUMENT_BYTES`: a FIFO would block the reader, a device or a huge file fill
        its memory."""
        data = read_regular(self.document, MAX_DOCUMENT_BYTES)
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

    def write(self, data: bytes, revision: int | None = None) -> None:
        """Replace the document atomically (readers see the old or the new file whole); with
        its ``revision``, keep a copy under ``revisions/`` too (the last `KEEP_REVISIONS`)."""
        if revision is not None:
            _atomic_write(self._revision_path(revision), data)
            for old in self._revision_files()[:-KEEP_REVISIONS]:
                with contextlib.suppress(OSError):
                    old[1].unlink()
        _atomic_write(self.document, data)

    def _revision_path(self, revision: int) -> Path:
        return self.path / REVISIONS_DIR / f"{revision:010d}.json"

    def _revision_files(self) -> list[tuple[int, Path]]:
        folder = self.path / REVISIONS_DIR
        if not folder.is_dir():
            return []
        found = [(int(p.stem), p) for p in folder.glob("*.json") if p.stem.isdigit()]
        return sorted(found)

    def history(self, trusted: TrustedKeys) -> list[StoredRevision]:
        """The kept revisions, oldest first, each verified (a copy that does not verify is
        listed with its refusal, never used)."""
        found = []
        for number, path in self._revision_files():
            try:
                data = read_regular(path, MAX_DOCUMENT_BYTES)
                signed: SignedState | None = verify_state(data, trusted)
                error = ""
            except (StateError, OSError) as exc:
                signed, error = None, str(exc)
            if signed is not None and signed.state.revision != number:
                error = f"holds revision {signed.state.revision}, not {number}"
                signed = None
            found.append(StoredRevision(number, signed, error))
        return found

    def revision(self, number: int, trusted: TrustedKeys) -> SignedState:
        """Kept revision ``number``, verified; StateError when it is not kept or is bad."""
        for kept in self.history(trusted):
            if kept.revision == number:
                if kept.signed is None:
                    raise StateError(f"kept revision {number} does not verify: {kept.error}")
                return kept.signed
        kept_numbers = [kept.revision for kept in self.history(trusted)]
        raise StateError(f"revision {number} is not kept (kept: {kept_numbers})", "not_kept")

    def next_revision(self) -> int:
        """One above every revision the store has seen: the document's (whatever it claims,
        so a replica never refuses the next as stale) and every kept one."""
        seen = [number for number, _ in self._revision_files()]
        with contextlib.suppress(OSError, StateError):
            data = self.read()
            claimed = None if data is None else claimed_revision(data)
            if claimed is not None:
                seen.append(claimed)
        return max(seen, default=0) + 1

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
