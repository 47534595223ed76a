"""The model repository's layout: the map itself, and that the code asks it instead of joining
repository paths by hand."""

from __future__ import annotations

import ast
from pathlib import Path

from dispatch_service.core.model_config import ensemble_steps, profile_config_path
from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.core.repository_layout import (
    CONFIG_FILE,
    DISPATCH_ENSEMBLE,
    ENCODER_MODEL,
    FEATURES_ENSEMBLE,
    MODEL_NAMES,
    ONNX_FILE,
    PROFILES_FOLDER,
    PYTHON_MODEL_FILE,
    RESOLVER_MODEL,
    ROUTER_MODEL,
    SCORING_MODEL,
    WARMUP_FOLDER,
    ModelLayout,
    model_layout,
    models_in,
)
from dispatch_service.routing.settings import SCORING_MODEL_NAME


def test_the_names_are_the_shipped_repositorys_models() -> None:
    assert sorted(MODEL_NAMES) == sorted(layout.name for layout in models_in(MODEL_REPOSITORY))
    assert SCORING_MODEL_NAME == SCORING_MODEL


def test_paths_of_one_model(tmp_path: Path) -> None:
    layout = model_layout(tmp_path, SCORING_MODEL)
    assert layout.folder == tmp_path / "dispatch_model"
    assert layout.config == tmp_path / "dispatch_model" / "config.pbtxt"
    assert layout.profile("gpu") == tmp_path / "dispatch_model" / "configs" / "gpu.pbtxt"
    assert layout.version(2) == layout.version("2") == tmp_path / "dispatch_model" / "2"
    assert layout.onnx(2) == tmp_path / "dispatch_model" / "2" / "model.onnx"
    assert layout.python_model() == tmp_path / "dispatch_model" / "1" / "model.py"
    assert layout.warmup == tmp_path / "dispatch_model" / "warmup"
    assert layout.versions() == ()


def test_versions_and_profiles_follow_the_files(tmp_path: Path) -> None:
    layout = ModelLayout(tmp_path / "m")
    for name in ("10", "2", "configs", "warmup"):
        (layout.folder / name).mkdir(parents=True)
    assert layout.versions() == (2, 10)
    assert layout.profile_config("gpu") == layout.config == profile_config_path(layout.folder)
    layout.profile("gpu").write_text('name: "m"\n')
    assert layout.profile_config("gpu") == layout.profile("gpu")
    assert profile_config_path(layout.folder, "gpu") == layout.profile("gpu")
    assert layout.profile_config("cpu") == layout.config


def test_the_shipped_repository_reads_through_the_layout() -> None:
    scoring = model_layout(MODEL_REPOSITORY, SCORING_MODEL)
    assert scoring.versions() == (1, 2)
    assert all(scoring.onnx(version).is_file() for version in scoring.versions())
    assert scoring.profile("gpu").is_file()
    assert model_layout(MODEL_REPOSITORY, ENCODER_MODEL).warmup.is_dir()
    steps = ensemble_steps(model_layout(MODEL_REPOSITORY, DISPATCH_ENSEMBLE).config)
    assert steps == [ENCODER_MODEL, ROUTER_MODEL, RESOLVER_MODEL]
    features = ensemble_steps(model_layout(MODEL_REPOSITORY, FEATURES_ENSEMBLE).config)
    assert features == [ROUTER_MODEL, RESOLVER_MODEL]
    assert ensemble_steps(scoring.config) == []


# What a hand-joined repository path is built from: the layout's file and folder names and
# the model names, joined with `/` or written into a path string.
_LAYOUT_WORDS = {CONFIG_FILE, PROFILES_FOLDER, ONNX_FILE, PYTHON_MODEL_FILE, WARMUP_FOLDER}
_WORDS = _LAYOUT_WORDS | set(MODEL_NAMES)
# The code that must ask the layout: the library, the benchmarks and the tests.
_SCANNED = (
    REPO_ROOT / "python_backend" / "dispatch_service",
    REPO_ROOT / "perf",
    REPO_ROOT / "tests",
)
# The map itself, and this module (which checks the map against paths written out by hand).
_NOT_SCANNED = {
    (REPO_ROOT / "python_backend" / "dispatch_service" / "core" / "repository_layout.py").resolve(),
    Path(__file__).resolve(),
}
# Modules that still join repository paths by hand, each with its reason.
_STILL_BY_HAND = {
    "perf/commits.py",  # patches the model.py files of old commits' worktrees (their layout)
}


def _is_word(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in _WORDS


def _hand_joined(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """``<expr> / "config.pbtxt"``-like joins and path strings naming a layout file."""
    where = path.relative_to(root)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            if _is_word(node.left) or _is_word(node.right):
                found.append(f"{where}:{node.lineno}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and any(f"/{word}" in node.value for word in _LAYOUT_WORDS)
            and "\n" not in node.value  # prose (docstrings, messages) may name the files
            and " " not in node.value
        ):
            found.append(f"{where}:{node.lineno}")
    return found


def test_no_repository_path_is_joined_by_hand() -> None:
    found: dict[str, list[str]] = {}
    for folder in _SCANNED:
        for path in sorted(folder.rglob("*.py")):
            if path.resolve() not in _NOT_SCANNED and (hits := _hand_joined(path)):
                found[str(path.relative_to(REPO_ROOT))] = hits
    assert set(found) - _STILL_BY_HAND == set(), found
    assert set(found) >= _STILL_BY_HAND, "a module listed as joining by hand no longer does"


def test_the_check_sees_a_hand_joined_path(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text(
        'p = repo / "feature_encoder" / "config.pbtxt"\n'
        'q = "a/1/model.onnx"\n'
        "r = model_layout(repo, ENCODER_MODEL).config\n"
        '"""Reads <model>/config.pbtxt."""\n'
    )
    assert sorted(_hand_joined(source, tmp_path)) == ["x.py:1", "x.py:1", "x.py:2"]
