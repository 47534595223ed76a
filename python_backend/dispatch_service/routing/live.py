"""Routing changed live through one file the launcher writes and every entry point reads.

A fleet replica's launcher (`ops.fleet_apply`) writes the routing of the state it serves to
the file named by ``DISPATCH_ROUTING_FILE`` in the server's environment (a folder only the
launcher's user can write), after the versions that routing names are loaded and only after
the signed state verified. `dispatch_router`, `dispatch_fused` and `dispatch_priority` look at
the file once per `execute` (one ``stat``) and route every window after it by its settings: a
routing change reloads no model. The file sets every `RouterSettings` field but
``cpu_scoring``, which stays the model config's (the GPU monitor sets it, `ops.gpu`). Without
the file (no revision yet) every entry point routes by `INITIAL_ROUTING`: a model config
holds no routing.

A file that cannot be read or breaks a rule is not used: the routing read last stays in force
(`LiveRouting.poll` reports the refusal once per content).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from dispatch_service.core.settings import SettingsError
from dispatch_service.routing.settings import ROUTING_DOCUMENT_FIELDS, RouterSettings

__all__ = [
    "ENTRY_POINTS_DIR",
    "LIVE_ROUTING_FIELDS",
    "ROUTING_FILE_ENV",
    "LiveChange",
    "LiveRouting",
    "read_entry_points",
    "read_routing_file",
    "routing_digest",
    "write_entry_point",
    "write_routing_file",
]

ROUTING_FILE_ENV: Final = "DISPATCH_ROUTING_FILE"
# The fields the file sets; ``cpu_scoring`` is each node's own (the model config's).
LIVE_ROUTING_FIELDS: Final = ROUTING_DOCUMENT_FIELDS
_MAX_FILE_BYTES: Final = 1 << 20
_FILE_FORMAT: Final = "dispatch-live-routing/2"
# Beside the routing file: one report per entry-point process of the routing it reads now
# (`write_entry_point`), which the launcher relays (`read_entry_points`) to status.
ENTRY_POINTS_DIR: Final = "entry-points"
_MAX_REPORT_BYTES: Final = 4096
_UNREADABLE: Final = (-1, -1, -1)  # `LiveRouting._seen` while the file cannot be looked at


def routing_digest(settings: RouterSettings) -> str:
    """12 hex digits naming ``settings``' routing (`LIVE_ROUTING_FIELDS`, not the node's own
    ``cpu_scoring``): what an entry point reports it routes by, and what status compares
    with the fleet document's."""
    text = json.dumps(settings.to_document(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def write_routing_file(path: Path, settings: RouterSettings, revision: int) -> None:
    """Replace the file at ``path`` with ``settings``' routing, atomically (a reader sees the
    old file or the new one, never a part); mode 0600."""
    document = {"format": _FILE_FORMAT, "revision": revision, "routing": settings.to_document()}
    handle, temporary = tempfile.mkstemp(prefix=".routing-", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(document, out, sort_keys=True)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_routing_file(path: Path, base: RouterSettings) -> tuple[RouterSettings, int]:
    """``base`` with the file's routing in place, and the file's revision. OSError when the
    file cannot be read; SettingsError (a ValueError) naming the field and rule it breaks."""
    handle = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):  # a FIFO would block every request
            raise SettingsError(f"{path.name}: not a regular file")
        with os.fdopen(handle, "rb", closefd=False) as stream:
            data = stream.read(_MAX_FILE_BYTES + 1)
    finally:
        os.close(handle)
    if len(data) > _MAX_FILE_BYTES:
        raise SettingsError(f"{path.name}: larger than {_MAX_FILE_BYTES} bytes")
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise SettingsError(f"{path.name}: not JSON ({exc})") from None
    if not isinstance(document, dict) or set(document) != {"format", "revision", "routing"}:
        raise SettingsError(f"{path.name}: must hold exactly format, revision, routing")
    if document.get("format") != _FILE_FORMAT:
        raise SettingsError(f"{path.name}: format must be {_FILE_FORMAT!r}")
    revision = document.get("revision")
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 0:
        raise SettingsError(f"{path.name}: revision must be an int >= 0, got {revision!r}")
    routing = RouterSettings.from_document(document.get("routing"), f"{path.name}: routing")
    try:
        return replace(routing, cpu_scoring=base.cpu_scoring), revision
    except ValueError as exc:
        raise SettingsError(f"{path.name}: {exc}") from None


@dataclass(frozen=True)
class LiveChange:
    """What one `LiveRouting.poll` saw: new settings in force (``error`` empty) or a file
    refused (``error`` says why; the settings in force did not change)."""

    settings: RouterSettings
    revision: int | None
    error: str = ""

    def record(self) -> dict[str, Any]:
        """The fields of its log line."""
        if self.error:
            return {"event": "live_routing_refused", "error": self.error}
        return {"event": "live_routing_applied", "revision": self.revision}


class LiveRouting:
    """The routing one model instance serves: the initial routing (``base``), or the file's
    once the launcher wrote one. ``check`` refuses settings this instance cannot serve
    (ValueError)."""

    def __init__(
        self,
        path: str,
        base: RouterSettings,
        check: Callable[[RouterSettings], None] = lambda settings: None,
    ) -> None:
        self.path = Path(path) if path else None
        self.base = base
        self.check = check
        self.settings = base
        self.revision: int | None = None
        self.error = ""  # why the file's content now is not in force ("" when it is)
        self._seen: tuple[int, int, int] | None = None
        self._lock = threading.Lock()  # the request path and the idle watch poll alike

    @property
    def routing(self) -> str:
        """`routing_digest` of the routing in force from the file; "" while the initial routing."""
        return "" if self.revision is None else routing_digest(self.settings)

    def poll(self) -> LiveChange | None:
        """Look at the file (one ``stat``); read it when it changed. None: nothing changed."""
        if self.path is None:
            return None
        with self._lock:
            return self._poll()

    def _poll(self) -> LiveChange | None:
        assert self.path is not None
        try:
            status = self.path.stat()
        except FileNotFoundError:
            return None  # never written, or the launcher's folder is gone: keep what runs
        except OSError as exc:  # reported once, until the file can be looked at again
            if self._seen == _UNREADABLE:
                return None
            return self._refused(_UNREADABLE, f"{self.path.name}: {exc}")
        seen = (status.st_ino, status.st_mtime_ns, status.st_size)
        if seen == self._seen:
            return None
        self._seen = seen
        try:
            settings, revision = read_routing_file(self.path, self.base)
            self.check(settings)
        except (OSError, ValueError) as exc:
            return self._refused(seen, str(exc))
        self.settings, self.revision, self.error = settings, revision, ""
        return LiveChange(settings, revision)

    def _refused(self, seen: tuple[int, int, int], error: str) -> LiveChange:
        self._seen, self.error = seen, error
        return LiveChange(self.settings, self.revision, error)


def write_entry_point(live: LiveRouting, model: str, instance: str) -> None:
    """Report, beside the routing file, what this process of ``model`` routes by now: the
    file's revision and routing digest (None and "": the initial routing), and why the file's
    content is not in force (``error``). Replaced atomically; nothing without a file."""
    if live.path is None:
        return
    folder = live.path.parent / ENTRY_POINTS_DIR
    folder.mkdir(mode=0o700, exist_ok=True)
    report = {
        "model": model,
        "instance": instance,
        "pid": os.getpid(),
        "revision": live.revision,
        "routing": live.routing,
        "error": live.error,
    }
    handle, temporary = tempfile.mkstemp(prefix=".report-", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(report, out, sort_keys=True)
        os.replace(temporary, folder / f"{model}.{os.getpid()}.json")
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def read_entry_points(routing_file: Path) -> dict[str, list[dict[str, Any]]]:
    """The reports of the entry-point processes alive now, by model (`write_entry_point`);
    a report of a process that is gone is removed, an unreadable one left out."""
    folder = routing_file.parent / ENTRY_POINTS_DIR
    found: dict[str, list[dict[str, Any]]] = {}
    try:
        paths = sorted(folder.glob("*.json"))
    except OSError:
        return found
    for path in paths:
        try:
            status = path.lstat()
            if not stat.S_ISREG(status.st_mode) or status.st_size > _MAX_REPORT_BYTES:
                continue
            report = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if not isinstance(report, dict) or not isinstance(report.get("pid"), int):
            continue
        if not _alive(report["pid"]):
            path.unlink(missing_ok=True)
            continue
        found.setdefault(str(report.get("model")), []).append(report)
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it routes nothing)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text.rpartition(")")[2].split()[:1] != ["Z"]
