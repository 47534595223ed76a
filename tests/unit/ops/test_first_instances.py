"""A restart's view of the repository (`ops.first_instances`): links to every model, the
models of several instances with a config of one, private, removed when its launcher is gone."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dispatch_service.core.model_config import ModelConfigError, config_from_dict, read_config_dict
from dispatch_service.core.repository_layout import model_layout
from dispatch_service.ops.first_instances import VIEW_PREFIX, FirstInstanceRepository

CONFIG = """name: "{name}"
backend: "python"
instance_group [
  {{ count: 1, kind: KIND_CPU, rate_limiter {{ priority: 1 }} }},
  {{ count: 3, kind: KIND_CPU }}
]
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for name in ("fused", "scorer"):
        layout = model_layout(root, name)
        layout.version(1).mkdir(parents=True)
        layout.python_model(1).write_text(f"NAME = {name!r}\n")
        layout.config.write_text(CONFIG.format(name=name))
    # scorer's profile config is the one Triton reads under --model-config-name=cpu
    scorer = model_layout(root, "scorer")
    scorer.profiles.mkdir()
    scorer.profile("cpu").write_text(CONFIG.format(name="scorer"))
    scorer.profile("gpu").write_text("gpu")
    return root


def test_the_view_cuts_the_config_triton_reads_and_links_the_rest(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = tmp_path / f"{VIEW_PREFIX}{gone.pid}-abc"
    orphan.mkdir()
    view = FirstInstanceRepository(repo, ["fused", "scorer"], "cpu")
    try:
        assert not orphan.exists()  # a killed launcher's view
        assert view.root.name.startswith(f"{VIEW_PREFIX}{os.getpid()}-")
        assert stat.S_IMODE(view.root.stat().st_mode) == 0o700
        fused = read_config_dict(model_layout(view.root, "fused").config)
        assert fused["instance_group"] == [
            {"count": 1, "kind": "KIND_CPU", "rate_limiter": {"priority": 1}}
        ]
        scorer = model_layout(view.root, "scorer")
        assert [g["count"] for g in read_config_dict(scorer.profile("cpu"))["instance_group"]] == [
            1
        ]
        assert scorer.profile("gpu").read_text() == "gpu"
        assert scorer.config.is_symlink()
        fused_model = model_layout(view.root, "fused").python_model(1)
        assert fused_model.read_text() == "NAME = 'fused'\n"
        view.restore("scorer")
        restored = read_config_dict(scorer.profile("cpu"))
        assert [g["count"] for g in restored["instance_group"]] == [1, 3]
    finally:
        view.remove()
    assert not view.root.exists() and repo.is_dir()
    assert model_layout(repo, "fused").config.read_text() == CONFIG.format(name="fused")


def test_a_restart_view_starts_models_with_their_live_configs(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The configs `deploy` and `rollback` set live, in Triton's JSON form: a model of
    several instances with its first alone, another as it was; the files stay untouched."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    other = model_layout(repo, "other")
    other.version(1).mkdir(parents=True)
    other.python_model(1).write_text("NAME = 'other'\n")
    other.config.write_text('name: "other"\nbackend: "python"\n')
    canary = {"canary_percent": {"string_value": "25"}}
    groups = [
        {"name": "fused_0", "count": 1, "kind": "KIND_CPU"},
        {"name": "fused_1", "count": 3, "kind": "KIND_CPU"},
    ]
    live = {
        "fused": {"name": "fused", "backend": "python", "instance_group": groups},
        "other": {"name": "other", "backend": "python", "parameters": canary},
    }
    view = FirstInstanceRepository(repo, ["fused"], "cpu", live)
    try:
        fused = read_config_dict(model_layout(view.root, "fused").config)
        assert fused["instance_group"] == [{"name": "fused_0", "count": 1, "kind": "KIND_CPU"}]
        seen = model_layout(view.root, "other")
        assert read_config_dict(seen.config)["parameters"] == canary
        assert not seen.config.is_symlink() and seen.version(1).is_symlink()
        assert (view.root / "scorer").is_symlink()  # neither cut nor live: a link
        view.restore("fused")  # its instances added: the files' config again
        assert read_config_dict(model_layout(view.root, "fused").config)["instance_group"] == [
            {"count": 1, "kind": "KIND_CPU", "rate_limiter": {"priority": 1}},
            {"count": 3, "kind": "KIND_CPU"},
        ]
    finally:
        view.remove()
    assert other.config.read_text() == 'name: "other"\nbackend: "python"\n'


def test_a_live_config_protobuf_cannot_read_leaves_the_model_its_own(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loaded back once the server is ready instead (`Supervisor._restore_live`): a start
    never fails on it."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(ModelConfigError, match="model 'fused': not a valid model config"):
        config_from_dict({"name": "fused", "nope": 1})
    view = FirstInstanceRepository(repo, ["fused"], "cpu", {"fused": {"name": "fused", "nope": 1}})
    try:
        fused = read_config_dict(model_layout(view.root, "fused").config)
        assert fused["instance_group"] == [
            {"count": 1, "kind": "KIND_CPU", "rate_limiter": {"priority": 1}}
        ]
    finally:
        view.remove()
