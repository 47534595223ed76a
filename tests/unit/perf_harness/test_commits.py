"""perf.commits: each worktree's models import that worktree's library and contract."""

from __future__ import annotations

from pathlib import Path

from perf.commits import library_first


def test_every_model_py_puts_its_worktree_library_first_once(tmp_path: Path) -> None:
    for model in ("dispatch_fused/1", "dispatch_model/2"):
        folder = tmp_path / "model_repository" / model
        folder.mkdir(parents=True)
        (folder / "model.py").write_text("import dispatch_service\n")
    assert library_first(tmp_path) == 2
    assert library_first(tmp_path) == 0  # already patched: nothing added twice
    text = (tmp_path / "model_repository" / "dispatch_fused" / "1" / "model.py").read_text()
    first, rest = text.split("\n", 1)
    folders = [str(tmp_path / name) for name in ("python_backend", "contract", "client")]
    assert first == f"import sys; sys.path[:0] = {folders!r}"
    assert rest == "import dispatch_service\n"
