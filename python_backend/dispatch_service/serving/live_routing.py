"""The entry points' live routing (`routing.live`): the file the launcher names in the
server's environment, looked at once per `execute`, each change logged.

The path comes from the environment, not a config parameter: a config override in a load
request must not be able to point routing at a file of its choosing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from dispatch_service.routing.live import ROUTING_FILE_ENV, LiveRouting
from dispatch_service.routing.settings import RouterSettings
from dispatch_service.serving.backend_log import log_event

__all__ = ["follow_live_routing", "live_routing_file"]


def live_routing_file(environ: Mapping[str, str] | None = None) -> str:
    """The file the launcher writes the live routing to; "" on a server without one (the
    config's routing is served)."""
    return (os.environ if environ is None else environ).get(ROUTING_FILE_ENV, "")


def follow_live_routing(pb_utils: Any, live: LiveRouting, **context: Any) -> RouterSettings:
    """The routing in force for this `execute`; a change or a refused file logged once."""
    change = live.poll()
    if change is not None:
        log_event(pb_utils, "warn" if change.error else "info", **change.record(), **context)
    return live.settings
