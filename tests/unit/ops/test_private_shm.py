"""native/private_shm.c, the LD_PRELOAD shim `make setup` builds into .triton/lib: in a
process that preloads it, a chmod of a file on /dev/shm loses its group and other bits, and
every other chmod is the C library's own.

Each case runs in a fresh Python with umask 077 (as the launcher runs Triton) that makes a
region the way boost.interprocess does in Triton 2.51's Python backend (shm_open with
O_CREAT | O_EXCL and 0644, then fchmod 0644), so the same case without the shim shows the
mode the kernel gives: 0644.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch_service.ops.server import Ports, ServerOptions, TritonServer
from dispatch_service.ops.triton_runtime import PRIVATE_SHM_SHIM, TritonRuntime

# Prints {case: mode} for: a region made like boost's, then chmod'ed each way; a regular
# file chmod'ed each way; a region set to 0400 (no group or other bits asked); and the
# error of an fchmod on a closed descriptor.
CHILD = r"""
import _posixshmem, errno, json, os, stat, sys
os.umask(0o077)
folder = sys.argv[1]
name = f"/dispatch-shim-test-{os.getpid()}"
mode = lambda fd: oct(stat.S_IMODE(os.fstat(fd).st_mode))
out = {}
fd = _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
try:
    os.fchmod(fd, 0o644)
    out["region fchmod 0644"] = mode(fd)
    os.chmod("/dev/shm" + name, 0o666)
    out["region chmod 0666"] = mode(fd)
    os.chmod(name[1:], 0o640, dir_fd=os.open("/dev/shm", os.O_RDONLY))
    out["region fchmodat 0640"] = mode(fd)
    os.fchmod(fd, 0o400)
    out["region fchmod 0400"] = mode(fd)
finally:
    _posixshmem.shm_unlink(name)
    os.close(fd)
path = os.path.join(folder, "plain")
fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
os.fchmod(fd, 0o644)
out["file fchmod 0644"] = mode(fd)
os.chmod(path, 0o664)
out["file chmod 0664"] = mode(fd)
os.chmod("plain", 0o640, dir_fd=os.open(folder, os.O_RDONLY))
out["file fchmodat 0640"] = mode(fd)
os.close(fd)
try:
    os.fchmod(fd, 0o644)
except OSError as exc:
    out["closed fchmod"] = errno.errorcode[exc.errno]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def shim() -> Path:
    if not PRIVATE_SHM_SHIM.is_file():
        if shutil.which("cc") is None:
            pytest.skip("no C compiler: make setup could not build the shim")
        pytest.fail(f"{PRIVATE_SHM_SHIM} missing: run make setup")
    return PRIVATE_SHM_SHIM


def modes(folder: Path, preload: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return dict(json.loads(done.stdout))


def test_a_region_made_like_boosts_stays_private_under_the_shim(shim: Path, tmp_path: Path) -> None:
    assert modes(tmp_path, shim) == {
        "region fchmod 0644": "0o600",
        "region chmod 0666": "0o600",
        "region fchmodat 0640": "0o600",
        "region fchmod 0400": "0o400",
        "file fchmod 0644": "0o644",
        "file chmod 0664": "0o664",
        "file fchmodat 0640": "0o640",
        "closed fchmod": "EBADF",
    }


def test_without_the_shim_the_region_is_opened_to_everyone(tmp_path: Path) -> None:
    """The kernel's own answer to the same calls: what the shim exists to change."""
    found = modes(tmp_path, None)
    assert found["region fchmod 0644"] == "0o644"
    assert found["region chmod 0666"] == "0o666"
    assert found["file fchmod 0644"] == "0o644"


def test_the_launcher_preloads_the_shim_where_it_was_built(tmp_path: Path) -> None:
    built = tmp_path / "libshim.so"
    built.write_bytes(b"")
    runtime = TritonRuntime(tmp_path, tmp_path, tmp_path, tmp_path, private_shm_shim=built)
    assert runtime.preload() == built
    assert runtime.private_shm_note() is None
    missing = TritonRuntime(
        tmp_path, tmp_path, tmp_path, tmp_path, private_shm_shim=tmp_path / "absent.so"
    )
    assert missing.preload() is None
    note = missing.private_shm_note()
    assert note is not None and "absent.so is missing" in note and "0644" in note


def test_triton_gets_the_shim_first_in_ld_preload_and_keeps_the_callers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = tmp_path / "libshim.so"
    built.write_bytes(b"")
    options = ServerOptions(model_repository=tmp_path / "repo", ports=Ports.free())
    runtime = TritonRuntime(tmp_path, tmp_path, tmp_path, tmp_path, private_shm_shim=built)
    server = TritonServer(runtime, options, tmp_path / "server.log")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert server.environment()["LD_PRELOAD"] == str(built)
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    assert server.environment()["LD_PRELOAD"] == f"{built} /opt/other.so"
    without = TritonServer(
        TritonRuntime(tmp_path, tmp_path, tmp_path, tmp_path, private_shm_shim=tmp_path / "no.so"),
        options,
        tmp_path / "server.log",
    )
    assert without.environment()["LD_PRELOAD"] == "/opt/other.so"  # the caller's, untouched
