"""Signed model artifacts: an Ed25519 signature over a manifest of SHA-256 digests.

What is signed: one **version folder** of one model (``<repository>/<model>/<version>/``),
every file in it, recursively, by relative POSIX path -- except the manifest and the
signature themselves and anything under a ``__pycache__`` folder (Python writes those when
the backend imports ``model.py``). Two files are written next to the artifacts:

- ``MANIFEST.json``: ``{"format", "model", "version", "files": {path: sha256 hex}}``,
  canonical JSON (sorted keys). Naming the model and the version binds the signature to its
  place: a signed version 1 copied into folder 3 is refused ("manifest is for ...").
- ``MANIFEST.sig``: ``{"format", "algorithm": "Ed25519", "key_id", "signature"}`` -- a
  detached signature (base64) over the exact bytes of ``MANIFEST.json``.

Not signed: the model's ``config.pbtxt`` and ``configs/*.pbtxt`` and its ``warmup/``
folder. A config is shared by all versions of a model and operations change it on purpose
(``dispatch-admin deploy`` loads a config override with another ``version_policy``), so
signing it into one version's manifest would tie every config edit to re-signing every
version. Configs are reviewed code, carried in git; the signature covers what a config
cannot express: the weights and the model code.

Symbolic links are refused inside a version folder (what they point to could change
without touching the folder). A folder with no files at all (an ensemble's ``1/``) has
nothing to sign and verifies as "no artifacts".

Trust: a **key id** is the first 16 hex digits of the SHA-256 of the raw 32-byte public
key. A deployment trusts the public keys found as ``*.pub`` PEM files in one directory
(``--trusted-keys DIR``); nothing is hard-coded. Private keys are only ever passed in as
objects or PEM bytes: reading them from a file or the environment is the CLI's business.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import json
import os
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

__all__ = [
    "ALGORITHM",
    "EXCLUDED_DIRS",
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "PUBLIC_KEY_SUFFIX",
    "SIGNATURE_FORMAT",
    "SIGNATURE_NAME",
    "TRUSTED_KEYS_ENV",
    "FolderEntryError",
    "Manifest",
    "Outcome",
    "SigningError",
    "TrustedKeys",
    "Verification",
    "artifact_files",
    "build_manifest",
    "copy_version",
    "file_digest",
    "generate_private_key",
    "key_id",
    "load_private_key",
    "load_public_key",
    "private_key_pem",
    "public_key_pem",
    "read_verified",
    "sign_version",
    "verify_version",
    "version_of",
    "write_key_pair",
]

MANIFEST_NAME: Final = "MANIFEST.json"
SIGNATURE_NAME: Final = "MANIFEST.sig"
MANIFEST_FORMAT: Final = "dispatch-model-manifest/1"
SIGNATURE_FORMAT: Final = "dispatch-model-signature/1"
ALGORITHM: Final = "Ed25519"
EXCLUDED_DIRS: Final = frozenset({"__pycache__"})
PUBLIC_KEY_SUFFIX: Final = ".pub"
# Set by the launcher in the server's environment when it verifies (``--trusted-keys``), so
# that every model that reads artifacts verifies them in its own `initialize` too.
TRUSTED_KEYS_ENV: Final = "DISPATCH_TRUSTED_KEYS"
_CHUNK: Final = 1 << 20


class SigningError(ValueError):
    """A key, a manifest or a folder cannot be used; the message says why."""


class FolderEntryError(SigningError):
    """A version folder holds an entry nothing may load: a symbolic link (what it points to
    could change without touching the folder) or a file that is not a regular file (a FIFO
    blocks its reader, a device never ends)."""

    def __init__(self, outcome: Outcome, message: str) -> None:
        super().__init__(message)
        self.outcome = outcome


class Outcome(enum.Enum):
    """How the check of one version folder ended."""

    VERIFIED = "verified"
    NO_ARTIFACTS = "no_artifacts"  # nothing to sign (an ensemble's empty version folder)
    MISSING_MANIFEST = "missing_manifest"
    MISSING_SIGNATURE = "missing_signature"
    MALFORMED = "malformed"
    UNKNOWN_KEY = "unknown_key"
    BAD_SIGNATURE = "bad_signature"
    WRONG_TARGET = "wrong_target"
    DIGEST_MISMATCH = "digest_mismatch"
    MISSING_FILE = "missing_file"
    UNLISTED_FILE = "unlisted_file"
    SYMLINK = "symlink"
    IRREGULAR_FILE = "irregular_file"

    @property
    def accepted(self) -> bool:
        return self in (Outcome.VERIFIED, Outcome.NO_ARTIFACTS)


@dataclass(frozen=True)
class Verification:
    """The verdict on one version folder; ``reason`` is one line for logs and CLIs."""

    model: str
    version: int
    outcome: Outcome
    reason: str
    key_id: str | None = None

    @property
    def accepted(self) -> bool:
        return self.outcome.accepted

    def line(self) -> str:
        verdict = "ok" if self.accepted else "REFUSED"
        key = f" (key {self.key_id})" if self.key_id else ""
        return f"{self.model} version {self.version}: {verdict}: {self.reason}{key}"


# ---- keys --------------------------------------------------------------------------------


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate_private_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def private_key_pem(private_key: Ed25519PrivateKey) -> bytes:
    """Unencrypted PKCS#8 PEM: protect the file (keygen writes it mode 0600) or a secret store."""
    return private_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def public_key_pem(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def load_private_key(pem: bytes, password: bytes | None = None) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=password)
    except (ValueError, TypeError) as exc:
        raise SigningError(f"not a usable PEM private key: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"private key must be Ed25519, got {type(key).__name__}")
    return key


def load_public_key(pem: bytes) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError) as exc:
        raise SigningError(f"not a usable PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningError(f"public key must be Ed25519, got {type(key).__name__}")
    return key


@dataclass(frozen=True)
class TrustedKeys:
    """The public keys a deployment accepts signatures from, by key id."""

    keys: Mapping[str, Ed25519PublicKey] = field(default_factory=dict)
    source: str = ""

    @classmethod
    def from_public_keys(cls, *keys: Ed25519PublicKey, source: str = "") -> TrustedKeys:
        return cls({key_id(key): key for key in keys}, source)

    @classmethod
    def from_directory(cls, directory: Path) -> TrustedKeys:
        """Every ``*.pub`` file of ``directory`` (not recursive); a bad file is an error."""
        if not directory.is_dir():
            raise SigningError(f"trusted keys directory {directory} does not exist")
        keys: dict[str, Ed25519PublicKey] = {}
        for path in sorted(directory.glob(f"*{PUBLIC_KEY_SUFFIX}")):
            try:
                key = load_public_key(path.read_bytes())
            except SigningError as exc:
                raise SigningError(f"{path}: {exc}") from None
            keys[key_id(key)] = key
        return cls(keys, str(directory))

    @classmethod
    def required_in(cls, directory: Path) -> TrustedKeys:
        """`from_directory`, refusing a folder without keys: verification against no key
        would refuse every version, so a command or a server asked to verify stops here."""
        trusted = cls.from_directory(directory)
        if not len(trusted):
            raise SigningError(f"no trusted keys (*.pub) in {directory}")
        return trusted

    def __len__(self) -> int:
        return len(self.keys)


def write_key_pair(private_path: Path, public_path: Path) -> str:
    """A fresh key pair: private PEM mode 0600, public PEM beside it; returns the key id.

    Refuses to overwrite either file.
    """
    for path in (private_path, public_path):
        if path.exists():
            raise SigningError(f"{path} exists; refusing to overwrite a key")
    key = generate_private_key()
    private_path.parent.mkdir(parents=True, exist_ok=True)
    public_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(private_key_pem(key))
    public_path.write_bytes(public_key_pem(key.public_key()))
    return key_id(key.public_key())


# ---- manifest ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Manifest:
    model: str
    version: int
    files: Mapping[str, str]  # relative POSIX path -> SHA-256 hex digest

    def to_bytes(self) -> bytes:
        document = {
            "format": MANIFEST_FORMAT,
            "model": self.model,
            "version": self.version,
            "files": dict(sorted(self.files.items())),
        }
        return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        try:
            document = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SigningError(f"{MANIFEST_NAME} is not JSON: {exc}") from None
        if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
            raise SigningError(f"{MANIFEST_NAME} is not a {MANIFEST_FORMAT} document")
        model, version = document.get("model"), document.get("version")
        files = document.get("files")
        if not isinstance(model, str) or not isinstance(version, int) or isinstance(version, bool):
            raise SigningError(f"{MANIFEST_NAME} needs a string model and an integer version")
        if not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in files.items()
        ):
            raise SigningError(f"{MANIFEST_NAME} files must map paths to digests")
        return cls(model, version, files)


def artifact_files(version_dir: Path) -> list[str]:
    """The signed files of a version folder: sorted relative POSIX paths.

    Raises FolderEntryError on a symbolic link or a file that is not a regular file.
    """
    return sorted(_walk(version_dir, version_dir))


def _walk(root: Path, folder: Path) -> Iterator[str]:
    with os.scandir(folder) as scan:
        entries = list(scan)
    for entry in entries:
        path = Path(entry.path)
        relative = path.relative_to(root).as_posix()
        if entry.is_symlink():
            message = f"symbolic link {relative} is not allowed in a version folder"
            raise FolderEntryError(Outcome.SYMLINK, message)
        if entry.is_dir():
            if entry.name not in EXCLUDED_DIRS:
                yield from _walk(root, path)
        elif not entry.is_file():
            raise FolderEntryError(Outcome.IRREGULAR_FILE, f"{relative} is not a regular file")
        elif folder != root or entry.name not in (MANIFEST_NAME, SIGNATURE_NAME):
            yield relative


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def copy_version(source_dir: Path, target_dir: Path) -> dict[str, str]:
    """Copy a version folder's files (artifacts, manifest and signature; no ``__pycache__``)
    into ``target_dir`` (made here, mode 0700, must not exist), each read once: the SHA-256
    digests returned are of the bytes written. Verifying the copy (`verify_version`) then
    judges exactly what was read, whatever happens to the source afterwards.

    Raises FolderEntryError on a symbolic link or a file that is not a regular file;
    OSError when the source cannot be read."""
    target_dir.mkdir(mode=0o700, parents=False)
    names = artifact_files(source_dir)
    names += [n for n in (MANIFEST_NAME, SIGNATURE_NAME) if (source_dir / n).exists()]
    return {name: _copy_file(source_dir / name, target_dir / name, name) for name in names}


def _copy_file(source: Path, target: Path, name: str) -> str:
    """Copy one regular file without following a link; the digest of what was written."""
    fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as stream:
        if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            raise FolderEntryError(Outcome.IRREGULAR_FILE, f"{name} is not a regular file")
        target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        digest = hashlib.sha256()
        out_fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(out_fd, "wb") as out:
            while chunk := stream.read(_CHUNK):
                digest.update(chunk)
                out.write(chunk)
    return digest.hexdigest()


def version_of(version_dir: Path) -> tuple[str, int]:
    """(model, version) named by a ``<model>/<version>`` folder path."""
    name = version_dir.resolve().name
    if not name.isdigit():
        raise SigningError(f"{version_dir} is not a version folder (its name must be a number)")
    return version_dir.resolve().parent.name, int(name)


def build_manifest(version_dir: Path) -> Manifest:
    model, version = version_of(version_dir)
    files = {name: file_digest(version_dir / name) for name in artifact_files(version_dir)}
    return Manifest(model, version, files)


# ---- sign and verify ---------------------------------------------------------------------


def sign_version(version_dir: Path, private_key: Ed25519PrivateKey) -> Manifest:
    """Write MANIFEST.json and MANIFEST.sig into ``version_dir``; returns the manifest."""
    if not version_dir.is_dir():
        raise SigningError(f"{version_dir} is not a folder")
    manifest = build_manifest(version_dir)
    if not manifest.files:
        raise SigningError(f"{version_dir} holds no files to sign")
    body = manifest.to_bytes()
    signature = {
        "format": SIGNATURE_FORMAT,
        "algorithm": ALGORITHM,
        "key_id": key_id(private_key.public_key()),
        "signature": base64.b64encode(private_key.sign(body)).decode("ascii"),
    }
    (version_dir / MANIFEST_NAME).write_bytes(body)
    signature_text = json.dumps(signature, indent=2, sort_keys=True) + "\n"
    (version_dir / SIGNATURE_NAME).write_text(signature_text)
    return manifest


def _read_signature(data: bytes) -> tuple[str, bytes]:
    try:
        document: Any = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SigningError(f"{SIGNATURE_NAME} is not JSON") from None
    if (
        not isinstance(document, dict)
        or document.get("format") != SIGNATURE_FORMAT
        or document.get("algorithm") != ALGORITHM
        or not isinstance(document.get("key_id"), str)
        or not isinstance(document.get("signature"), str)
    ):
        raise SigningError(f"{SIGNATURE_NAME} is not a {ALGORITHM} {SIGNATURE_FORMAT} document")
    try:
        raw = base64.b64decode(document["signature"], validate=True)
    except (binascii.Error, ValueError):
        raise SigningError(f"{SIGNATURE_NAME} signature is not base64") from None
    return document["key_id"], raw


def verify_version(version_dir: Path, trusted: TrustedKeys) -> Verification:
    """Check one version folder against the trusted keys; never raises for a bad folder."""
    model, version = version_of(version_dir)

    def verdict(outcome: Outcome, reason: str, kid: str | None = None) -> Verification:
        return Verification(model, version, outcome, reason, kid)

    try:
        present = artifact_files(version_dir)
    except FolderEntryError as exc:
        return verdict(exc.outcome, str(exc))
    manifest_path, signature_path = version_dir / MANIFEST_NAME, version_dir / SIGNATURE_NAME
    if not manifest_path.is_file():
        if not present and not signature_path.exists():
            return verdict(Outcome.NO_ARTIFACTS, "no artifacts (nothing to sign)")
        return verdict(Outcome.MISSING_MANIFEST, f"missing manifest {MANIFEST_NAME}")
    if not signature_path.is_file():
        return verdict(Outcome.MISSING_SIGNATURE, f"missing signature {SIGNATURE_NAME}")
    body = manifest_path.read_bytes()
    try:
        kid, raw_signature = _read_signature(signature_path.read_bytes())
    except SigningError as exc:
        return verdict(Outcome.MALFORMED, str(exc))
    public_key = trusted.keys.get(kid)
    if public_key is None:
        return verdict(Outcome.UNKNOWN_KEY, f"signed by unknown key {kid}")
    try:
        public_key.verify(raw_signature, body)
    except InvalidSignature:
        return verdict(Outcome.BAD_SIGNATURE, f"bad signature on {MANIFEST_NAME}", kid)
    try:
        manifest = Manifest.from_bytes(body)
    except SigningError as exc:
        return verdict(Outcome.MALFORMED, str(exc), kid)
    if (manifest.model, manifest.version) != (model, version):
        return verdict(
            Outcome.WRONG_TARGET,
            f"manifest is for {manifest.model} version {manifest.version}",
            kid,
        )
    for name in present:
        if name not in manifest.files:
            return verdict(Outcome.UNLISTED_FILE, f"unlisted file {name}", kid)
    for name, expected in sorted(manifest.files.items()):
        path = version_dir / name
        if name not in present or not path.is_file():
            return verdict(Outcome.MISSING_FILE, f"missing file {name}", kid)
        if file_digest(path) != expected:
            return verdict(Outcome.DIGEST_MISMATCH, f"digest mismatch on file {name}", kid)
    count = len(manifest.files)
    return verdict(Outcome.VERIFIED, f"{count} file{'' if count == 1 else 's'} verified", kid)


def read_verified(version_dir: Path, name: str, trusted: TrustedKeys) -> bytes:
    """The bytes of one artifact of a version folder that verifies; SigningError otherwise.

    For a model that loads its own weights (`initialize`): the whole folder must verify, and
    the bytes returned are checked once more against a manifest whose signature is checked
    on the same read, so that what is loaded is what was verified, even if the file changes
    between the check and the load.
    """
    verdict = verify_version(version_dir, trusted)
    if verdict.outcome is not Outcome.VERIFIED:
        raise SigningError(f"{verdict.model} version {verdict.version} refused: {verdict.reason}")
    data = (version_dir / name).read_bytes()
    body = (version_dir / MANIFEST_NAME).read_bytes()
    kid, raw_signature = _read_signature((version_dir / SIGNATURE_NAME).read_bytes())
    public_key = trusted.keys.get(kid)
    try:
        if public_key is None:
            raise InvalidSignature
        public_key.verify(raw_signature, body)
    except InvalidSignature:
        raise SigningError(f"{version_dir}: the signature changed while loading") from None
    expected = Manifest.from_bytes(body).files.get(name)
    if expected is None or hashlib.sha256(data).hexdigest() != expected:
        raise SigningError(f"{version_dir}: {name} changed while loading")
    return data
