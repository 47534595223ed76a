"""The entry points' live routing (`routing.live`): the file the launcher names in the
server's environment, looked at once per `execute` and, while the instance is idle, every
`IDLE_POLL_S`; each change logged and reported beside the file (`write_entry_point`), so
the launcher and ``dispatch-admin status`` see what every entry-point process routes by now.

The path comes from the environment, not a config parameter: a config override in a load
request must not be able to point routing at a file of its choosing.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any, Final

from dispatch_service.routing.live import ROUTING_FILE_ENV, LiveRouting, write_entry_point
from dispatch_service.routing.settings import RouterSettings
from dispatch_service.serving.backend_log import log_event

__all__ = ["IDLE_POLL_S", "follow_live_routing", "live_routing_file"]

# An idle instance looks at the file this often: it routes its next window by the new
# routing either way, and says so within this time.
IDLE_POLL_S: Final = 0.25
_watched: dict[int, threading.Thread] = {}  # id(LiveRouting) -> its idle watch
_watched_lock = threading.Lock()


def live_routing_file(environ: Mapping[str, str] | None = None) -> str:
    """The file the launcher writes the live routing to; "" on a server without one (the
    initial routing is served)."""
    return (os.environ if environ is None else environ).get(ROUTING_FILE_ENV, "")


def follow_live_routing(pb_utils: Any, live: LiveRouting, **context: Any) -> RouterSettings:
    """The routing in force for this `execute`; a change or a refused file logged once and
    reported. The first call also starts the instance's idle watch."""
    _look(pb_utils, live, context)
    if live.path is not None and id(live) not in _watched:
        _watch(pb_utils, live, context)
    return live.settings


def _look(pb_utils: Any, live: LiveRouting, context: Mapping[str, Any]) -> None:
    change = live.poll()
    first = id(live) not in _watched
    if change is not None:
        log_event(pb_utils, "warn" if change.error else "info", **change.record(), **context)
    if change is not None or first:
        try:
            write_entry_point(live, str(context.get("model", "")), str(context.get("instance", "")))
        except OSError as exc:  # the launcher's folder is gone: it stopped with this server
            log_event(pb_utils, "warn", event="live_routing_unreported", error=str(exc), **context)


def _watch(pb_utils: Any, live: LiveRouting, context: Mapping[str, Any]) -> None:
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(IDLE_POLL_S):
            try:
                _look(pb_utils, live, context)
            except Exception as exc:  # the watch never takes the instance down
                log_event(pb_utils, "warn", event="live_routing_watch_error", error=str(exc))

    thread = threading.Thread(target=run, name="live-routing", daemon=True)
    with _watched_lock:
        if id(live) in _watched:
            return
        _watched[id(live)] = thread
    thread.start()
