"""The three distributions install from what they declare: wheels, metadata, clean venvs.

Offline and quick: the wheels are built from this checkout with the venv's own setuptools
(`pip wheel --no-deps --no-build-isolation --no-index`); a clean venv has no pip index
either and sees, besides the wheels, only the declared dependencies' installed
distributions (linked from this venv). The client's sees numpy and tritonclient[grpc,http]:
if the client needed scipy, ONNX Runtime or the server, pip could not install it there, and
the import would fail. The server's sees its runtime dependencies without any extra: every
library module and every `model.py` must import there, so nothing from `[dev]` is needed.
"""

from __future__ import annotations

import ast
import email
import json
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterable, Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from dispatch_service.core.repository_layout import PYTHON_MODEL_FILE

ROOT = Path(__file__).resolve().parents[3]
FORBIDDEN = {"scipy", "onnxruntime", "onnxruntime-gpu", "triton-dispatch", "nvidia-pytriton"}
# What a service that only calls the server may have: the client's own dependencies, and
# setuptools, which every Python 3.11 venv is seeded with: tritonclient 2.51's
# utils.shared_memory imports pkg_resources without declaring it (a 3.12 venv, seeded with
# pip only, fails `import dispatch_client` until setuptools is installed).
ALLOWED_ROOTS = (("numpy", ()), ("tritonclient", ("grpc", "http")), ("setuptools", ()))


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _run(*command: str | Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    sources = tmp_path_factory.mktemp("sources")  # setuptools writes build/ beside the source
    skip = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    for name in ("contract", "client"):
        shutil.copytree(ROOT / name, sources / name, ignore=skip)
    server = sources / "server"
    shutil.copytree(ROOT / "python_backend", server / "python_backend", ignore=skip)
    shutil.copy2(ROOT / "pyproject.toml", server / "pyproject.toml")
    pip = (sys.executable, "-m", "pip")
    _run(*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", out,
         sources / "contract", sources / "client", server, timeout=300)  # fmt: skip
    built = {_canonical(path.name.split("-")[0]): path for path in out.glob("*.whl")}
    assert set(built) == {"dispatch-contract", "dispatch-client", "triton-dispatch"}, built
    return built


def _requires(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.message_from_bytes(archive.read(name))
    return [Requirement(text) for text in message.get_all("Requires-Dist") or []]


def test_wheels_require_neither_the_server_nor_its_heavy_stack(wheels: dict[str, Path]) -> None:
    contract = {_canonical(r.name) for r in _requires(wheels["dispatch-contract"])}
    client = {_canonical(r.name) for r in _requires(wheels["dispatch-client"])}
    assert contract == {"numpy"}
    assert not client & FORBIDDEN, client
    assert {"dispatch-contract", "numpy", "tritonclient"} <= client


def _closure(roots: Iterable[tuple[str, tuple[str, ...]]] = ALLOWED_ROOTS) -> set[str]:
    """Installed distributions the roots need, themselves included (default: numpy and
    tritonclient[grpc,http], what the client may have)."""
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = list(roots)
    while todo:
        name, extras = todo.pop()
        if _canonical(name) in seen:
            continue
        seen.add(_canonical(name))
        for text in metadata.distribution(name).requires or []:
            requirement = Requirement(text)
            wanted = requirement.marker is None or any(
                requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras)
            )
            if wanted:
                todo.append((requirement.name, tuple(requirement.extras)))
    return seen


def _top_level_entries(name: str) -> Iterator[Path]:
    dist = metadata.distribution(name)
    for entry in {Path(str(file)).parts[0] for file in dist.files or []}:
        path = Path(str(dist.locate_file(entry)))
        if path.exists() and not entry.endswith(".pth") and entry not in {"..", "bin"}:
            yield path


def _venv_seeing(root: Path, distributions: Iterable[str]) -> Path:
    """A venv without pip or site-packages of its own that sees, of this venv, only the
    top-level entries of ``distributions``; its python."""
    allowed = root / "allowed"
    allowed.mkdir()
    for name in distributions:
        for path in _top_level_entries(name):
            link = allowed / path.name
            if not link.exists():
                link.symlink_to(path)
    home = root / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(home)
    python = home / "bin" / "python"
    site = _run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))")
    (Path(site.stdout.strip()) / "allowed.pth").write_text(f"{allowed}\n")
    return python


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _venv_seeing(tmp_path_factory.mktemp("clean"), _closure())


def test_client_installs_alone_and_imports_in_a_clean_venv(
    wheels: dict[str, Path], clean_venv: Path
) -> None:
    found = wheels["dispatch-client"].parent
    pip = (sys.executable, "-m", "pip", "--python", clean_venv)
    _run(*pip, "install", "-q", "--no-index", "--no-cache-dir", "--find-links", found,
         "dispatch-client")  # fmt: skip
    probe = (
        "import importlib.util as u, dispatch_client, dispatch_contract\n"
        "from dispatch_client import DispatchClient, window_from_json\n"
        "assert 'site-packages' in dispatch_client.__file__, dispatch_client.__file__\n"
        "print(sorted(m for m in ('scipy', 'onnxruntime', 'dispatch_service', 'perf')"
        " if u.find_spec(m) is not None))\n"
    )
    done = _run(clean_venv, "-I", "-c", probe)
    assert done.stdout.strip() == "[]", done.stdout


# Imports the library needs only with an extra, each only where that extra is used: the
# `server` extra's GPU monitor (NVML; prometheus_client is a dependency: the launcher's HTTP
# service serves its registry), the `train` extra's ONNX export, the offline evaluation's
# plots (matplotlib, a `dev` tool imported inside `write_plots`), and setuptools'
# pkg_resources, which the gazetteer stands in for where it is absent.
OPTIONAL_IMPORTS = {
    "pynvml": ("server", "dispatch_service.ops.gpu"),
    "onnx": ("train", "dispatch_service.offline.training"),
    "matplotlib": ("dev", "dispatch_service.offline"),
    "pkg_resources": ("", "dispatch_service.geocoding.gazetteer"),
}
FIRST_PARTY = {"dispatch_service", "dispatch_contract", "dispatch_client"}
LOCAL_DISTRIBUTIONS = {"dispatch-contract", "dispatch-client"}
LIBRARY = ROOT / "python_backend" / "dispatch_service"


def _library_imports() -> dict[str, set[str]]:
    """Third-party top-level name -> the library modules that import it (anywhere in them)."""
    found: dict[str, set[str]] = {}
    for path in sorted(LIBRARY.rglob("*.py")):
        parts = ["dispatch_service", *path.relative_to(LIBRARY).with_suffix("").parts]
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.partition(".")[0]
                if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                    found.setdefault(top, set()).add(module)
    return found


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def _runtime_roots(wheel: Path) -> list[tuple[str, tuple[str, ...]]]:
    """The wheel's requirements without any extra, the local distributions left out."""
    return [
        (requirement.name, tuple(requirement.extras))
        for requirement in _requires(wheel)
        if requirement.marker is None and _canonical(requirement.name) not in LOCAL_DISTRIBUTIONS
    ]


def test_the_server_declares_every_package_it_imports(wheels: dict[str, Path]) -> None:
    """Each third-party import of the library comes from a runtime dependency (or one of
    theirs), or is an optional import of its extra, made only where that extra is used."""
    server = wheels["triton-dispatch"]
    assert {"dispatch-contract", "dispatch-client"} <= {
        _canonical(r.name) for r in _requires(server) if r.marker is None
    }
    provided = {
        top
        for top, distributions in metadata.packages_distributions().items()
        if any(_canonical(d) in _closure(_runtime_roots(server)) for d in distributions)
    }
    stray = {}
    for top, modules in _library_imports().items():
        if top in provided:
            continue
        extra, where = OPTIONAL_IMPORTS.get(top, ("?", "<undeclared>"))
        if extra == "?" or not all(_within(module, where) for module in modules):
            stray[top] = sorted(modules)
    assert stray == {}, f"imports no runtime dependency provides: {stray}"


# A stand-in for the backend stub's `triton_python_backend_utils`, which exists only inside
# Triton: each `model.py` imports it, and an import needs no more of it.
# A module that fails only for want of an optional import is left out where that import
# belongs (its extra's modules, and what imports them); any other failure fails the probe.
_SERVER_PROBE = """
import importlib, importlib.util, json, pkgutil, sys, types
optional, adapters = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
import dispatch_service
assert "site-packages" in dispatch_service.__file__, dispatch_service.__file__
names = ["dispatch_service"] + [
    info.name for info in pkgutil.walk_packages(dispatch_service.__path__, "dispatch_service.")
]
imported = []
for name in names:
    try:
        imported.append(importlib.import_module(name).__name__)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        where = optional.get(top)
        if where is None or not (name == where or name.startswith(where + ".")):
            raise
for i, path in enumerate(adapters):
    spec = importlib.util.spec_from_file_location(f"adapter_{i}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert hasattr(module, "TritonPythonModel"), path
print(json.dumps({"modules": len(imported), "adapters": len(adapters)}))
"""


def test_the_server_installs_without_extras_and_imports_every_module(
    wheels: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """In a venv that sees only the server's runtime dependencies (no extra, no `[dev]`),
    the server wheel installs from its own metadata and every library module and every
    `model.py` imports (those that need an extra's optional import left out)."""
    server = wheels["triton-dispatch"]
    python = _venv_seeing(tmp_path_factory.mktemp("server"), _closure(_runtime_roots(server)))
    pip = (sys.executable, "-m", "pip", "--python", python)
    _run(*pip, "install", "-q", "--no-index", "--no-cache-dir", "--find-links", server.parent,
         "triton-dispatch", timeout=300)  # fmt: skip
    adapters = sorted(
        str(path) for path in (ROOT / "model_repository").glob(f"*/*/{PYTHON_MODEL_FILE}")
    )
    assert len(adapters) >= 5, adapters
    optional = {top: where for top, (_, where) in OPTIONAL_IMPORTS.items()}
    done = _run(python, "-I", "-c", _SERVER_PROBE, json.dumps(optional), json.dumps(adapters),
                timeout=300)  # fmt: skip
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts == {"modules": counts["modules"], "adapters": len(adapters)}
    assert counts["modules"] > 60, counts
