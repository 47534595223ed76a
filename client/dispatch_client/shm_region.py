"""Private POSIX shared-memory regions: the caller's own, nobody else's, or refused.

A region is a file in /dev/shm (what `shm_open` names ``/<name>``). Each one the client
makes is created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``: an existing file of that
name, whoever made it, is never adopted), with mode 0600, and checked with `fstat` before it
is sized and mapped: a regular file owned by this process's effective uid, with no group or
other permission bit. Before the server is told the name, `verify` checks that the name
still leads to that same file. Region names carry 128 random bits (`shm_layout.region_name`),
so no other local user can create a region under a name the client will use.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dispatch_client.shm_layout import ShmError

__all__ = [
    "SHM_DIR",
    "PrivateRegion",
    "RegionNotPrivateError",
    "check_private",
    "create_private_region",
]

SHM_DIR: Final = Path("/dev/shm")
_CREATE: Final = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class RegionNotPrivateError(ShmError):
    """A shared-memory region that is not the caller's own: it already existed, or it is
    owned by another uid, or others may read or write it. Nothing was mapped or sent."""


def check_private(fd: int, path: Path) -> os.stat_result:
    """``fd``'s status if it is a regular file owned by this process's effective uid with
    mode 0600 or stricter; else RegionNotPrivateError naming ``path``, the owner and mode."""
    status = os.fstat(fd)
    mode = stat.S_IMODE(status.st_mode)
    if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid() or mode & 0o077:
        raise RegionNotPrivateError(
            f"shared-memory region {path} is not this process's own (owner uid "
            f"{status.st_uid}, mode {mode:04o}; needs uid {os.geteuid()}, mode 0600): "
            "refusing to use it"
        )
    return status


@dataclass(eq=False)
class PrivateRegion:
    """One mapped region: its file, the file's identity, and the writable mapping."""

    path: Path
    device: int
    inode: int
    mapping: mmap.mmap

    def verify(self) -> None:
        """Raise RegionNotPrivateError unless ``path`` still names this region, still
        private (what the server will open by that name)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise RegionNotPrivateError(
                f"shared-memory region {self.path} is gone or not a plain file ({exc.strerror})"
            ) from exc
        try:
            status = check_private(fd, self.path)
        finally:
            os.close(fd)
        if (status.st_dev, status.st_ino) != (self.device, self.inode):
            raise RegionNotPrivateError(
                f"shared-memory region {self.path} was replaced by another file: refusing it"
            )

    def destroy(self) -> None:
        """Unlink the name, then unmap. A mapping still viewed (a numpy array of an answer
        the caller kept) stays valid until its last view goes; it is never unmapped under
        it. Idempotent."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        with contextlib.suppress(BufferError):
            self.mapping.close()


def create_private_region(name: str, byte_size: int, shm_dir: Path = SHM_DIR) -> PrivateRegion:
    """Create, check, size and map the region ``name`` (no ``/`` in it); see the module.

    RegionNotPrivateError when the name is taken (the file is left alone) or the new file is
    not private (it is removed); OSError for other failures (no space in /dev/shm)."""
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"not a shared-memory region name: {name!r}")
    if byte_size < 1:
        raise ValueError("a region needs at least 1 byte")
    path = shm_dir / name
    try:
        fd = os.open(path, _CREATE, 0o600)
    except FileExistsError as exc:
        raise RegionNotPrivateError(
            f"shared-memory region {path} already exists (made by someone else): the client "
            "never adopts an existing region"
        ) from exc
    try:
        os.fchmod(fd, 0o600)  # exactly 0600, whatever the umask
        status = check_private(fd, path)
        os.ftruncate(fd, byte_size)
        mapping = mmap.mmap(fd, byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)
    return PrivateRegion(path, status.st_dev, status.st_ino, mapping)
