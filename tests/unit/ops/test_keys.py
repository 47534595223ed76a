"""The launcher's key files (dispatch_service.ops.keys)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from dispatch_service.ops.keys import KeyFileError, load_or_create_keys


def test_missing_keys_are_created_private_and_reused(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    keys, created = load_or_create_keys(folder)
    assert sorted(p.name for p in created) == ["admin.key", "shm.key"]
    for path in created:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert keys.admin != keys.shm and len(keys.admin) >= 40
    again, created_again = load_or_create_keys(folder)
    assert again == keys and created_again == []


def test_a_readable_key_file_is_refused(tmp_path: Path) -> None:
    load_or_create_keys(tmp_path)
    (tmp_path / "admin.key").chmod(0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_or_create_keys(tmp_path)


def test_equal_keys_are_refused(tmp_path: Path) -> None:
    for name in ("admin.key", "shm.key"):
        (tmp_path / name).write_text("same\n")
        (tmp_path / name).chmod(0o600)
    with pytest.raises(ValueError, match="differ"):
        load_or_create_keys(tmp_path)
