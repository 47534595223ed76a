"""The contract and the client install alone: their wheels, their metadata, a clean venv.

Offline and quick: the wheels are built from this checkout with the venv's own setuptools
(`pip wheel --no-deps --no-build-isolation --no-index`); the clean venv has no pip index
either and sees, besides the two wheels, only numpy and tritonclient[grpc,http] with their
dependencies (linked from this venv). If the client needed scipy, ONNX Runtime or the server,
pip could not install it there, and the import would fail.
"""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

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
    pip = (sys.executable, "-m", "pip")
    _run(*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", out,
         sources / "contract", sources / "client")  # fmt: skip
    built = {_canonical(path.name.split("-")[0]): path for path in out.glob("*.whl")}
    assert set(built) == {"dispatch-contract", "dispatch-client"}, built
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


def _closure() -> set[str]:
    """Installed distributions numpy and tritonclient[grpc,http] need, themselves included."""
    seen: set[str] = set()
    todo: list[tuple[str, tuple[str, ...]]] = list(ALLOWED_ROOTS)
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


@pytest.fixture(scope="module")
def clean_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clean")
    allowed = root / "allowed"
    allowed.mkdir()
    for name in _closure():
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
