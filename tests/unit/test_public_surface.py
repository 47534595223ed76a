"""The public surface: every exported name exists, and no package reaches into another's privates.

Covers the library (`dispatch_service`), the contract, the client and the benchmarks (`perf`).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "dispatch_service": ROOT / "python_backend" / "dispatch_service",
    "dispatch_contract": ROOT / "contract" / "dispatch_contract",
    "dispatch_client": ROOT / "client" / "dispatch_client",
    "perf": ROOT / "perf",
}


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the four packages."""
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()

# Imports every module in a fresh interpreter (perf.locustfile patches the process through
# gevent, so not in this one) and reports each `__all__` name that does not resolve.
_CHECK = """
import importlib, json, sys
missing = {}
for name in json.loads(sys.argv[1]):
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    if exported is None:
        missing[name] = ["<no __all__>"]
        continue
    absent = [n for n in exported if not hasattr(module, n)]
    if absent or len(set(exported)) != len(exported):
        missing[name] = absent or ["<duplicate names in __all__>"]
print(json.dumps(missing))
"""


def test_the_sweep_sees_every_package() -> None:
    assert len(MODULES) > 70
    assert {"dispatch_service.core", "dispatch_client", "perf.report"} <= set(MODULES)


def test_every_name_in_every_all_exists() -> None:
    order = sorted(MODULES, key=lambda name: name == "perf.locustfile")  # the patcher last
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, json.dumps(order)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    missing = json.loads(done.stdout.strip().splitlines()[-1])
    assert missing == {}, missing


def _package_of(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _private_imports(module: str, path: Path) -> list[str]:
    """`from other.package.mod import _name` and `mod._name` where mod is another package's."""
    home = _package_of(module, path)
    tree = ast.parse(path.read_text())
    found: list[str] = []
    modules_bound: dict[str, str] = {}  # local name -> module it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            source = node.module
            source_package = source if source in PACKAGES else source.rpartition(".")[0]
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and source_package != home and source != home:
                    found.append(f"{module}:{node.lineno} from {source} import {alias.name}")
                modules_bound[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                modules_bound[alias.asname or alias.name.split(".")[0]] = alias.name
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and node.value.id in modules_bound
        ):
            target = modules_bound[node.value.id]
            if target in MODULES and _package_of(target, MODULES[target]) != home:
                found.append(f"{module}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def test_no_module_imports_a_private_name_from_another_package() -> None:
    found = [hit for name, path in MODULES.items() for hit in _private_imports(name, path)]
    assert found == []


def test_the_private_import_check_can_fail(tmp_path: Path) -> None:
    bad = tmp_path / "mod.py"
    bad.write_text(
        "from dispatch_service.domain.window import _finite\n"
        "from dispatch_service.domain import geo\n"
        "x = geo._private_thing\n"
    )
    MODULES["dispatch_service.serving.mod"] = bad
    try:
        found = _private_imports("dispatch_service.serving.mod", bad)
    finally:
        del MODULES["dispatch_service.serving.mod"]
    assert len(found) == 2, found


@pytest.mark.parametrize(
    "module", ["dispatch_service.routing.settings", "dispatch_service.ops.server"]
)
def test_light_modules_stay_light_through_their_packages(module: str) -> None:
    """The package `__init__` re-exports are lazy: these never load SciPy or ONNX Runtime."""
    probe = (
        f"import sys, {module}; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'scipy', 'onnxruntime'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_package_re_exports_resolve_to_their_modules() -> None:
    from dispatch_service import domain, routing
    from dispatch_service.domain.window import DispatchWindow
    from dispatch_service.routing.settings import RouterSettings

    assert domain.DispatchWindow is DispatchWindow
    assert routing.RouterSettings is RouterSettings
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = domain.nothing_here  # type: ignore[attr-defined]  # misspelt: mypy says so too


LAYERS = ("core", "domain", "routing", "pipeline", "serving", "offline", "ops")


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layers_three_lists_of_re_exports_agree(layer: str) -> None:
    """`__all__`, the lazy map and the type checker's imports name the same names."""
    import importlib

    package = importlib.import_module(f"dispatch_service.{layer}")
    tree = ast.parse(Path(str(package.__file__)).read_text())
    typed = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
        for stmt in node.body
        if isinstance(stmt, ast.ImportFrom)
        for alias in stmt.names
    }
    assert sorted(package.__all__) == sorted(dir(package)) == sorted(typed)
