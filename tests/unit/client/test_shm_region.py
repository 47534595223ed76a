"""Private shared-memory regions (dispatch_client.shm_region): created exclusively, mode
0600, owner checked; another local user can neither read, create nor have the client adopt
a region. Real files in /dev/shm, each test removing its own."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from dispatch_client.shm import ShmError, ShmRegionPool, SystemShmBackend, region_name
from dispatch_client.shm_region import (
    SHM_DIR,
    PrivateRegion,
    RegionNotPrivateError,
    check_private,
    create_private_region,
)
from other_user import OTHER_UID, as_other_user, needs_root, try_open


@pytest.fixture
def name() -> Iterator[str]:
    """A fresh region name; whatever is left under it is removed afterwards."""
    chosen = region_name("test")
    yield chosen
    (SHM_DIR / chosen).unlink(missing_ok=True)


@pytest.fixture
def region(name: str) -> Iterator[PrivateRegion]:
    made = create_private_region(name, 4096)
    yield made
    made.destroy()


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_names_are_unpredictable_and_carry_the_pid() -> None:
    one, two = region_name("in"), region_name("in")
    assert one != two
    _, pid, token, role = one.split("_")[-4:]
    assert (pid, role) == (str(os.getpid()), "in") and len(token) == 32
    int(token, 16)


def test_a_region_is_the_callers_own_with_mode_0600(region: PrivateRegion) -> None:
    status = region.path.stat()
    assert mode_of(region.path) == 0o600 and status.st_uid == os.geteuid()
    assert status.st_size == 4096
    region.verify()


def test_the_mode_is_0600_whatever_the_umask(name: str) -> None:
    old = os.umask(0)
    try:
        made = create_private_region(name, 64)
    finally:
        os.umask(old)
    try:
        assert mode_of(made.path) == 0o600
    finally:
        made.destroy()


def test_an_existing_region_is_never_adopted(name: str) -> None:
    path = SHM_DIR / name
    path.write_bytes(b"planted")
    path.chmod(0o666)
    with pytest.raises(RegionNotPrivateError, match="already exists"):
        create_private_region(name, 64)
    assert path.read_bytes() == b"planted"  # left alone, not truncated nor removed


def test_a_symlink_under_the_name_is_not_followed(name: str, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"")
    (SHM_DIR / name).symlink_to(target)
    with pytest.raises(RegionNotPrivateError):
        create_private_region(name, 64)
    assert target.read_bytes() == b""


@pytest.mark.parametrize("mode", [0o644, 0o660, 0o606, 0o666])
def test_a_file_others_may_open_is_not_private(name: str, mode: int) -> None:
    path = SHM_DIR / name
    path.write_bytes(b"")
    path.chmod(mode)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(RegionNotPrivateError, match=f"mode {mode:04o}"):
            check_private(fd, path)
    finally:
        os.close(fd)


@needs_root
def test_a_file_of_another_uid_is_not_private(name: str) -> None:
    path = SHM_DIR / name
    path.write_bytes(b"")
    path.chmod(0o600)
    os.chown(path, OTHER_UID, OTHER_UID)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(RegionNotPrivateError, match=f"owner uid {OTHER_UID}"):
            check_private(fd, path)
    finally:
        os.close(fd)


def test_verify_refuses_a_region_opened_up_or_replaced(region: PrivateRegion) -> None:
    region.path.chmod(0o644)
    with pytest.raises(RegionNotPrivateError, match="mode 0644"):
        region.verify()
    region.path.unlink()
    with pytest.raises(RegionNotPrivateError, match="gone"):
        region.verify()
    region.path.write_bytes(b"")
    region.path.chmod(0o600)
    with pytest.raises(RegionNotPrivateError, match="replaced"):
        region.verify()


def test_destroy_keeps_a_mapping_that_is_still_viewed(name: str) -> None:
    made = create_private_region(name, 64)
    view = np.frombuffer(made.mapping, dtype=np.uint8)
    made.mapping[:3] = b"abc"
    made.destroy()
    made.destroy()  # idempotent
    assert not made.path.exists()
    assert bytes(view[:3]) == b"abc"  # still mapped: never unmapped under a live view


def test_bad_names_and_sizes_are_refused() -> None:
    for bad in ("", "a/b", ".", ".."):
        with pytest.raises(ValueError):
            create_private_region(bad, 64)
    with pytest.raises(ValueError):
        create_private_region("dispatch_client_x", 0)


def test_the_pool_refuses_a_region_planted_under_its_name(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    (SHM_DIR / name).write_bytes(b"")
    monkeypatch.setattr("dispatch_client.shm_pool.region_name", lambda role: name)

    class NoServer:
        def register_system_shared_memory(self, *args: object, **kwargs: object) -> None:
            raise AssertionError("nothing may be registered")

    with pytest.raises(ShmError, match="already exists"):
        ShmRegionPool(SystemShmBackend(), NoServer(), input_bytes=64, output_bytes=64, size=1)


# ---- another local user ---------------------------------------------------------------------


@needs_root
def test_another_user_cannot_read_or_write_a_region(region: PrivateRegion) -> None:
    path = region.path
    seen = as_other_user(
        lambda: [
            try_open(path, os.O_RDONLY),
            try_open(path, os.O_RDWR),
            try_open(path, os.O_WRONLY),
        ]
    )
    assert seen == ["EACCES", "EACCES", "EACCES"]


@needs_root
def test_another_user_cannot_take_a_name_the_client_uses(region: PrivateRegion) -> None:
    path = region.path

    def remove() -> str:
        try:
            path.unlink()
        except PermissionError:
            return "EPERM"
        return "removed"

    seen = as_other_user(
        lambda: [
            try_open(path, os.O_RDWR | os.O_CREAT),
            try_open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL),
            remove(),  # /dev/shm is sticky: only the owner removes a file
        ]
    )
    assert seen == ["EACCES", "EEXIST", "EPERM"]
    region.verify()  # still the client's own


@needs_root
def test_a_region_another_user_planted_is_refused_not_adopted(name: str) -> None:
    path = SHM_DIR / name

    def plant() -> str:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o666)
        os.fchmod(fd, 0o666)
        os.write(fd, b"watching")
        os.close(fd)
        return "planted"

    assert as_other_user(plant) == "planted"
    assert path.stat().st_uid == OTHER_UID
    with pytest.raises(RegionNotPrivateError, match="already exists"):
        create_private_region(name, 64)
    assert path.read_bytes() == b"watching"  # nothing of the client's went into it
