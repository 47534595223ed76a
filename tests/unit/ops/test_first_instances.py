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

from dispatch_service.core.model_config import read_config_dict
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
