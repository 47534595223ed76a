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
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(f"NAME = {name!r}\n")
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name))
    # scorer's profile config is the one Triton reads under --model-config-name=cpu
    (root / "scorer" / "configs").mkdir()
    (root / "scorer" / "configs" / "cpu.pbtxt").write_text(CONFIG.format(name="scorer"))
    (root / "scorer" / "configs" / "gpu.pbtxt").write_text("gpu")
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
        fused = read_config_dict(view.root / "fused" / "config.pbtxt")
        assert fused["instance_group"] == [
            {"count": 1, "kind": "KIND_CPU", "rate_limiter": {"priority": 1}}
        ]
        scorer = read_config_dict(view.root / "scorer" / "configs" / "cpu.pbtxt")
        assert [g["count"] for g in scorer["instance_group"]] == [1]
        assert (view.root / "scorer" / "configs" / "gpu.pbtxt").read_text() == "gpu"
        assert (view.root / "scorer" / "config.pbtxt").is_symlink()
        assert (view.root / "fused" / "1" / "model.py").read_text() == "NAME = 'fused'\n"
        view.restore("scorer")
        restored = read_config_dict(view.root / "scorer" / "configs" / "cpu.pbtxt")
        assert [g["count"] for g in restored["instance_group"]] == [1, 3]
    finally:
        view.remove()
    assert not view.root.exists() and repo.is_dir()
    assert (repo / "fused" / "config.pbtxt").read_text() == CONFIG.format(name="fused")
