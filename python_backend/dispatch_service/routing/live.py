"""Routing changed live through one file the launcher writes and every entry point reads.

A fleet replica's launcher (`ops.fleet_apply`) writes the routing of the state it serves to
the file named by ``DISPATCH_ROUTING_FILE`` in the server's environment (a folder only the
launcher's user can write), after the versions that routing names are loaded and only after
the signed state verified. `dispatch_router`, `dispatch_fused` and `dispatch_priority` look at
the file once per `execute` (one ``stat``) and route every window after it by its settings: a
routing change reloads no model. The file sets every `RouterSettings` field but
``cpu_scoring``, which stays the model config's (the GPU monitor sets it, `ops.gpu`). Without
the file, the model config's routing is served, as on a server without a fleet state.

A file that cannot be read or breaks a rule is not used: the routing read last stays in force
(`LiveRouting.poll` reports the refusal once per content).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final

from dispatch_service.core.settings import SettingsError
from dispatch_service.routing.settings import RouterSettings

__all__ = [
    "LIVE_ROUTING_FIELDS",
    "ROUTING_FILE_ENV",
    "LiveChange",
    "LiveRouting",
    "read_routing_file",
    "write_routing_file",
]

ROUTING_FILE_ENV: Final = "DISPATCH_ROUTING_FILE"
# The fields the file sets; ``cpu_scoring`` is each node's own (the model config's).
LIVE_ROUTING_FIELDS: Final = tuple(
    f.name for f in fields(RouterSettings) if f.name != "cpu_scoring"
)
_MAX_FILE_BYTES: Final = 1 << 20
_FILE_FORMAT: Final = "dispatch-live-routing/1"
_UNREADABLE: Final = (-1, -1, -1)  # `LiveRouting._seen` while the file cannot be looked at


def write_routing_file(path: Path, settings: RouterSettings, revision: int) -> None:
    """Replace the file at ``path`` with ``settings``' routing, atomically (a reader sees the
    old file or the new one, never a part); mode 0600."""
    parameters = settings.to_parameters()
    document = {
        "format": _FILE_FORMAT,
        "revision": revision,
        "parameters": {name: parameters[name] for name in LIVE_ROUTING_FIELDS},
    }
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
    with path.open("rb") as handle:
        data = handle.read(_MAX_FILE_BYTES + 1)
    if len(data) > _MAX_FILE_BYTES:
        raise SettingsError(f"{path.name}: larger than {_MAX_FILE_BYTES} bytes")
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise SettingsError(f"{path.name}: not JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != _FILE_FORMAT:
        raise SettingsError(f"{path.name}: format must be {_FILE_FORMAT!r}")
    revision, parameters = document.get("revision"), document.get("parameters")
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 0:
        raise SettingsError(f"{path.name}: revision must be an int >= 0, got {revision!r}")
    if not isinstance(parameters, dict) or set(parameters) != set(LIVE_ROUTING_FIELDS):
        raise SettingsError(f"{path.name}: parameters must set exactly {LIVE_ROUTING_FIELDS}")
    if not all(isinstance(value, str) for value in parameters.values()):
        raise SettingsError(f"{path.name}: parameters must be strings")
    try:
        settings = RouterSettings.from_parameters({**base.to_parameters(), **parameters})
    except ValueError as exc:  # SettingsError included
        raise SettingsError(f"{path.name}: {exc}") from None
    return settings, revision


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
    """The routing one model instance serves: its config's (``base``), or the file's once the
    launcher wrote one. ``check`` refuses settings this instance cannot serve (ValueError)."""

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
        self._seen: tuple[int, int, int] | None = None

    def poll(self) -> LiveChange | None:
        """Look at the file (one ``stat``); read it when it changed. None: nothing changed."""
        if self.path is None:
            return None
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
        self.settings, self.revision = settings, revision
        return LiveChange(settings, revision)

    def _refused(self, seen: tuple[int, int, int], error: str) -> LiveChange:
        self._seen = seen
        return LiveChange(self.settings, self.revision, error)
