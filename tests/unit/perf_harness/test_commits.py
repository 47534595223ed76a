"""perf.commits: each worktree's models import that worktree's library and contract."""

from __future__ import annotations

from pathlib import Path

from dispatch_service.core.repository_layout import FUSED_MODEL, SCORING_MODEL, model_layout
from perf.commits import library_first


def test_every_model_py_puts_its_worktree_library_first_once(tmp_path: Path) -> None:
    repository = tmp_path / "model_repository"
    for model, version in ((FUSED_MODEL, 1), (SCORING_MODEL, 2)):
        layout = model_layout(repository, model)
        layout.version(version).mkdir(parents=True)
        layout.python_model(version).write_text("import dispatch_service\n")
    assert library_first(tmp_path) == 2
    assert library_first(tmp_path) == 0  # already patched: nothing added twice
    text = model_layout(repository, FUSED_MODEL).python_model(1).read_text()
    first, rest = text.split("\n", 1)
    folders = [str(tmp_path / name) for name in ("python_backend", "contract", "client")]
    assert first == f"import sys; sys.path[:0] = {folders!r}"
    assert rest == "import dispatch_service\n"
