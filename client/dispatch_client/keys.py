"""Access keys for the server's restricted endpoint groups (`dispatch_contract.keys`).

The header names, environment names and key-file rules are shared with the server, so they
live in the contract package; the client's own modules and users import them from here too.
"""

from __future__ import annotations

from dispatch_contract.keys import (
    ADMIN_KEY_ENV,
    ADMIN_KEY_FILE_ENV,
    ADMIN_KEY_HEADER,
    GRPC_HEADER_PREFIX,
    PRIORITY_KEY_DIGEST_ENV,
    PRIORITY_KEY_ENV,
    PRIORITY_KEY_FILE_ENV,
    PRIORITY_KEY_HEADER,
    SHM_KEY_ENV,
    SHM_KEY_FILE_ENV,
    SHM_KEY_HEADER,
    KeyFileError,
    grpc_headers,
    http_headers,
    read_key,
    read_key_file,
)

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
