"""`dispatch-admin` without a server: keys, signing, verification, golden checks, exit codes,
and the deploy / rollback sequence against a stand-in router and model-control API.

The repository is a copy in tmp_path of the committed configs and version 1 of the model;
version 2 is the same ONNX file (agrees with 1), version 3 a random contract model (does
not). Keys are throwaway.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import shutil
import types
from pathlib import Path
from typing import Any

import pytest

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.signing import (
    generate_private_key,
    private_key_pem,
    public_key_pem,
    sign_version,
)
from dispatch_service.ops import admin
from dispatch_service.ops.golden import GoldenSettings, check_candidate, golden_tensors
from dispatch_service.ops.model_control import ModelControlError
from dispatch_service.ops.router_control import RouterControlError
from dispatch_service.routing.settings import CityRoute, RouterSettings

MODEL = "dispatch_model"


@pytest.fixture
def signer() -> Any:
    return generate_private_key()


@pytest.fixture
def trusted_dir(tmp_path: Path, signer: Any) -> Path:
    folder = tmp_path / "trusted"
    folder.mkdir()
    (folder / "ops.pub").write_bytes(public_key_pem(signer.public_key()))
    return folder


@pytest.fixture
def repo(tmp_path: Path, signer: Any, contract_model: Path) -> Path:
    root = tmp_path / "repo"
    for name in ("feature_encoder", "topk_resolver"):
        (root / name).mkdir(parents=True)
        shutil.copy(MODEL_REPOSITORY / name / "config.pbtxt", root / name / "config.pbtxt")
    (root / MODEL).mkdir(parents=True)
    # The committed config with a known policy: serve the latest version only.
    config = [
        line
        for line in (MODEL_REPOSITORY / MODEL / "config.pbtxt").read_text().splitlines()
        if not line.startswith("version_policy")
    ]
    config.append("version_policy: { latest: { num_versions: 1 } }")
    (root / MODEL / "config.pbtxt").write_text("\n".join(config) + "\n")
    for version in (1, 2):
        folder = root / MODEL / str(version)
        folder.mkdir()
        shutil.copy(MODEL_REPOSITORY / MODEL / "1" / "model.onnx", folder / "model.onnx")
        shutil.copy(MODEL_REPOSITORY / MODEL / "1" / "model.py", folder / "model.py")
    (root / MODEL / "3").mkdir()
    shutil.copy(contract_model, root / MODEL / "3" / "model.onnx")
    for version in (1, 2, 3):
        sign_version(root / MODEL / str(version), signer)
    return root


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
    (repo / MODEL / "3" / "MANIFEST.json").unlink()
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
    assert "--trusted-keys" in capsys.readouterr().err


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


# ---- deploy and rollback against stand-ins -----------------------------------------------


class FakeServer:
    """The router settings and the versions Triton serves, as the admin sees them."""

    def __init__(self, versions: tuple[int, ...] = (1,)) -> None:
        self.settings = RouterSettings(stable_version=1)
        self.versions = versions
        self.loads: list[tuple[int, ...]] = []
        self.fail_router = False
        self.fail_load = False

    def read_router_settings(
        self, http_url: str, admin_key: str | None = None, timeout_s: float = 30.0
    ) -> Any:
        return self.settings

    def apply_router_settings(
        self,
        http_url: str,
        settings: Any,
        admin_key: str | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        if self.fail_router:
            raise RouterControlError("HTTP 400: router failed to load", 400)
        self.settings = settings

    def ready_versions(
        self, http_url: str, model: str, admin_key: str | None = None, timeout_s: float = 30.0
    ) -> Any:
        return self.versions

    def model_config(self, http_url: str, model: str, timeout_s: float = 30.0) -> dict[str, Any]:
        return {"name": model, "version_policy": {"latest": {"num_versions": 1}}}

    def load_model(
        self,
        http_url: str,
        model: str,
        config: dict[str, Any] | None = None,
        admin_key: str | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        if self.fail_load:
            raise ModelControlError("HTTP 400: failed to load", 400)
        assert config is not None
        versions = tuple(config["version_policy"]["specific"]["versions"])
        self.loads.append(versions)
        self.versions = versions


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> FakeServer:
    fake = FakeServer()
    router = types.SimpleNamespace(
        read_router_settings=fake.read_router_settings,
        read_fused_settings=fake.read_router_settings,  # both entry points move together
        apply_router_settings=fake.apply_router_settings,
    )
    monkeypatch.setattr(admin, "router_control", router)
    for name in ("ready_versions", "model_config", "load_model"):
        monkeypatch.setattr(admin, name, getattr(fake, name))
    return fake


def deploy(repo: Path, trusted_dir: Path, version: int, *extra: str) -> tuple[int, str]:
    return run(
        "deploy", "--model", MODEL, "--version", str(version), "--canary-percent", "25",
        "--url", "127.0.0.1:1", "--admin-key", "k", "--trusted-keys", str(trusted_dir),
        "--model-repository", str(repo), *extra,
    )  # fmt: skip


def test_deploy_loads_both_versions_then_routes_the_canary(
    repo: Path, trusted_dir: Path, server: FakeServer
) -> None:
    code, text = deploy(repo, trusted_dir, 2)
    assert code == 0, text
    assert server.loads == [(1, 2)]
    assert (server.settings.canary_version, server.settings.canary_percent) == (2, 25)
    assert server.settings.stable_version == 1
    assert "top-1 agreement 1.000" in text
    assert text.strip().endswith("deployed dispatch_model version 2 as canary at 25% (stable 1)")


def test_a_version_already_served_is_not_reloaded(
    repo: Path, trusted_dir: Path, server: FakeServer
) -> None:
    server.versions = (1, 2)
    assert deploy(repo, trusted_dir, 2)[0] == 0
    assert server.loads == []
    assert server.settings.canary_version == 2


@pytest.mark.parametrize(
    ("prepare", "reason"),
    [
        (lambda repo: (repo / MODEL / "2" / "model.onnx").write_bytes(b"x"), "digest mismatch"),
        (lambda repo: (repo / MODEL / "2" / "MANIFEST.sig").unlink(), "missing signature"),
        (lambda repo: None, "golden check failed"),
    ],
)
def test_a_refused_deploy_changes_nothing_and_says_why_on_one_line(
    repo: Path,
    trusted_dir: Path,
    server: FakeServer,
    capsys: pytest.CaptureFixture[str],
    prepare: Any,
    reason: str,
) -> None:
    version = 3 if reason == "golden check failed" else 2
    prepare(repo)
    before = server.settings
    code, _ = deploy(repo, trusted_dir, version)
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("deploy failed: ") and reason in err[0]
    assert server.settings == before and server.loads == []


@pytest.mark.parametrize("changed", ["served stable", "router"])
def test_deploy_verifies_every_folder_its_loads_make_triton_read(
    repo: Path,
    trusted_dir: Path,
    signer: Any,
    server: FakeServer,
    capsys: pytest.CaptureFixture[str],
    changed: str,
) -> None:
    """Triton reads a served version's folder again when it changed, and the new routing
    reloads the router (its model.py runs anew): a deploy verifies those too, and a refusal
    names the digest of the file found."""
    router = repo / "dispatch_router" / "1"
    router.mkdir(parents=True)
    (router / "model.py").write_text("# the router\n")
    sign_version(router, signer)
    target = (
        (repo / MODEL / "1" / "model.py") if changed == "served stable" else router / "model.py"
    )
    target.write_text("import os  # not what was signed\n")
    before = server.settings
    code, _ = deploy(repo, trusted_dir, 2)
    assert code == 1
    err = capsys.readouterr().err.strip()
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    assert "digest mismatch on file model.py" in err and f"model.py sha256 {digest}" in err
    assert server.settings == before and server.loads == []


def test_a_failed_load_leaves_the_router_alone(
    repo: Path, trusted_dir: Path, server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.fail_load = True
    assert deploy(repo, trusted_dir, 2)[0] == 1
    assert "failed to load" in capsys.readouterr().err
    assert server.settings.canary_version == 0


def test_a_failed_router_update_restores_the_served_versions(
    repo: Path, trusted_dir: Path, server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    server.fail_router = True
    assert deploy(repo, trusted_dir, 2)[0] == 1
    assert server.loads == [(1, 2), (1,)]
    assert server.settings.canary_version == 0
    assert "router update failed" in capsys.readouterr().err


def test_deploying_the_stable_version_or_another_model_is_refused(
    repo: Path, trusted_dir: Path, server: FakeServer
) -> None:
    assert deploy(repo, trusted_dir, 1)[0] == 1
    code, _ = run(
        "deploy", "--model", "topk_resolver", "--version", "2", "--url", "h:1",
        "--trusted-keys", str(trusted_dir), "--model-repository", str(repo),
    )  # fmt: skip
    assert code == 2
    assert deploy(repo, trusted_dir, 2, "--canary-percent", "101")[0] == 2


def test_rollback_routes_everything_to_stable_and_can_unload_the_canary(
    repo: Path, trusted_dir: Path, server: FakeServer
) -> None:
    assert deploy(repo, trusted_dir, 2)[0] == 0
    assert server.settings.scoring_versions == (1, 2)
    server.settings = dataclasses.replace(server.settings, shadow_percent=10)
    code, text = run("rollback", "--url", "h:1", "--admin-key", "k", "--unload-canary")
    assert code == 0, text
    assert (server.settings.canary_version, server.settings.canary_percent) == (0, 0)
    assert server.settings.shadow_percent == 0
    assert server.versions == (1,) and server.settings.scoring_versions == (1,)
    assert text.strip() == (
        "rolled back dispatch_model: every order routed to stable version 1 "
        "(canary 2 no longer routed); loaded versions [1] (unloaded [2])"
    )


def test_rollback_then_unload_canary_leaves_a_true_state_in_either_order(
    repo: Path, trusted_dir: Path, server: FakeServer
) -> None:
    """The operator's report: rollback said the canary was removed but v2 stayed loaded, and
    a later --unload-canary found no canary and did nothing."""
    assert deploy(repo, trusted_dir, 2)[0] == 0
    code, text = run("rollback", "--url", "h:1")
    assert code == 0
    assert "canary 2 no longer routed); loaded versions [1, 2]; 2 still loaded" in text
    assert server.versions == (1, 2) and server.settings.scoring_versions == (1, 2)
    assert run("status", "--url", "h:1")[0] == 0
    code, text = run("rollback", "--url", "h:1", "--unload-canary")
    assert code == 0
    assert "(there was no canary); loaded versions [1] (unloaded [2])" in text
    assert server.versions == (1,) and server.settings.scoring_versions == (1,)
    code, text = run("status", "--url", "h:1")
    assert code == 0 and json.loads(text)["routed"] == "stable version 1 only"
    assert (
        run("rollback", "--url", "h:1", "--unload-canary")[1]
        .strip()
        .endswith("loaded versions [1]")
    )


def test_a_failed_unload_routes_to_stable_and_says_what_stays_loaded(
    repo: Path, trusted_dir: Path, server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert deploy(repo, trusted_dir, 2)[0] == 0
    server.fail_load = True
    code, _ = run("rollback", "--url", "h:1", "--unload-canary")
    assert code == 1
    err = capsys.readouterr().err
    assert "every order is routed to stable version 1, versions [1, 2] stay loaded" in err
    assert server.versions == (1, 2)
    assert (server.settings.canary_version, server.settings.scoring_versions) == (0, (1, 2))
    assert run("status", "--url", "h:1")[0] == 0  # status and the server agree


def test_rollback_without_a_canary_is_harmless(server: FakeServer) -> None:
    code, text = run("rollback", "--url", "h:1")
    assert code == 0 and "there was no canary" in text
    assert server.loads == []


# ---- per-city routes: deploy and rollback --city ------------------------------------------


def test_deploy_to_one_city_routes_only_that_citys_windows_to_the_canary(
    repo: Path, trusted_dir: Path, server: FakeServer
) -> None:
    code, text = deploy(repo, trusted_dir, 2, "--city", "beijing")
    assert code == 0, text
    assert text.strip().endswith(
        "deployed dispatch_model version 2 as canary at 25% in beijing (stable 1)"
    )
    settings = server.settings
    assert settings.city_routes == (CityRoute("beijing", canary_version=2, canary_percent=25),)
    assert (settings.canary_version, settings.canary_percent) == (0, 0)  # other cities: as before
    assert settings.scoring_versions == (1, 2) and server.loads == [(1, 2)]
    code, text = run("status", "--url", "h:1")
    assert code == 0
    document = json.loads(text)
    assert document["routed"] == "stable version 1 only"
    assert document["routed_by_city"] == {
        "beijing": "stable version 1, canary version 2 for 25% of users"
    }
    # a deploy for every city takes over every city's canary
    assert deploy(repo, trusted_dir, 2)[0] == 0
    assert server.settings.city_routes == () and server.settings.canary_percent == 25


def test_an_unknown_city_is_a_usage_error_naming_it(
    repo: Path, trusted_dir: Path, server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    before = server.settings
    assert deploy(repo, trusted_dir, 2, "--city", "atlantis")[0] == 2
    assert "--city atlantis: no registered city has that id" in capsys.readouterr().err
    assert run("rollback", "--url", "h:1", "--city", "atlantis")[0] == 2
    assert "atlantis" in capsys.readouterr().err
    assert server.settings == before and server.loads == []


def test_rollback_of_one_city_keeps_the_versions_other_cities_use(
    repo: Path, trusted_dir: Path, server: FakeServer
) -> None:
    assert deploy(repo, trusted_dir, 2, "--city", "beijing")[0] == 0
    assert deploy(repo, trusted_dir, 2, "--city", "shenzhen", "--canary-percent", "50")[0] == 0
    server.settings = dataclasses.replace(server.settings, shadow_percent=10)
    code, text = run("rollback", "--url", "h:1", "--city", "beijing", "--unload-canary")
    assert code == 0, text
    assert text.strip() == (
        "rolled back dispatch_model: every order in beijing routed to stable version 1 "
        "(canary 2 no longer routed); loaded versions [1, 2]"
    )
    settings = server.settings
    assert settings.for_city("beijing").canary_percent == 0
    assert settings.for_city("shenzhen").canary_percent == 50  # untouched
    assert settings.shadow_percent == 10  # global: a city's rollback leaves it
    assert server.versions == (1, 2)  # shenzhen is still routed to 2
    code, text = run("rollback", "--url", "h:1", "--city", "shenzhen", "--unload-canary")
    assert code == 0, text
    assert text.strip().endswith("loaded versions [1] (unloaded [2])")
    assert server.versions == (1,) and server.settings.scoring_versions == (1,)
    assert server.settings.for_city("shenzhen").canary_percent == 0


# ---- sign-repository, keygen defaults, status JSON, deploy and the admin key --------------


def test_sign_repository_signs_every_loadable_folder_of_the_committed_layout(
    tmp_path: Path, signer: Any, trusted_dir: Path
) -> None:
    # A copy of the committed repository: what a verified start reads.
    repository = tmp_path / "full"
    shutil.copytree(MODEL_REPOSITORY, repository, ignore=shutil.ignore_patterns("__pycache__"))
    code, text = run("verify", str(repository), "--trusted-keys", str(trusted_dir))
    assert code == 1 and "dispatch: REFUSED" in text  # unsigned: the entry point is refused
    assert text.rstrip().endswith(
        "6 version folders unsigned; if their files are the ones to trust, sign every loadable "
        f"folder: dispatch-admin sign-repository {repository} --key KEY (or make sign-all KEY=...)"
    )
    key = tmp_path / "ops.key"
    key.write_bytes(private_key_pem(signer))
    code, text = run("sign-repository", str(repository), "--key", str(key))
    assert code == 0, text
    expected = [
        ("dispatch_fused", 1), ("dispatch_model", 1), ("dispatch_model", 2),
        ("dispatch_router", 1), ("feature_encoder", 1), ("topk_resolver", 1),
    ]  # fmt: skip
    assert admin.signable_versions(repository) == expected
    for model, version in expected:
        assert f"signed {model} version {version}: " in text
        assert (repository / model / str(version) / "MANIFEST.sig").is_file()
    # Ensembles' folders (a .gitkeep) are not signed: Triton reads nothing there.
    assert not (repository / "dispatch" / "1" / "MANIFEST.json").exists()
    assert "signed dispatch_router version 1: 1 file\n" in text  # not "1 files"
    assert text.rstrip().endswith(f"signed 6 version folders of 5 models in {repository}")
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
        "deploy": ["(default: 10)", "(default: 300.0)", "(default: dispatch_model)"],
    }[command]
    for default in expected:
        assert default in text
    assert "(default: None)" not in text


def test_status_prints_one_json_document(server: FakeServer) -> None:
    code, text = run("status", "--url", "h:1")
    assert code == 0
    document = json.loads(text)
    assert document["model"] == MODEL and document["serving_versions"] == [1]
    assert document["router"]["stable_version"] == 1 and document["router"]["canary_version"] == 0
    assert document["routed"] == "stable version 1 only" and document["disagreements"] == []
    assert document["dispatch_fused"] == document["router"]
    server.settings = RouterSettings(1, 2, 10, scoring_versions=(1, 2))
    code, text = run("status", "--url", "h:1")
    assert code == 1
    document = json.loads(text)
    assert document["routed"] == "stable version 1, canary version 2 for 10% of users"
    assert document["disagreements"] == [
        "routing assumes versions [1, 2] are served, Triton serves [1]"
    ]
    server.settings = RouterSettings(1, city_routes=(CityRoute("chengdu", stable_version=3),))
    code, text = run("status", "--url", "h:1")
    assert code == 1
    document = json.loads(text)
    assert document["routed_by_city"] == {"chengdu": "stable version 3 only"}
    assert document["disagreements"] == ["the stable version 3 of chengdu is not served"]


def test_deploy_without_the_admin_key_fails_before_the_golden_check(
    repo: Path,
    trusted_dir: Path,
    server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise ModelControlError("HTTP 403: This API is restricted", 403)

    def no_golden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the golden check ran before the key was checked")

    monkeypatch.setattr(admin, "ready_versions", forbidden)
    monkeypatch.setattr(admin, "check_candidate", no_golden)
    code, _ = deploy(repo, trusted_dir, 2)
    assert code == 1
    err = capsys.readouterr().err
    assert "HTTP 403" in err and "--admin-key" in err
    assert server.loads == [] and server.settings.canary_version == 0


def test_verify_suggests_signing_only_for_unsigned_folders(repo: Path, trusted_dir: Path) -> None:
    (repo / MODEL / "2" / "model.onnx").write_bytes(b"tampered")
    code, text = run("verify", str(repo), "--trusted-keys", str(trusted_dir))
    assert code == 1 and "digest mismatch on file model.onnx" in text
    assert "sign-repository" not in text  # never advise signing over changed files
    (repo / MODEL / "3" / "MANIFEST.sig").unlink()
    code, text = run("verify", str(repo), "--trusted-keys", str(trusted_dir))
    assert "1 version folder unsigned; " in text
