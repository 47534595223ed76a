"""Access keys for the server's restricted endpoint groups: header names, environment names, and
reading a key from the environment or a file.

Both sides need these: the client sends the keys, the server (its launcher, the admin CLI, the
feature encoder's geocoder key files) reads and checks them. They live in the contract
package, which both already depend on, so the server never needs the client to read a key.

The server locks its control endpoints behind two keys (see the launcher,
`dispatch_service.ops.server`): the admin key (model repository, logging, trace) and a
separate shared-memory key, so a co-located client that registers shared-memory regions
never holds the admin key. Tools take a key as an argument, else from ``<NAME>`` in the
environment, else from the file named by ``<NAME>_FILE`` (the launcher writes such files,
mode 0600, when it creates keys). Over gRPC Triton expects the header under the prefix
``triton-grpc-protocol-``.

A third key is an entitlement, not a lock on an endpoint group: the priority key. Only a
window sent with it (header ``dispatch-priority-key``, the same name over HTTP and gRPC,
which Triton hands the model as a request parameter; or that request parameter itself) is
served by the priority lane `dispatch_priority`. The launcher hands the stubs only its
SHA-256 (``DISPATCH_PRIORITY_KEY_SHA256`` in their environment).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

__all__ = [
    "ADMIN_KEY_ENV",
    "ADMIN_KEY_FILE_ENV",
    "ADMIN_KEY_HEADER",
    "GRPC_HEADER_PREFIX",
    "PRIORITY_KEY_DIGEST_ENV",
    "PRIORITY_KEY_ENV",
    "PRIORITY_KEY_FILE_ENV",
    "PRIORITY_KEY_HEADER",
    "SHM_KEY_ENV",
    "SHM_KEY_FILE_ENV",
    "SHM_KEY_HEADER",
    "KeyFileError",
    "grpc_headers",
    "http_headers",
    "read_key",
    "read_key_file",
]

ADMIN_KEY_HEADER: Final = "admin-key"
SHM_KEY_HEADER: Final = "shm-key"
GRPC_HEADER_PREFIX: Final = "triton-grpc-protocol-"
ADMIN_KEY_ENV: Final = "DISPATCH_ADMIN_KEY"
ADMIN_KEY_FILE_ENV: Final = "DISPATCH_ADMIN_KEY_FILE"
SHM_KEY_ENV: Final = "DISPATCH_SHM_KEY"
SHM_KEY_FILE_ENV: Final = "DISPATCH_SHM_KEY_FILE"
# Lower case: a gRPC metadata key, and the request parameter Triton forwards it as.
PRIORITY_KEY_HEADER: Final = "dispatch-priority-key"
PRIORITY_KEY_ENV: Final = "DISPATCH_PRIORITY_KEY"
PRIORITY_KEY_FILE_ENV: Final = "DISPATCH_PRIORITY_KEY_FILE"
PRIORITY_KEY_DIGEST_ENV: Final = "DISPATCH_PRIORITY_KEY_SHA256"


class KeyFileError(ValueError):
    """A key file that cannot be used: unreadable, empty, or readable by others."""


def read_key_file(path: Path) -> str:
    """The key in ``path`` (surrounding whitespace dropped); refuses a file that others can
    read or the group can write (a key anyone on the host can read locks nothing). Group
    read is allowed: Kubernetes mounts Secret files group-readable for the pod's fsGroup."""
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc}") from None
    if mode & 0o027:
        raise KeyFileError(
            f"key file {path} is open to others (mode {mode & 0o777:o}): chmod 600 {path}"
        )
    if not text:
        raise KeyFileError(f"key file {path} is empty")
    return text


def read_key(
    value: str | None,
    env: str,
    environ: Mapping[str, str] | None = None,
    file: Path | None = None,
) -> str | None:
    """The first of: ``value``, ``file``, ``$env``, the file named by ``$env_FILE``; else None."""
    if value:
        return value
    if file is not None:
        return read_key_file(file)
    environ = os.environ if environ is None else environ
    if environ.get(env):
        return environ[env]
    named = environ.get(f"{env}_FILE")
    return read_key_file(Path(named)) if named else None


def http_headers(header: str, key: str | None) -> dict[str, str]:
    """The HTTP header carrying ``key`` (none without a key)."""
    return {header: key} if key else {}


def grpc_headers(header: str, key: str | None) -> dict[str, str]:
    """The gRPC metadata carrying ``key``: Triton checks it under its restricted prefix."""
    return {f"{GRPC_HEADER_PREFIX}{header}": key} if key else {}
