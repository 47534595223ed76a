"""The server's access keys: which endpoint groups each one locks, and where they are kept.

Every start of the server locks its control endpoints: the admin key guards the
model repository (load/unload, which can upload a `model.py` and run it in the server),
logging and trace settings; the shared-memory key guards region (un)registration, so the
co-located clients that need shared memory never hold the admin key. Inference, health,
metadata, model config and statistics stay open to callers on the bound address.
With no key given, `make serve` creates both (random, files of mode 0600) instead of
running open; tests and benchmarks get fresh random keys per server.

The third key, the priority key, locks no endpoint group: it entitles a window to the
priority lane (`dispatch_contract.keys`). Triton forwards its header to the models as a
request parameter (``--*-header-forward-pattern``); the lane's stubs compare its SHA-256.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from dispatch_contract.keys import (
    ADMIN_KEY_HEADER,
    PRIORITY_KEY_HEADER,
    SHM_KEY_HEADER,
    KeyFileError,
    read_key_file,
)

__all__ = [
    "ADMIN_GROUPS",
    "ADMIN_KEY_FILE",
    "OUTCOME_KEY_FILE",
    "PRIORITY_KEY_FILE",
    "SHM_GROUPS",
    "SHM_KEY_FILE",
    "AccessKeys",
    "KeyFileError",
    "command_line_note",
    "load_or_create_key",
    "load_or_create_keys",
    "new_key",
    "proc_hides_processes",
]

ADMIN_GROUPS: Final = ("model-repository", "logging", "trace")
SHM_GROUPS: Final = ("shared-memory",)
ADMIN_KEY_FILE: Final = "admin.key"
SHM_KEY_FILE: Final = "shm.key"
PRIORITY_KEY_FILE: Final = "priority.key"
# The outcome service's key (`outcomes.service`): the platform reporting outcomes holds it,
# never the admin key.
OUTCOME_KEY_FILE: Final = "outcome.key"
# /proc mount options under which another user cannot read a process's command line
# (proc(5): hidepid=1/noaccess, 2/invisible, 4/ptraceable).
_HIDING: Final = frozenset({"1", "2", "4", "noaccess", "invisible", "ptraceable"})


def new_key() -> str:
    """256 random bits, URL-safe (it travels in an HTTP header and a command-line flag)."""
    return secrets.token_urlsafe(32)


@dataclass(frozen=True)
class AccessKeys:
    """The keys; fresh ones by default, so a server is never started open (and a priority
    lane nobody was given the key of serves nobody but the launcher's probes)."""

    admin: str = field(default_factory=new_key, repr=False)
    shm: str = field(default_factory=new_key, repr=False)
    priority: str = field(default_factory=new_key, repr=False)

    def __post_init__(self) -> None:
        named = (("admin", self.admin), ("shm", self.shm), ("priority", self.priority))
        for name, key in named:
            if not key or any(c.isspace() or c in ",:=" for c in key):
                raise ValueError(f"the {name} key must be non-empty, without spaces or ',:='")
        if self.admin == self.shm:
            raise ValueError("the shared-memory key must differ from the admin key")
        if self.priority in (self.admin, self.shm):
            raise ValueError("the priority key must differ from the admin and shm keys")

    @property
    def priority_digest(self) -> str:
        """What the lane's stubs get of the priority key: its SHA-256 (hex)."""
        return hashlib.sha256(self.priority.encode()).hexdigest()

    def triton_args(self, unlocked: Sequence[str] = ()) -> list[str]:
        """tritonserver flags restricting every control group (but ``unlocked``), over HTTP
        and gRPC."""
        unknown = set(unlocked) - {*ADMIN_GROUPS, *SHM_GROUPS}
        if unknown:
            raise ValueError(f"unknown endpoint group(s) {sorted(unknown)}")
        args = []
        for all_groups, header, key in (
            (ADMIN_GROUPS, ADMIN_KEY_HEADER, self.admin),
            (SHM_GROUPS, SHM_KEY_HEADER, self.shm),
        ):
            groups = [g for g in all_groups if g not in unlocked]
            if not groups:
                continue
            spec = f"{','.join(groups)}:{header}={key}"
            args += [f"--http-restricted-api={spec}", f"--grpc-restricted-protocol={spec}"]
        # The priority key's header reaches the models as a request parameter.
        forward = f"^{PRIORITY_KEY_HEADER}$"
        args += [f"--http-header-forward-pattern={forward}"]
        args += [f"--grpc-header-forward-pattern={forward}"]
        return args


def _write_new(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(new_key() + "\n")


def load_or_create_key(directory: Path, name: str) -> tuple[str, Path | None]:
    """The key in ``directory / name``, created (mode 0600) when missing; returns it and
    the file when created now. A file readable by others is refused (KeyFileError)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / name
    created = None
    if not path.exists():
        _write_new(path)
        created = path
    return read_key_file(path), created


def load_or_create_keys(directory: Path) -> tuple[AccessKeys, list[Path]]:
    """The keys in ``directory`` (admin.key, shm.key, priority.key), creating any that is
    missing.

    Returns the keys and the files created now. Files readable by others are refused
    (KeyFileError), as are two equal keys (ValueError).
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    created = []
    for name in (ADMIN_KEY_FILE, SHM_KEY_FILE, PRIORITY_KEY_FILE):
        path = directory / name
        if not path.exists():
            _write_new(path)
            created.append(path)
    keys = AccessKeys(
        admin=read_key_file(directory / ADMIN_KEY_FILE),
        shm=read_key_file(directory / SHM_KEY_FILE),
        priority=read_key_file(directory / PRIORITY_KEY_FILE),
    )
    return keys, created


def proc_hides_processes(mounts: str) -> bool:
    """Whether ``mounts`` (the text of /proc/self/mounts) mounts /proc with a ``hidepid``
    that keeps other users from reading a process's command line."""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "/proc" and fields[2] == "proc":
            options = dict(o.partition("=")[::2] for o in fields[3].split(","))
            return options.get("hidepid", "0") in _HIDING
    return False


def command_line_note(mounts: str, uid: int) -> str:
    """One line for the launcher's start: Triton 2.51 takes its keys only as command-line
    flags (``--http-restricted-api``, ``--grpc-restricted-protocol``; no file or environment
    form), so who on this host can read /proc/<pid>/cmdline can load models that run as
    ``uid``; how to close it."""
    where = "Triton's keys are on its command line (/proc/<pid>/cmdline)"
    if proc_hides_processes(mounts):
        return (
            f"note: {where}: /proc is mounted with hidepid, so only uid {uid} and root can "
            "read them; run the server as a user of its own"
            + (" (it runs as root now)" if uid == 0 else "")
        )
    return (
        f"note: {where}: any local user can read them here and load code that runs as uid "
        f"{uid}. Close it: mount -o remount,hidepid=invisible /proc (hidepid=2), and run the "
        "server as a user of its own (containers: a PID namespace of its own does it)"
    )
