"""The Python backend's own shared-memory regions, kept from everyone but their server.

Triton 2.51's Python backend makes one region per model instance, ``/dev/shm/<prefix><uuid>``
(``--backend-config=python,shm-region-prefix-name``), sets it to mode 0644 whatever the umask
(boost.interprocess chmods it after creating it; the launcher preloads a shim,
native/private_shm.c, that keeps it 0600), and passes its name to the instance's stub on the
command line. Without the shim any local user could read the requests and answers in it; and
a holder of the shared-memory key could register it through Triton's shared-memory API and
have Triton write into the backend's own arena (a crash, CVE-2025-23319 class).

`seal_own_region`, run in the stub as the model instance initializes (once the server and
the stub both have the region open and mapped), sets it to 0600 and removes its name: from
then on nobody can open it, Triton's registration included, while the two processes keep
their mappings (the arena grows through the same file, not by name). Triton makes the region
anew under the same name for every stub start (a reload after a stub death included), and
every start seals it again. `tighten_regions` is the launcher's sweep over what is still
named (0600, never removed: a stub may be about to open it).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Final

__all__ = [
    "SHM_DIR",
    "STUB_NAME",
    "seal_own_region",
    "stub_region_name",
    "tighten_regions",
]

SHM_DIR: Final = Path("/dev/shm")
STUB_NAME: Final = "triton_python_backend_stub"
_OPEN: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def stub_region_name(cmdline: bytes) -> str | None:
    """The region a Python-backend stub was started with (its command line's second
    argument: ``stub <model.py> <region> <size> ...``), or None for any other process."""
    argv = cmdline.split(b"\0")
    if len(argv) < 3 or not argv[0].endswith(STUB_NAME.encode()):
        return None
    name = argv[2].decode(errors="replace")
    return name if name and "/" not in name and name not in (".", "..") else None


def seal_own_region(shm_dir: Path = SHM_DIR, proc_self: Path = Path("/proc/self")) -> str | None:
    """In a Python-backend stub: set its region to 0600 and remove its name (see the module);
    the region's name.

    None outside a stub (tests, the launcher) or when the name is already gone. A region
    that is not this uid's own is left alone (OSError says so: it was not made by this
    server); other OSErrors propagate for the caller to report.
    """
    try:
        name = stub_region_name((proc_self / "cmdline").read_bytes())
    except OSError:
        return None
    if name is None:
        return None
    path = shm_dir / name
    try:
        fd = os.open(path, _OPEN)
    except FileNotFoundError:
        return None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != os.geteuid():
            raise PermissionError(
                f"{path} is not a region of this server (owner uid {status.st_uid}): left alone"
            )
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return name


def tighten_regions(prefix: str, shm_dir: Path = SHM_DIR) -> list[Path]:
    """Set every region of this uid named ``prefix*`` to 0600; the ones changed."""
    changed: list[Path] = []
    if not prefix or not shm_dir.is_dir():
        return changed
    for path in sorted(shm_dir.glob(f"{prefix}*")):
        try:
            fd = os.open(path, _OPEN)
        except OSError:
            continue  # gone (sealed or removed) meanwhile, or not a plain file
        try:
            status = os.fstat(fd)
            ours = stat.S_ISREG(status.st_mode) and status.st_uid == os.geteuid()
            if ours and stat.S_IMODE(status.st_mode) & 0o077:
                os.fchmod(fd, 0o600)
                changed.append(path)
        except OSError:
            continue
        finally:
            os.close(fd)
    return changed
