"""The launcher's private copy of a model repository: the folder Triton reads on a verified
server, made of the bytes that were verified.

Without it, a writer of the repository who lacks the signing key could swap a file between
the launcher's check and Triton's read, and have the changed code run. Here every file is
read once, into a folder only the launcher can write; the copy is what is verified and what
Triton loads.
"""

from __future__ import annotations

import compileall
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from dispatch_service.core.model_config import CONFIG_NAME
from dispatch_service.core.repository_layout import ModelLayout
from dispatch_service.core.signing import (
    FolderEntryError,
    Outcome,
    TrustedKeys,
    Verification,
    copy_version,
    verify_version,
)
from dispatch_service.ops.verified_load import LoadCheck, folder_digest, served_versions

__all__ = ["RepositoryCopy", "remove_orphaned_copies"]

_MODEL_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# dispatch-repository-<launcher pid>-<random>: a copy whose launcher is gone is removed.
_PREFIX: Final = "dispatch-repository-"


class RepositoryCopy:
    """The launcher's private copy of a model repository: the folder Triton reads.

    ``root`` (made mode 0700 under the temporary directory; only the launcher writes there)
    holds ``models/``, Triton's ``--model-repository``, and ``staging/``. Each version folder
    is copied file by file, each file read once (`signing.copy_version`), and the copy is
    verified: the verdict is on the bytes Triton will read, so a file swapped in the source
    after its check never reaches Triton. A verified copy replaces the one in place only when
    its files differ (Triton takes a changed folder for a changed model; its ``.pyc`` files
    are written at once, for the same reason). A refused copy is dropped: the folder in place
    stays the last verified copy, or an empty folder (version numbers match the source's, so
    a "latest" policy never slips to an older version); the refused version is left out of
    every load anyway. A model's other files (configs, warmup) are mirrored as read: configs
    are not signed (`core.signing`). `check` refreshes one model before each load after
    start; `prepare` every model before a start.
    """

    def __init__(self, source: Path, trusted: TrustedKeys) -> None:
        self.source = source
        self.trusted = trusted
        remove_orphaned_copies()
        self.root = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
        self.repository = self.root / "models"
        self._staging = self.root / "staging"
        self.repository.mkdir(mode=0o700)
        self._staging.mkdir(mode=0o700)
        self._lock = threading.Lock()
        self.verdicts: dict[tuple[str, int], Verification] = {}  # on the last copy read
        self._read: dict[tuple[str, int], dict[str, str]] = {}  # digests of the files read
        self._placed: dict[tuple[str, int], str] = {}  # folder digest of the copy in place

    def files_read(self, model: str, version: int) -> dict[str, str]:
        """SHA-256 of each file of the version as last read (the refused ones' included)."""
        return dict(self._read.get((model, version), {}))

    def prepare(self) -> None:
        """Copy and verify every model of the source (a start's plan reads `verdicts`)."""
        with self._lock:
            models = {
                path.name
                for path in self.source.iterdir()
                if path.is_dir() and not path.is_symlink() and (path / CONFIG_NAME).is_file()
            }
            for name in sorted(models):
                self._sync(name)
            for path in self.repository.iterdir():
                if path.name not in models:
                    shutil.rmtree(path)

    def check(self, model: str, config: Mapping[str, Any]) -> LoadCheck:
        """`check_load` on a fresh copy of ``model``: what it says loads is what Triton reads."""
        with self._lock:
            verdicts = self._sync(model)
        served = served_versions(config, sorted(verdicts))
        if config.get("platform") == "ensemble":
            return LoadCheck(model, config, served)
        refused = tuple(verdicts[v] for v in served if not verdicts[v].accepted)
        return LoadCheck(model, config, served, refused)

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def _sync(self, model: str) -> dict[int, Verification]:
        source, target = self.source / model, self.repository / model
        if not source.is_dir() or source.is_symlink() or not _MODEL_NAME.fullmatch(model):
            shutil.rmtree(target, ignore_errors=True)
            return {}
        target.mkdir(mode=0o700, exist_ok=True)
        versions = ModelLayout(source).versions()
        _mirror(source, target, skip=lambda p: p.name.isdigit())
        verdicts = {version: self._stage(model, version) for version in versions}
        for stale in set(ModelLayout(target).versions()) - set(versions):
            shutil.rmtree(target / str(stale))
            for known in (self.verdicts, self._read, self._placed):
                known.pop((model, stale), None)
        return verdicts

    def _stage(self, model: str, version: int) -> Verification:
        work = self._staging / secrets.token_hex(8)
        staged = work / model / str(version)
        staged.parent.mkdir(mode=0o700, parents=True)
        try:
            try:
                files = copy_version(self.source / model / str(version), staged)
                verdict = verify_version(staged, self.trusted)
            except FolderEntryError as exc:
                files, verdict = {}, Verification(model, version, exc.outcome, str(exc))
            except OSError as exc:
                reason = f"cannot read {exc.filename or 'a file'}: {exc.strerror}"
                files, verdict = {}, Verification(model, version, Outcome.MISSING_FILE, reason)
            key = (model, version)
            self.verdicts[key], self._read[key] = verdict, files
            place = self.repository / model / str(version)
            digest = folder_digest(files)
            if verdict.accepted and (self._placed.get(key) != digest or not place.is_dir()):
                # A stub that wrote __pycache__ after Triton recorded the folder's time would
                # make the next load that reaches the model take it for modified and reload
                # it from its files, dropping a version-policy override: compiled now, nothing
                # in the folder changes once Triton has read it.
                compileall.compile_dir(staged, quiet=2, workers=1)
                if place.exists():
                    os.rename(place, work / "replaced")
                os.rename(staged, place)
                self._placed[key] = digest
            elif not place.exists():
                place.mkdir(mode=0o700)  # refused and never verified: nothing to load
            return verdict
        finally:
            shutil.rmtree(work, ignore_errors=True)


def remove_orphaned_copies(folder: Path | None = None, prefix: str = _PREFIX) -> list[Path]:
    """Remove the copies (``<prefix><launcher pid>-...``; ours: same uid, a folder, not a
    link) whose launcher process is gone, e.g. killed before it could remove its own; the
    folders removed. ``prefix``: another launcher-owned folder named so (a restart's view,
    `first_instances`)."""
    removed = []
    for path in sorted(Path(folder or tempfile.gettempdir()).glob(f"{prefix}*")):
        pid = path.name[len(prefix) :].split("-", 1)[0]
        try:
            info = path.lstat()
        except OSError:
            continue
        if not pid.isdigit() or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # alive (or a process of that pid): kept
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _mirror(source: Path, target: Path, skip: Callable[[Path], bool]) -> None:
    """Make ``target`` hold what ``source`` holds (regular files and folders; links and other
    entries are left out), each file read once, one not changed not written again."""
    wanted: set[str] = set()
    for entry in sorted(source.iterdir()):
        if skip(entry):
            continue
        mode = entry.lstat().st_mode
        place = target / entry.name
        if stat.S_ISDIR(mode):
            wanted.add(entry.name)
            if not place.is_dir() or place.is_symlink():
                _remove(place)
                place.mkdir(mode=0o700)
            _mirror(entry, place, skip=lambda _: False)
        elif stat.S_ISREG(mode):
            data = _read_regular(entry)
            if data is None:
                continue
            wanted.add(entry.name)
            if place.is_file() and not place.is_symlink() and place.read_bytes() == data:
                continue
            _remove(place)
            fresh = target / f".{entry.name}.{secrets.token_hex(4)}"
            fresh.write_bytes(data)
            os.replace(fresh, place)
    for entry in target.iterdir():
        if entry.name not in wanted and not skip(entry):
            _remove(entry)


def _read_regular(path: Path) -> bytes | None:
    """The bytes of ``path`` when it is (still) a regular file, never following a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as stream:
        if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            return None
        return stream.read()


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
