"""Signed version folders: manifest, detached Ed25519 signature, trusted keys, verification.

Every key here is a throwaway made in the test; nothing reads a real key.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dispatch_service.core.repository_layout import ModelLayout, model_layout
from dispatch_service.core.signing import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    Manifest,
    Outcome,
    SigningError,
    TrustedKeys,
    artifact_files,
    build_manifest,
    file_digest,
    generate_private_key,
    key_id,
    load_private_key,
    load_public_key,
    private_key_pem,
    public_key_pem,
    sign_version,
    verify_version,
    write_key_pair,
)


def onnx_in(folder: Path) -> Path:
    """The model.onnx of a version folder (`make_version`'s)."""
    return ModelLayout(folder.parent).onnx(folder.name)


def python_model_in(folder: Path) -> Path:
    """The model.py of a version folder."""
    return ModelLayout(folder.parent).python_model(folder.name)


def make_version(root: Path, model: str = "scorer", version: int = 2) -> Path:
    layout = model_layout(root, model)
    folder = layout.version(version)
    (folder / "assets").mkdir(parents=True)
    layout.onnx(version).write_bytes(bytes(range(256)) * 4)
    layout.python_model(version).write_text("print('hello')\n")
    (folder / "assets" / "layout.json").write_text('{"features": 28}\n')
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\x00compiled")
    return folder


def flip_byte(path: Path, offset: int = 10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


KeyPair = tuple[Ed25519PrivateKey, TrustedKeys]


@pytest.fixture
def key_pair() -> KeyPair:
    key = generate_private_key()
    return key, TrustedKeys.from_public_keys(key.public_key())


# ---- manifest ----------------------------------------------------------------------------


def test_artifact_files_are_sorted_relative_and_skip_pycache_and_the_signature(
    tmp_path: Path,
) -> None:
    folder = make_version(tmp_path)
    (folder / MANIFEST_NAME).write_text("{}")
    (folder / SIGNATURE_NAME).write_text("{}")
    assert artifact_files(folder) == ["assets/layout.json", "model.onnx", "model.py"]


def test_a_nested_file_named_like_the_manifest_is_an_artifact(tmp_path: Path) -> None:
    folder = make_version(tmp_path)
    (folder / "assets" / MANIFEST_NAME).write_text("{}")
    assert "assets/MANIFEST.json" in artifact_files(folder)


def test_manifest_names_model_version_and_sha256_of_each_file(tmp_path: Path) -> None:
    folder = make_version(tmp_path, "scorer", 7)
    manifest = build_manifest(folder)
    assert (manifest.model, manifest.version) == ("scorer", 7)
    assert set(manifest.files) == {"assets/layout.json", "model.onnx", "model.py"}
    expected = hashlib.sha256(python_model_in(folder).read_bytes()).hexdigest()
    assert manifest.files["model.py"] == expected == file_digest(python_model_in(folder))


def test_manifest_bytes_are_canonical_and_round_trip(tmp_path: Path) -> None:
    manifest = Manifest("m", 3, {"b.txt": "22", "a.txt": "11"})
    again = Manifest("m", 3, {"a.txt": "11", "b.txt": "22"})
    assert manifest.to_bytes() == again.to_bytes()
    document = json.loads(manifest.to_bytes())
    assert list(document["files"]) == ["a.txt", "b.txt"]
    assert Manifest.from_bytes(manifest.to_bytes()) == Manifest(
        "m", 3, {"a.txt": "11", "b.txt": "22"}
    )


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[]", b'{"format": "other"}', b'{"format": "dispatch-model-manifest/1"}'],
)
def test_malformed_manifests_are_rejected(body: bytes) -> None:
    with pytest.raises(SigningError):
        Manifest.from_bytes(body)


def test_a_folder_whose_name_is_not_a_version_cannot_be_signed(tmp_path: Path) -> None:
    (tmp_path / "scorer" / "latest").mkdir(parents=True)
    with pytest.raises(SigningError, match="version folder"):
        build_manifest(tmp_path / "scorer" / "latest")


# ---- keys --------------------------------------------------------------------------------


def test_key_round_trip_and_key_id() -> None:
    key = generate_private_key()
    again = load_private_key(private_key_pem(key))
    public = load_public_key(public_key_pem(key.public_key()))
    assert key_id(again.public_key()) == key_id(public) == key_id(key.public_key())
    assert len(key_id(public)) == 16
    assert key_id(generate_private_key().public_key()) != key_id(public)


def test_non_ed25519_and_garbage_keys_are_refused() -> None:
    ec_key = ec.generate_private_key(ec.SECP256R1())
    ec_pem = ec_key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with pytest.raises(SigningError, match="Ed25519"):
        load_private_key(ec_pem)
    ec_pub = ec_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with pytest.raises(SigningError, match="Ed25519"):
        load_public_key(ec_pub)
    with pytest.raises(SigningError, match="PEM"):
        load_private_key(b"-----BEGIN NOTHING-----")


def test_write_key_pair_makes_a_private_file_only_the_owner_reads(tmp_path: Path) -> None:
    kid = write_key_pair(tmp_path / "ops.key", tmp_path / "keys" / "ops.pub")
    mode = stat.S_IMODE(os.stat(tmp_path / "ops.key").st_mode)
    assert mode == 0o600
    trusted = TrustedKeys.from_directory(tmp_path / "keys")
    assert list(trusted.keys) == [kid]
    private = load_private_key((tmp_path / "ops.key").read_bytes())
    assert key_id(private.public_key()) == kid
    with pytest.raises(SigningError, match="refusing to overwrite"):
        write_key_pair(tmp_path / "ops.key", tmp_path / "other.pub")


def test_trusted_keys_come_from_pub_files_of_a_directory(tmp_path: Path) -> None:
    keys = [generate_private_key() for _ in range(2)]
    for number, key in enumerate(keys):
        (tmp_path / f"k{number}.pub").write_bytes(public_key_pem(key.public_key()))
    (tmp_path / "README.md").write_text("not a key")
    trusted = TrustedKeys.from_directory(tmp_path)
    assert set(trusted.keys) == {key_id(k.public_key()) for k in keys}
    assert len(trusted) == 2


def test_a_bad_pub_file_or_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SigningError, match="does not exist"):
        TrustedKeys.from_directory(tmp_path / "nowhere")
    (tmp_path / "broken.pub").write_text("garbage")
    with pytest.raises(SigningError, match=r"broken\.pub"):
        TrustedKeys.from_directory(tmp_path)


def test_a_folder_without_keys_is_refused_where_keys_are_required(tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("not a key")
    assert len(TrustedKeys.from_directory(tmp_path)) == 0
    with pytest.raises(SigningError, match=r"no trusted keys \(\*\.pub\) in "):
        TrustedKeys.required_in(tmp_path)
    key = generate_private_key()
    (tmp_path / "ops.pub").write_bytes(public_key_pem(key.public_key()))
    assert set(TrustedKeys.required_in(tmp_path).keys) == {key_id(key.public_key())}


# ---- sign and verify ---------------------------------------------------------------------


def test_signing_writes_manifest_and_detached_signature(tmp_path: Path, key_pair: KeyPair) -> None:
    key, trusted = key_pair
    folder = make_version(tmp_path)
    manifest = sign_version(folder, key)
    assert Manifest.from_bytes((folder / MANIFEST_NAME).read_bytes()) == manifest
    signature = json.loads((folder / SIGNATURE_NAME).read_text())
    assert signature["algorithm"] == "Ed25519"
    assert signature["key_id"] == key_id(key.public_key())
    assert len(base64.b64decode(signature["signature"])) == 64
    verdict = verify_version(folder, trusted)
    assert verdict.outcome is Outcome.VERIFIED and verdict.accepted
    assert verdict.key_id == signature["key_id"]
    assert "3 files verified" in verdict.reason


def test_pycache_written_after_signing_does_not_matter(tmp_path: Path, key_pair: KeyPair) -> None:
    key, trusted = key_pair
    folder = make_version(tmp_path)
    sign_version(folder, key)
    (folder / "__pycache__" / "other.pyc").write_bytes(b"new")
    (folder / "assets" / "__pycache__").mkdir()
    assert verify_version(folder, trusted).outcome is Outcome.VERIFIED


def test_resigning_replaces_the_old_manifest(tmp_path: Path, key_pair: KeyPair) -> None:
    key, trusted = key_pair
    folder = make_version(tmp_path)
    sign_version(folder, key)
    python_model_in(folder).write_text("print('v2')\n")
    sign_version(folder, key)
    assert verify_version(folder, trusted).accepted


def run_case(
    tmp_path: Path, key_pair: KeyPair, change: Callable[[Path], object]
) -> tuple[Outcome, str]:
    key, trusted = key_pair
    folder = make_version(tmp_path)
    sign_version(folder, key)
    change(folder)
    verdict = verify_version(folder, trusted)
    assert not verdict.accepted
    assert verdict.line().startswith("scorer version 2: REFUSED: ")
    return verdict.outcome, verdict.reason


def test_a_flipped_byte_is_a_digest_mismatch_naming_the_file(
    tmp_path: Path, key_pair: KeyPair
) -> None:
    outcome, reason = run_case(tmp_path, key_pair, lambda f: flip_byte(onnx_in(f)))
    assert outcome is Outcome.DIGEST_MISMATCH
    assert reason == "digest mismatch on file model.onnx"


def test_an_added_file_is_refused(tmp_path: Path, key_pair: KeyPair) -> None:
    outcome, reason = run_case(
        tmp_path, key_pair, lambda f: (f / "assets" / "extra.py").write_text("import os")
    )
    assert (outcome, reason) == (Outcome.UNLISTED_FILE, "unlisted file assets/extra.py")


def test_a_removed_file_is_refused(tmp_path: Path, key_pair: KeyPair) -> None:
    outcome, reason = run_case(tmp_path, key_pair, lambda f: python_model_in(f).unlink())
    assert (outcome, reason) == (Outcome.MISSING_FILE, "missing file model.py")


def test_an_edited_manifest_breaks_the_signature(tmp_path: Path, key_pair: KeyPair) -> None:
    def forge(folder: Path) -> None:
        flip_byte(onnx_in(folder))
        manifest = build_manifest(folder)  # the digests of the tampered files
        (folder / MANIFEST_NAME).write_bytes(manifest.to_bytes())

    outcome, reason = run_case(tmp_path, key_pair, forge)
    assert (outcome, reason) == (Outcome.BAD_SIGNATURE, "bad signature on MANIFEST.json")


def test_a_signature_by_another_key_is_unknown(tmp_path: Path, key_pair: KeyPair) -> None:
    _, trusted = key_pair
    folder = make_version(tmp_path)
    stranger = generate_private_key()
    sign_version(folder, stranger)
    verdict = verify_version(folder, trusted)
    assert verdict.outcome is Outcome.UNKNOWN_KEY
    assert verdict.reason == f"signed by unknown key {key_id(stranger.public_key())}"


def test_a_forged_key_id_does_not_pass(tmp_path: Path, key_pair: KeyPair) -> None:
    key, trusted = key_pair
    folder = make_version(tmp_path)
    sign_version(
        folder, generate_private_key()
    )  # a stranger signs, then claims the trusted key's id
    signature = json.loads((folder / SIGNATURE_NAME).read_text())
    signature["key_id"] = key_id(key.public_key())
    (folder / SIGNATURE_NAME).write_text(json.dumps(signature))
    assert verify_version(folder, trusted).outcome is Outcome.BAD_SIGNATURE


def test_missing_manifest_and_missing_signature(tmp_path: Path, key_pair: KeyPair) -> None:
    _, trusted = key_pair
    folder = make_version(tmp_path)
    verdict = verify_version(folder, trusted)
    assert (verdict.outcome, verdict.reason) == (
        Outcome.MISSING_MANIFEST,
        "missing manifest MANIFEST.json",
    )
    outcome, reason = run_case(tmp_path / "b", key_pair, lambda f: (f / SIGNATURE_NAME).unlink())
    assert (outcome, reason) == (Outcome.MISSING_SIGNATURE, "missing signature MANIFEST.sig")


def test_a_garbled_signature_file_is_malformed(tmp_path: Path, key_pair: KeyPair) -> None:
    outcome, _ = run_case(tmp_path, key_pair, lambda f: (f / SIGNATURE_NAME).write_text("{"))
    assert outcome is Outcome.MALFORMED


def test_a_signed_version_moved_to_another_slot_is_refused(
    tmp_path: Path, key_pair: KeyPair
) -> None:
    key, trusted = key_pair
    folder = make_version(tmp_path, "scorer", 1)
    sign_version(folder, key)
    moved = folder.rename(tmp_path / "scorer" / "3")
    verdict = verify_version(moved, trusted)
    assert verdict.outcome is Outcome.WRONG_TARGET
    assert verdict.reason == "manifest is for scorer version 1"


def test_a_symlink_in_a_version_folder_is_refused(tmp_path: Path, key_pair: KeyPair) -> None:
    key, trusted = key_pair
    folder = make_version(tmp_path)
    (folder / "link.onnx").symlink_to(onnx_in(folder))
    with pytest.raises(SigningError, match=r"symbolic link link\.onnx"):
        sign_version(folder, key)
    assert verify_version(folder, trusted).outcome is Outcome.SYMLINK


def test_an_empty_version_folder_has_no_artifacts(tmp_path: Path, key_pair: KeyPair) -> None:
    key, trusted = key_pair
    folder = tmp_path / "ensemble" / "1"
    folder.mkdir(parents=True)
    verdict = verify_version(folder, trusted)
    assert verdict.outcome is Outcome.NO_ARTIFACTS and verdict.accepted
    with pytest.raises(SigningError, match="no files"):
        sign_version(folder, key)
