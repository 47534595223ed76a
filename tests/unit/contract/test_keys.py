"""Keys from arguments, the environment or files (dispatch_contract.keys, shared by the client
and the server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch_contract.keys import (
    KeyFileError,
    grpc_headers,
    http_headers,
    read_key,
    read_key_file,
)


def key_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "k.key"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_the_first_source_wins(tmp_path: Path) -> None:
    path = key_file(tmp_path, "from-file\n")
    env = {"K": "from-env", "K_FILE": str(path)}
    assert read_key("given", "K", env, file=path) == "given"
    assert read_key(None, "K", env, file=path) == "from-file"
    assert read_key(None, "K", env) == "from-env"
    assert read_key(None, "K", {"K_FILE": str(path)}) == "from-file"
    assert read_key(None, "K", {}) is None
    assert read_key("", "K", {"K": ""}) is None


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o660, 0o602])
def test_a_key_file_others_can_read_is_refused_with_the_fix(tmp_path: Path, mode: int) -> None:
    path = key_file(tmp_path, "secret", mode)
    with pytest.raises(KeyFileError, match=f"chmod 600 {path}"):
        read_key_file(path)


@pytest.mark.parametrize("mode", [0o600, 0o400, 0o440, 0o640])
def test_owner_and_group_readable_key_files_are_accepted(tmp_path: Path, mode: int) -> None:
    assert read_key_file(key_file(tmp_path, " secret\n", mode)) == "secret"


def test_missing_and_empty_key_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read"):
        read_key_file(tmp_path / "absent")
    with pytest.raises(KeyFileError, match="empty"):
        read_key_file(key_file(tmp_path, " \n"))


def test_headers_carry_the_key_over_each_protocol() -> None:
    assert http_headers("shm-key", "k") == {"shm-key": "k"}
    assert grpc_headers("shm-key", "k") == {"triton-grpc-protocol-shm-key": "k"}
    assert http_headers("shm-key", None) == {} == grpc_headers("admin-key", "")
