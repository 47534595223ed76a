"""The launcher's key files (dispatch_service.ops.keys)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from dispatch_service.ops.keys import (
    AccessKeys,
    KeyFileError,
    command_line_note,
    load_or_create_keys,
    proc_hides_processes,
)
from other_user import as_other_user, needs_root


def test_missing_keys_are_created_private_and_reused(tmp_path: Path) -> None:
    folder = tmp_path / "keys"
    keys, created = load_or_create_keys(folder)
    assert sorted(p.name for p in created) == ["admin.key", "priority.key", "shm.key"]
    for path in created:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert keys.admin != keys.shm and len(keys.admin) >= 40
    assert keys.priority not in (keys.admin, keys.shm) and len(keys.priority) >= 40
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


# ---- who can read the keys on Triton's command line --------------------------------------

PLAIN_PROC = "sysfs /sys sysfs rw 0 0\nproc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n"


@pytest.mark.parametrize("hidepid", ["1", "2", "4", "noaccess", "invisible", "ptraceable"])
def test_a_proc_mounted_with_hidepid_hides_the_command_line(hidepid: str) -> None:
    mounts = f"proc /proc proc rw,relatime,hidepid={hidepid},gid=0 0 0\n"
    assert proc_hides_processes(mounts)
    note = command_line_note(mounts, 1001)
    assert "only uid 1001 and root" in note and "as root" not in note
    assert "it runs as root now" in command_line_note(mounts, 0)


@pytest.mark.parametrize(
    "mounts",
    [
        PLAIN_PROC,
        "proc /proc proc rw,hidepid=0 0 0\n",
        "proc /other/proc proc rw,hidepid=2 0 0\n",  # not the /proc processes are read from
        "",
    ],
)
def test_without_hidepid_the_start_says_who_can_read_the_keys_and_how_to_close_it(
    mounts: str,
) -> None:
    assert not proc_hides_processes(mounts)
    note = command_line_note(mounts, 0)
    assert "any local user can read them" in note and "uid 0" in note
    assert "hidepid=invisible" in note and "a user of its own" in note


@needs_root
def test_what_the_note_says_is_true_here() -> None:
    """A second uid reads this process's command line exactly when the note says so."""
    mounts = Path("/proc/self/mounts").read_text()
    me = os.getpid()

    def read_cmdline() -> bool:
        try:
            return bool(Path(f"/proc/{me}/cmdline").read_bytes())
        except OSError:
            return False

    assert as_other_user(read_cmdline) is not proc_hides_processes(mounts)


def test_the_priority_key_entitles_through_a_forwarded_header_and_its_digest() -> None:
    keys = AccessKeys(admin="a", shm="s", priority="p-key")
    args = keys.triton_args()
    assert "--http-header-forward-pattern=^dispatch-priority-key$" in args
    assert "--grpc-header-forward-pattern=^dispatch-priority-key$" in args
    assert not any("p-key" in arg for arg in args)  # never on Triton's command line
    assert keys.priority_digest == hashlib.sha256(b"p-key").hexdigest()
    with pytest.raises(ValueError, match="priority key must differ"):
        AccessKeys(admin="a", shm="s", priority="a")
