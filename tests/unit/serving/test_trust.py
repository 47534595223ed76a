"""serving.trust and the dispatch_model load: verification in the model's own initialize."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import ONNX_FILE, SCORING_MODEL, model_layout
from dispatch_service.core.signing import (
    TRUSTED_KEYS_ENV,
    SigningError,
    generate_private_key,
    public_key_pem,
    read_verified,
    sign_version,
)
from dispatch_service.pipeline.steps import DispatchModelStep
from dispatch_service.serving.trust import model_trust


def signed_version(tmp_path: Path) -> tuple[Path, Path]:
    """dispatch_model version 1 copied and signed; the folder of its trusted public key."""
    folder = model_layout(tmp_path, SCORING_MODEL).version(1)
    shutil.copytree(
        model_layout(MODEL_REPOSITORY, SCORING_MODEL).version(1),
        folder,
        ignore=shutil.ignore_patterns("__pycache__", "MANIFEST.*"),
    )
    key = generate_private_key()
    sign_version(folder, key)
    keys = tmp_path / "trusted"
    keys.mkdir()
    (keys / "ops.pub").write_bytes(public_key_pem(key.public_key()))
    return folder, keys


def test_no_variable_no_verification_and_an_empty_folder_fails(tmp_path: Path) -> None:
    assert model_trust({}) is None
    assert model_trust({TRUSTED_KEYS_ENV: ""}) is None
    with pytest.raises(SigningError, match="no trusted keys"):
        model_trust({TRUSTED_KEYS_ENV: str(tmp_path)})
    with pytest.raises(SigningError, match="does not exist"):
        model_trust({TRUSTED_KEYS_ENV: str(tmp_path / "absent")})


def test_dispatch_model_loads_verified_weights_and_refuses_tampered_ones(tmp_path: Path) -> None:
    _, keys = signed_version(tmp_path)
    trusted = model_trust({TRUSTED_KEYS_ENV: str(keys)})
    assert trusted is not None and len(trusted) == 1
    onnx = model_layout(tmp_path, SCORING_MODEL).onnx(1)
    DispatchModelStep.from_parameters(onnx, {}, trusted=trusted)
    data = bytearray(onnx.read_bytes())
    data[-1] ^= 0xFF
    onnx.write_bytes(bytes(data))
    DispatchModelStep.from_parameters(onnx, {})  # unverified: loads (no keys configured)
    with pytest.raises(SigningError, match=r"digest mismatch on file model\.onnx"):
        DispatchModelStep.from_parameters(onnx, {}, trusted=trusted)


def test_read_verified_returns_the_bytes_the_manifest_names(tmp_path: Path) -> None:
    folder, keys = signed_version(tmp_path)
    trusted = model_trust({TRUSTED_KEYS_ENV: str(keys)})
    assert trusted is not None
    onnx = model_layout(tmp_path, SCORING_MODEL).onnx(1)
    assert read_verified(folder, ONNX_FILE, trusted) == onnx.read_bytes()
    (folder / "extra.txt").write_text("not signed")
    with pytest.raises(SigningError, match=r"unlisted file extra\.txt"):
        read_verified(folder, ONNX_FILE, trusted)
