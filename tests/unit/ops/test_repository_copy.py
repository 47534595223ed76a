"""The launcher's private copy of a repository (`verified_load.RepositoryCopy`): what Triton
reads is what was verified, whatever happens to the source after the check.

A writer of the source without the signing key swaps ``model.py`` at every moment of a
check (before, between and after the reads of each file, and from a thread 0-100 ms after
the check begins): the copy Triton reads never holds the changed bytes.
"""

from __future__ import annotations

import hashlib
import os
import random
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dispatch_service.core import signing
from dispatch_service.core.repository_layout import model_layout
from dispatch_service.core.signing import (
    Outcome,
    TrustedKeys,
    generate_private_key,
    sign_version,
)
from dispatch_service.ops.repository_copy import RepositoryCopy, remove_orphaned_copies
from dispatch_service.ops.verified_load import (
    LoadVerifier,
    plan_load,
    read_config,
)
from other_user import as_other_user, needs_root

CONFIG = 'name: "scorer"\nbackend: "python"\nmax_batch_size: 8\n'
SIGNED = b"VERSION = 1\n"
CHANGED = b"VERSION = 1\nimport os; os.system('id')\n"
# The fast race runs in the default suite; `make test-hostile` runs the 100 attempts.
RACE_ATTEMPTS = int(os.environ.get("DISPATCH_SWAP_ATTEMPTS", "20"))


@pytest.fixture
def signer() -> Ed25519PrivateKey:
    return generate_private_key()


@pytest.fixture
def trusted(signer: Ed25519PrivateKey) -> TrustedKeys:
    return TrustedKeys.from_public_keys(signer.public_key())


@pytest.fixture
def repo(tmp_path: Path, signer: Ed25519PrivateKey) -> Path:
    repository = tmp_path / "repo"
    layout = model_layout(repository, "scorer")
    layout.version(1).mkdir(parents=True)
    layout.config.write_text(CONFIG)
    layout.python_model(1).write_bytes(SIGNED)
    (layout.version(1) / "weights.bin").write_bytes(b"\x01" * 4096)
    sign_version(layout.version(1), signer)
    layout.warmup.mkdir()
    (layout.warmup / "ORDERS").write_bytes(b"\x00" * 16)
    return repository


@pytest.fixture
def copy(repo: Path, trusted: TrustedKeys) -> Iterator[RepositoryCopy]:
    made = RepositoryCopy(repo, trusted)
    yield made
    made.remove()


def served_code(copy: RepositoryCopy) -> bytes:
    return model_layout(copy.repository, "scorer").python_model(1).read_bytes()


def test_the_copy_is_private_and_holds_the_verified_bytes(copy: RepositoryCopy) -> None:
    copy.prepare()
    assert stat.S_IMODE(copy.root.stat().st_mode) == 0o700
    assert copy.verdicts[("scorer", 1)].outcome is Outcome.VERIFIED
    assert served_code(copy) == SIGNED
    copied = model_layout(copy.repository, "scorer")
    assert copied.config.read_text() == CONFIG
    assert (copied.warmup / "ORDERS").read_bytes() == b"\x00" * 16
    # The plan reads the verdicts reached on the copy, not the files again.
    plan = plan_load(copy.repository, copy.trusted, verdicts=copy.verdicts)
    assert plan.startup == ("scorer",)


def test_a_file_changed_after_the_check_never_reaches_the_copy(
    copy: RepositoryCopy, repo: Path
) -> None:
    config = read_config(repo / "scorer")
    assert copy.check("scorer", config).clean
    model_layout(repo, "scorer").python_model(1).write_bytes(CHANGED)
    # Nothing re-reads the source until the next check: Triton's folder is unchanged ...
    assert served_code(copy) == SIGNED
    # ... and the next check refuses the changed file, keeping the verified copy in place.
    check = copy.check("scorer", config)
    assert [v.outcome for v in check.refused] == [Outcome.DIGEST_MISMATCH]
    assert served_code(copy) == SIGNED
    verifier = LoadVerifier(repo, copy.trusted, copy)
    fields = verifier.refusal_fields(check.refused[0])
    assert fields["file"] == "model.py"
    assert fields["file_sha256"] == hashlib.sha256(CHANGED).hexdigest()


@pytest.mark.parametrize("after_reads", [0, 1, 2, 3, 4])
def test_a_swap_between_the_reads_of_one_check_is_judged_on_what_was_read(
    copy: RepositoryCopy, repo: Path, monkeypatch: pytest.MonkeyPatch, after_reads: int
) -> None:
    """The swap lands after ``after_reads`` of the folder's files were copied (model.py,
    weights.bin, the manifest, the signature): the verdict is on the bytes copied, and the
    copy in place holds the changed code never."""
    source = model_layout(repo, "scorer").python_model(1)
    real_copy = signing._copy_file
    reads = 0

    def copy_then_maybe_swap(src: Path, dst: Path, name: str) -> str:
        nonlocal reads
        if reads == after_reads:
            source.write_bytes(CHANGED)
        reads += 1
        return real_copy(src, dst, name)

    monkeypatch.setattr(signing, "_copy_file", copy_then_maybe_swap)
    check = copy.check("scorer", read_config(repo / "scorer"))
    copied_first = after_reads > 0  # model.py is read first (sorted names)
    assert check.clean is copied_first
    if copied_first:
        assert served_code(copy) == SIGNED
    else:
        assert list(model_layout(copy.repository, "scorer").version(1).iterdir()) == []


def test_swaps_racing_the_check_never_reach_the_copy(copy: RepositoryCopy, repo: Path) -> None:
    """Attempts with the file swapped 0-100 ms after the check begins (and back), from
    another thread: 0 copies holding the changed code."""
    source = model_layout(repo, "scorer").python_model(1)
    config = read_config(repo / "scorer")
    chance = random.Random(45)
    served_changed = 0
    for _ in range(RACE_ATTEMPTS):
        source.write_bytes(SIGNED)
        delay = chance.uniform(0.0, 0.1)
        swapper = threading.Timer(delay, source.write_bytes, (CHANGED,))
        swapper.start()
        began = time.monotonic()
        while time.monotonic() - began < delay + 0.005:
            copy.check("scorer", config)
            if served_code(copy) != SIGNED:
                served_changed += 1
        swapper.join()
    assert served_changed == 0


def test_links_and_fifos_are_refused_without_blocking(
    copy: RepositoryCopy, repo: Path, signer: Ed25519PrivateKey
) -> None:
    folder = model_layout(repo, "scorer").version(1)
    config = read_config(repo / "scorer")
    weights = folder / "weights.bin"
    weights.unlink()
    os.mkfifo(weights)
    check = copy.check("scorer", config)
    assert [v.outcome for v in check.refused] == [Outcome.IRREGULAR_FILE]
    assert "weights.bin is not a regular file" in check.refused[0].reason
    weights.unlink()
    weights.symlink_to(model_layout(repo, "scorer").python_model(1))
    check = copy.check("scorer", config)
    assert [v.outcome for v in check.refused] == [Outcome.SYMLINK]


def test_an_unchanged_version_is_not_written_again_and_a_new_signed_one_is(
    copy: RepositoryCopy, repo: Path, signer: Ed25519PrivateKey
) -> None:
    config = read_config(repo / "scorer")
    copy.check("scorer", config)
    placed = model_layout(copy.repository, "scorer").version(1)
    before = placed.stat().st_ino, placed.stat().st_mtime_ns
    copy.check("scorer", config)
    assert (placed.stat().st_ino, placed.stat().st_mtime_ns) == before
    # A new build, signed: it replaces the copy in place.
    source = model_layout(repo, "scorer")
    source.python_model(1).write_bytes(b"VERSION = 1  # rebuilt\n")
    sign_version(source.version(1), signer)
    assert copy.check("scorer", config).clean
    assert served_code(copy) == b"VERSION = 1  # rebuilt\n"
    rebuilt = hashlib.sha256(b"VERSION = 1  # rebuilt\n").hexdigest()
    assert copy.files_read("scorer", 1)["model.py"] == rebuilt


def test_files_removed_from_the_source_leave_the_copy(copy: RepositoryCopy, repo: Path) -> None:
    copy.prepare()
    layout = model_layout(repo, "scorer")
    (layout.warmup / "ORDERS").unlink()
    copy.check("scorer", read_config(repo / "scorer"))
    assert not (model_layout(copy.repository, "scorer").warmup / "ORDERS").exists()


@needs_root
def test_another_user_can_neither_read_nor_write_the_copy(copy: RepositoryCopy) -> None:
    copy.prepare()
    code = model_layout(copy.repository, "scorer").python_model(1)

    def attempts() -> dict[str, bool]:
        done = {}
        for name, action in (
            ("list", lambda: list(copy.root.iterdir())),
            ("read", code.read_bytes),
            ("write", lambda: code.write_bytes(CHANGED)),
        ):
            try:
                action()
                done[name] = True
            except PermissionError:
                done[name] = False
        return done

    assert as_other_user(attempts) == {"list": False, "read": False, "write": False}
    assert served_code(copy) == SIGNED


def test_a_copy_whose_launcher_is_gone_is_removed_by_the_next_one(
    repo: Path, trusted: TrustedKeys, tmp_path: Path
) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    orphan = tmp_path / f"dispatch-repository-{gone.pid}-abc"
    live = tmp_path / f"dispatch-repository-{os.getpid()}-def"
    for folder in (orphan, live):
        (folder / "models").mkdir(parents=True)
    (tmp_path / "dispatch-repository-notapid").mkdir()
    assert remove_orphaned_copies(tmp_path) == [orphan]
    assert not orphan.exists() and live.is_dir()
    made = RepositoryCopy(repo, trusted)  # in the temporary directory: named by its pid
    try:
        assert made.root.name.startswith(f"dispatch-repository-{os.getpid()}-")
    finally:
        made.remove()
