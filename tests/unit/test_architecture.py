"""The package layout's rules, checked by import-linter (the contracts in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in done.stdout


def test_a_contract_guards_the_client_boundary() -> None:
    """Only the launcher's deep health check and the live city (an offline tool that plays
    the delivery platform) may import the client; key files and header names are
    `dispatch_contract.keys`, which both sides share."""
    guards = [
        contract
        for contract in _contracts()
        if contract.get("type") == "forbidden"
        and contract.get("source_modules") == ["dispatch_service"]
        and "dispatch_client" in contract.get("forbidden_modules", [])  # type: ignore[operator]
    ]
    assert len(guards) == 1, guards
    assert guards[0].get("ignore_imports") == [
        "dispatch_service.ops.health -> dispatch_client.**",
        "dispatch_service.offline.live_city -> dispatch_client.**",
    ]


# Where the one-module-one-job rules apply: the libraries and the benchmarks. The contract
# (tensor tables) and the simulator (one generative model of a city) are exempt from the size
# rule only.
_CODE_ROOTS = ("python_backend/dispatch_service", "client/dispatch_client", "perf")
_SIZE_EXEMPT = ("python_backend/dispatch_service/offline/simulator.py",)
MAX_MODULE_LINES = 600
MAX_POSITIONAL_PARAMETERS = 5


def _modules() -> list[Path]:
    return sorted(p for root in _CODE_ROOTS for p in (ROOT / root).rglob("*.py"))


def test_no_module_is_over_600_lines() -> None:
    too_long = {
        str(path.relative_to(ROOT)): lines
        for path in _modules()
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
        and str(path.relative_to(ROOT)) not in _SIZE_EXEMPT
    }
    assert too_long == {}


def test_no_function_takes_more_than_five_positional_parameters() -> None:
    """Past five, parameters are keyword-only (or a parameter object): a call reads by name."""
    import ast

    crowded = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                positional = [
                    arg.arg
                    for arg in (*node.args.posonlyargs, *node.args.args)
                    if arg.arg not in ("self", "cls")
                ]
                if len(positional) > MAX_POSITIONAL_PARAMETERS:
                    crowded.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert crowded == []
