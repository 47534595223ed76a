"""The deploy / rollback / status sequence (dispatch_service.ops.model_lifecycle) against a
stand-in router and model-control API, driven through `dispatch-admin` as operators run it.

The fixtures (a signed repository copy, throwaway keys) are in conftest.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import types
from pathlib import Path
from typing import Any

import pytest

from dispatch_service.core.repository_layout import ROUTER_MODEL, SCORING_MODEL, model_layout
from dispatch_service.core.signing import sign_version
from dispatch_service.ops import admin, model_lifecycle
from dispatch_service.ops.model_control import ModelControlError
from dispatch_service.ops.router_control import RouterControlError
from dispatch_service.routing.settings import CityRoute, RouterSettings

MODEL = SCORING_MODEL


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = admin.main(list(argv), out=out)
    return code, out.getvalue()


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

    def read_fused_settings(
        self, http_url: str, admin_key: str | None = None, timeout_s: float = 30.0, *, model: str
    ) -> Any:
        return self.settings  # every entry point moves with the router

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
        read_fused_settings=fake.read_fused_settings,
        apply_router_settings=fake.apply_router_settings,
    )
    # The library reads and changes the server; the CLI's status reads it too.
    for module in (model_lifecycle, admin):
        monkeypatch.setattr(module, "router_control", router)
        monkeypatch.setattr(module, "ready_versions", fake.ready_versions)
    for name in ("model_config", "load_model"):
        monkeypatch.setattr(model_lifecycle, name, getattr(fake, name))
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
        (lambda repo: model_layout(repo, MODEL).onnx(2).write_bytes(b"x"), "digest mismatch"),
        (
            lambda repo: (model_layout(repo, MODEL).version(2) / "MANIFEST.sig").unlink(),
            "missing signature",
        ),
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
    router_model = model_layout(repo, ROUTER_MODEL)
    router = router_model.version(1)
    router.mkdir(parents=True)
    router_model.python_model(1).write_text("# the router\n")
    sign_version(router, signer)
    target = (
        model_layout(repo, MODEL).python_model(1)
        if changed == "served stable"
        else router_model.python_model(1)
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


def test_status_prints_one_json_document(server: FakeServer) -> None:
    code, text = run("status", "--url", "h:1")
    assert code == 0
    document = json.loads(text)
    assert document["model"] == MODEL and document["serving_versions"] == [1]
    assert document["router"]["stable_version"] == 1 and document["router"]["canary_version"] == 0
    assert document["routed"] == "stable version 1 only" and document["disagreements"] == []
    assert document["dispatch_fused"] == document["dispatch_priority"] == document["router"]
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

    monkeypatch.setattr(model_lifecycle, "ready_versions", forbidden)
    monkeypatch.setattr(model_lifecycle, "check_candidate", no_golden)
    code, _ = deploy(repo, trusted_dir, 2)
    assert code == 1
    err = capsys.readouterr().err
    assert "HTTP 403" in err and "--admin-key" in err
    assert server.loads == [] and server.settings.canary_version == 0
