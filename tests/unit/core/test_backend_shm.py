"""The Python backend's own regions kept from everyone but their server
(dispatch_service.core.backend_shm): a stub seals its region (0600, name removed) while the
mappings stay; the launcher's sweep sets what is still named to 0600."""

from __future__ import annotations

import mmap
import os
import stat
from pathlib import Path

import pytest

from dispatch_service.core.backend_shm import (
    STUB_NAME,
    seal_own_region,
    stub_region_name,
    tighten_regions,
)
from dispatch_service.core.repository_layout import model_layout
from other_user import OTHER_UID, as_other_user, needs_root, try_open

BACKEND = f"/opt/tritonserver/backends/python/{STUB_NAME}"


def stub_cmdline(region: str) -> bytes:
    """What /proc/<stub>/cmdline holds (checked on Triton 2.51)."""
    argv = [
        BACKEND,
        str(model_layout(Path("/repo"), "m").python_model(1)),
        region,
        "4194304",
        "4194304",
        "77",
        "/be",
        "336",
    ]
    return b"\0".join(arg.encode() for arg in [*argv, "m_0_0", "DEFAULT"]) + b"\0"


def fake_proc(tmp_path: Path, cmdline: bytes) -> Path:
    proc = tmp_path / "proc_self"
    proc.mkdir()
    (proc / "cmdline").write_bytes(cmdline)
    return proc


def region(shm: Path, name: str, mode: int = 0o644) -> Path:
    """A region as Triton 2.51's Python backend leaves it: mode 0644."""
    shm.mkdir(exist_ok=True)
    path = shm / name
    path.write_bytes(b"\0" * 4096)
    path.chmod(mode)
    return path


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_region_name_is_the_stubs_second_argument() -> None:
    assert stub_region_name(stub_cmdline("dispatchsrv_1_ab_uuid")) == "dispatchsrv_1_ab_uuid"
    assert stub_region_name(b"/usr/bin/python3\0-m\0pytest\0") is None
    assert stub_region_name(b"") is None
    for bad in ("", "a/b", "..", "."):
        assert stub_region_name(stub_cmdline(bad)) is None


def test_a_stub_seals_its_region_and_both_mappings_stay(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    path = region(shm, "dispatchsrv_1_ab_one")
    with path.open("r+b") as server_side:  # the server's mapping, made before the stub's
        mapped = mmap.mmap(server_side.fileno(), 4096)
    sealed = seal_own_region(shm, fake_proc(tmp_path, stub_cmdline(path.name)))
    assert sealed == path.name
    assert not path.exists()  # nobody can open it by name any more, Triton included
    mapped[:5] = b"still"  # the processes that had it keep using it
    assert mapped[:5] == b"still"
    mapped.close()


def test_outside_a_stub_nothing_is_touched(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    path = region(shm, "dispatchsrv_1_ab_two")
    proc = fake_proc(tmp_path, b"/usr/bin/python3\0" + path.name.encode() + b"\0x\0")
    assert seal_own_region(shm, proc) is None
    assert seal_own_region(shm, tmp_path / "no_proc") is None
    assert path.exists() and mode_of(path) == 0o644


def test_a_region_already_gone_is_nothing_to_seal(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, stub_cmdline("dispatchsrv_1_ab_gone"))
    assert seal_own_region(tmp_path, proc) is None


@needs_root
def test_a_region_of_another_uid_is_left_alone(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    path = region(shm, "dispatchsrv_1_ab_three")
    os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(PermissionError, match=f"owner uid {OTHER_UID}"):
        seal_own_region(shm, fake_proc(tmp_path, stub_cmdline(path.name)))
    assert path.exists() and mode_of(path) == 0o644


def test_the_sweep_sets_the_servers_regions_to_0600_and_no_others(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    mine = [region(shm, "dispatchsrv_1_ab_x"), region(shm, "dispatchsrv_1_ab_y", 0o600)]
    other = region(shm, "dispatchsrv_2_cd_x")
    client = region(shm, "dispatch_client_1_ff_in", 0o666)
    assert tighten_regions("dispatchsrv_1_ab_", shm) == [mine[0]]
    assert [mode_of(p) for p in mine] == [0o600, 0o600]
    assert mode_of(other) == 0o644 and mode_of(client) == 0o666
    assert tighten_regions("", shm) == [] and tighten_regions("x", tmp_path / "none") == []


@needs_root
def test_another_user_cannot_open_a_sealed_or_swept_region(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    name = f"dispatchsrv_{os.getpid()}_testseal_"
    sealed, swept = region(shm, f"{name}a"), region(shm, f"{name}b")
    try:
        before = as_other_user(lambda: try_open(sealed, os.O_RDONLY))
        proc = fake_proc(tmp_path, stub_cmdline(sealed.name))
        assert seal_own_region(shm, proc) == sealed.name
        assert tighten_regions(name, shm) == [swept]
        after = as_other_user(
            lambda: [
                try_open(sealed, os.O_RDONLY),
                try_open(swept, os.O_RDONLY),
                try_open(swept, os.O_RDWR),
            ]
        )
    finally:
        for path in (sealed, swept):
            path.unlink(missing_ok=True)
    assert before == "opened"  # what Triton 2.51 leaves: 0644, readable by anyone
    assert after == ["ENOENT", "EACCES", "EACCES"]
