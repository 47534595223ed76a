"""No `dispatch-admin` command changes routing without a signed revision.

Every command the parser holds is run (a command added without a case here fails the test),
with every server call and every direct write of the live routing file made to fail the
test: a routing command may only add exactly one revision to the store, which then holds it;
every other command leaves the stored document as it was. And no module of the CLI imports
the config-override path (`router_control`).
"""

from __future__ import annotations

import argparse
import ast
import io
import shutil
from pathlib import Path
from typing import Any

import pytest

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import ROUTER_MODEL, model_layout
from dispatch_service.core.signing import TrustedKeys, private_key_pem
from dispatch_service.ops import admin, fleet_admin, model_control
from dispatch_service.ops.fleet_admin import ROUTING_COMMANDS
from dispatch_service.ops.fleet_state import StateStore
from dispatch_service.ops.rollout_admin import ROLLOUT_ROUTING_COMMANDS
from dispatch_service.routing import live

OPS = Path(admin.__file__).parent


def _choices(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    """Every command, a group's actions each on its own (``rollout start``)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = _choices(sub, f"{prefix}{name} ")
                found += nested or [f"{prefix}{name}"]
    return found


def commands() -> list[str]:
    return _choices(admin.build_parser())


@pytest.fixture
def fleet_repo(repo: Path) -> Path:
    """The signed test repository, with the router's config (the files' routing)."""
    router = model_layout(repo, ROUTER_MODEL)
    router.folder.mkdir()
    shutil.copy(model_layout(MODEL_REPOSITORY, ROUTER_MODEL).config, router.config)
    return repo


def test_every_command_changes_routing_only_through_one_revision(
    tmp_path: Path,
    fleet_repo: Path,
    trusted_dir: Path,
    signer: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = tmp_path / "ops.key"
    key.write_bytes(private_key_pem(signer))
    store_dir = tmp_path / "store"
    store, trusted = StateStore(store_dir), TrustedKeys.from_directory(trusted_dir)
    fleet = ["--state-store", str(store_dir), "--trusted-keys", str(trusted_dir)]
    write = [*fleet, "--key", str(key), "--model-repository", str(fleet_repo)]
    outcomes = ["--outcome-store", str(tmp_path / "outcomes.sqlite")]
    routing_commands = {*ROUTING_COMMANDS, *ROLLOUT_ROUTING_COMMANDS}
    cases: list[tuple[str, list[str]]] = [
        ("keygen", ["--out", str(tmp_path / "keys")]),
        ("sign", ["--model", "dispatch_model", "--version", "1", "--key", str(key),
                  "--model-repository", str(fleet_repo)]),
        ("sign-repository", [str(fleet_repo), "--key", str(key)]),
        ("verify", [str(fleet_repo), "--trusted-keys", str(trusted_dir)]),
        ("status", fleet),
        ("deploy", [*write, "--version", "2", "--canary-percent", "10"]),
        ("canary", [*write, "--percent", "30"]),
        ("shadow", [*write, "--version", "2", "--percent", "5"]),
        ("history", fleet),
        ("quality", ["--store", str(tmp_path / "outcomes.sqlite"), "--json"]),
        ("promote", [*write, "--unload"]),
        ("rollback", [*write]),
        ("restore", [*write, "--revision", "1"]),
        ("rollout start", [*write, *outcomes, "--version", "2", "--steps", "10,100"]),
        ("rollout status", [*fleet, *outcomes]),
        ("rollout run", [*write, *outcomes, "--once"]),  # no outcomes yet: it holds
        ("rollout pause", [*fleet, *outcomes]),
        ("rollout resume", [*fleet, *outcomes]),
        ("rollout abort", [*write, *outcomes]),
        ("experiment report", [*outcomes, "--treatment-version", "2"]),
    ]  # fmt: skip
    assert sorted(name for name, _ in cases) == sorted(commands())

    def no_server(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a server call: {args}")

    def no_routing_file(*args: object, **kwargs: object) -> None:
        raise AssertionError("the live routing file written by a command")

    monkeypatch.setattr(model_control, "_request", no_server)
    monkeypatch.setattr(live, "write_routing_file", no_routing_file)
    for name, argv in cases:
        before = [k.revision for k in store.history(trusted)]
        document = store.read()
        out = io.StringIO()
        code = admin.main([*name.split(), *argv], out=out)
        after = [k.revision for k in store.history(trusted)]
        if name in routing_commands:
            assert code == 0, (name, out.getvalue())
            assert len(after) == len(before) + 1, name
            current = store.current(trusted)
            assert current is not None and current.state.revision == after[-1]
        else:
            assert code in (0, 1), (name, out.getvalue())  # status: 1, no replica answers
            assert after == before and store.read() == document, name
    assert len(store.history(trusted)) == len(routing_commands)


def test_no_module_of_the_cli_imports_the_config_override_path() -> None:
    for module in (admin, fleet_admin):
        tree = ast.parse(Path(module.__file__ or "").read_text())
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom | ast.Import)
            for alias in node.names
        } | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not any("router_control" in str(name) for name in imported), module.__name__
    for path in OPS.glob("fleet_*.py"):
        assert "router_control" not in path.read_text(), path.name
