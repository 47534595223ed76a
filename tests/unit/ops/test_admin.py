"""`dispatch-admin` (dispatch_service.ops.admin) without a server: keys, signing,
verification, golden checks, usage errors and exit codes.

The fixtures (a signed repository copy, throwaway keys) are in conftest.py; the deploy /
rollback / status sequence is in test_model_lifecycle.py.
"""

from __future__ import annotations

import io
import shutil
from pathlib import Path
from typing import Any

import pytest

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import DISPATCH_ENSEMBLE, SCORING_MODEL, model_layout
from dispatch_service.core.signing import generate_private_key, private_key_pem, public_key_pem
from dispatch_service.ops import admin
from dispatch_service.ops.golden import GoldenSettings, check_candidate, golden_tensors
from dispatch_service.ops.model_lifecycle import signable_versions

MODEL = SCORING_MODEL


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = admin.main(list(argv), out=out)
    return code, out.getvalue()


# ---- keygen, sign, verify ----------------------------------------------------------------


def test_keygen_then_sign_with_a_key_file_then_verify(
    tmp_path: Path, repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text = run("keygen", "--out", str(tmp_path / "keys"), "--name", "ops")
    assert code == 0 and "key id " in text
    trusted = tmp_path / "keys" / "trusted"
    trusted.mkdir()
    shutil.copy(tmp_path / "keys" / "ops.pub", trusted / "ops.pub")
    key = str(tmp_path / "keys" / "ops.key")
    for version in ("1", "2"):
        code, text = run(
            "sign", "--model", MODEL, "--version", version, "--key", key,
            "--model-repository", str(repo),
        )  # fmt: skip
        assert code == 0 and f"signed {MODEL} version {version}: 2 files" in text
    (model_layout(repo, MODEL).version(3) / "MANIFEST.json").unlink()
    code, text = run("verify", str(repo), "--trusted-keys", str(trusted))
    assert code == 1
    assert f"{MODEL} version 1: ok: 2 files verified" in text
    assert f"{MODEL} version 3: REFUSED: missing manifest MANIFEST.json" in text
    # The config serves the latest version only: 3 is refused, and 2 is not served instead.
    assert f"{MODEL}: REFUSED: no verified version to serve" in text
    assert "feature_encoder: loads" in text


def test_sign_reads_the_key_from_the_environment(
    repo: Path, trusted_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = generate_private_key()
    monkeypatch.setenv("DISPATCH_SIGNING_KEY", private_key_pem(other).decode())
    code, text = run("sign", "--model", MODEL, "--version", "2", "--model-repository", str(repo))
    assert code == 0
    (trusted_dir / "other.pub").write_bytes(public_key_pem(other.public_key()))
    code, text = run("verify", str(repo), "--trusted-keys", str(trusted_dir))
    assert code == 0, text


def test_verify_passes_a_fully_signed_repository(repo: Path, trusted_dir: Path) -> None:
    code, text = run("verify", str(repo), "--trusted-keys", str(trusted_dir))
    assert code == 0, text
    assert "REFUSED" not in text


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["bogus"],
        ["sign", "--model", MODEL],
        ["deploy", "--version", "2"],
        ["verify", "/nonexistent/repository", "--trusted-keys", "/tmp"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISPATCH_TRUSTED_KEYS", raising=False)
    assert run(*argv)[0] == 2


def test_sign_without_any_key_is_a_usage_error(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DISPATCH_SIGNING_KEY", raising=False)
    code, _ = run("sign", "--model", MODEL, "--version", "2", "--model-repository", str(repo))
    assert code == 2
    assert "DISPATCH_SIGNING_KEY" in capsys.readouterr().err


def test_verify_without_trusted_keys_is_a_usage_error(
    repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DISPATCH_TRUSTED_KEYS", raising=False)
    assert run("verify", str(repo))[0] == 2
    expected = "usage error: --trusted-keys DIR (or DISPATCH_TRUSTED_KEYS) is required\n"
    assert capsys.readouterr().err == expected


def test_verify_and_fleet_commands_read_trusted_keys_alike(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One reader of the trusted keys (`fleet_admin.trusted_keys`): `verify` and `history`
    refuse a folder without keys with the same line and exit code."""
    empty = tmp_path / "no-keys"
    empty.mkdir()
    line = f"usage error: no trusted keys (*.pub) in {empty}\n"
    assert run("verify", str(repo), "--trusted-keys", str(empty))[0] == 2
    assert capsys.readouterr().err == line
    store = tmp_path / "fleet"
    assert run("history", "--state-store", str(store), "--trusted-keys", str(empty))[0] == 2
    assert capsys.readouterr().err == line


def test_sign_with_an_unreadable_key_file_is_a_usage_error(
    repo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "absent.key"
    argv = ["sign", "--model", MODEL, "--version", "2", "--model-repository", str(repo)]
    assert run(*argv, "--key", str(missing))[0] == 2
    assert capsys.readouterr().err.startswith("usage error: cannot read the signing key: ")


# ---- golden windows ----------------------------------------------------------------------


def test_golden_windows_are_deterministic() -> None:
    settings = GoldenSettings(windows=2, num_orders=8, num_riders=20)
    first, second = golden_tensors(settings), golden_tensors(settings)
    for a, b in zip(first, second, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            assert (a[name] == b[name]).all()


def test_an_identical_model_agrees_and_a_random_one_does_not(repo: Path) -> None:
    same = check_candidate(repo, 2, 1)
    assert same.passed
    assert same.top1_agreement == 1.0 and same.mean_abs_eta_diff_minutes == 0.0
    assert same.windows == 8 and same.pairs > 0
    other = check_candidate(repo, 3, 1)
    assert not other.passed
    assert any("agreement" in p or "ETA" in p for p in other.problems)


def test_thresholds_are_options(repo: Path) -> None:
    lenient = GoldenSettings(min_top1_agreement=0.0, max_mean_eta_diff_minutes=1e6)
    assert check_candidate(repo, 3, 1, lenient).passed
    with pytest.raises(ValueError):
        GoldenSettings(min_top1_agreement=1.5)


# ---- sign-repository, keygen defaults, help ---------------------------------------------


def test_sign_repository_signs_every_loadable_folder_of_the_committed_layout(
    tmp_path: Path, signer: Any, trusted_dir: Path
) -> None:
    # A copy of the committed repository: what a verified start reads.
    repository = tmp_path / "full"
    shutil.copytree(MODEL_REPOSITORY, repository, ignore=shutil.ignore_patterns("__pycache__"))
    code, text = run("verify", str(repository), "--trusted-keys", str(trusted_dir))
    assert code == 1 and "dispatch: REFUSED" in text  # unsigned: the entry point is refused
    assert text.rstrip().endswith(
        "7 version folders unsigned; if their files are the ones to trust, sign every loadable "
        f"folder: dispatch-admin sign-repository {repository} --key KEY (or make sign-all KEY=...)"
    )
    key = tmp_path / "ops.key"
    key.write_bytes(private_key_pem(signer))
    code, text = run("sign-repository", str(repository), "--key", str(key))
    assert code == 0, text
    expected = [
        ("dispatch_fused", 1), ("dispatch_model", 1), ("dispatch_model", 2),
        ("dispatch_priority", 1), ("dispatch_router", 1), ("feature_encoder", 1),
        ("topk_resolver", 1),
    ]  # fmt: skip
    assert signable_versions(repository) == expected
    for model, version in expected:
        assert f"signed {model} version {version}: " in text
        assert (model_layout(repository, model).version(version) / "MANIFEST.sig").is_file()
    # Ensembles' folders (a .gitkeep) are not signed: Triton reads nothing there.
    assert not (model_layout(repository, DISPATCH_ENSEMBLE).version(1) / "MANIFEST.json").exists()
    assert "signed dispatch_router version 1: 1 file\n" in text  # not "1 files"
    assert text.rstrip().endswith(f"signed 7 version folders of 6 models in {repository}")
    code, text = run("verify", str(repository), "--trusted-keys", str(trusted_dir))
    assert code == 0, text
    assert "REFUSED" not in text and "dispatch: loads" in text and "dispatch_fused: loads" in text
    assert "unsigned" not in text
    assert "dispatch_router version 1: ok: 1 file verified" in text


def test_sign_repository_needs_a_key_and_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DISPATCH_SIGNING_KEY", raising=False)
    assert run("sign-repository", str(tmp_path))[0] == 2
    assert "DISPATCH_SIGNING_KEY" in capsys.readouterr().err
    monkeypatch.setenv("DISPATCH_SIGNING_KEY", private_key_pem(generate_private_key()).decode())
    assert run("sign-repository", str(tmp_path / "missing"))[0] == 2
    assert "is not a folder" in capsys.readouterr().err


def test_keygen_defaults_to_ops_keys_under_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    code, text = run("keygen")
    assert code == 0, text
    assert (tmp_path / "keys" / "ops.key").is_file() and (tmp_path / "keys" / "ops.pub").is_file()
    assert run("keygen")[0] == 2  # never overwrites a key


@pytest.mark.parametrize("command", ["keygen", "sign", "sign-repository", "verify", "deploy"])
def test_help_shows_every_default(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(command, "--help")[0] == 0
    text = " ".join(capsys.readouterr().out.split())
    expected = {
        "keygen": ["(default: ~/keys)", "(default: ops)"],
        "sign": [f"(default: {MODEL_REPOSITORY})"],
        "sign-repository": [f"(default: {MODEL_REPOSITORY})"],
        "verify": ["(default: cpu)"],
        "deploy": ["(default: 10)", "(default: .triton/fleet)", "(default: dispatch_model)"],
    }[command]
    for default in expected:
        assert default in text
    assert "(default: None)" not in text


def test_verify_suggests_signing_only_for_unsigned_folders(repo: Path, trusted_dir: Path) -> None:
    model_layout(repo, MODEL).onnx(2).write_bytes(b"tampered")
    code, text = run("verify", str(repo), "--trusted-keys", str(trusted_dir))
    assert code == 1 and "digest mismatch on file model.onnx" in text
    assert "sign-repository" not in text  # never advise signing over changed files
    (model_layout(repo, MODEL).version(3) / "MANIFEST.sig").unlink()
    code, text = run("verify", str(repo), "--trusted-keys", str(trusted_dir))
    assert "1 version folder unsigned; " in text
