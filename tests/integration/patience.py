"""Deadlines for the integration tests' waits, scaled to the host.

A test asserts outcomes (readiness came back, the reload happened, nothing failed after the
heal), never how fast they came: each wait polls for its outcome against a deadline that only
bounds how long the test may run. The deadlines are generous and scaled to the host: by the
load average per core when the test starts waiting (a busy 2-core host gets more time, up to
`MAX_LOAD_FACTOR` times), and by ``TEST_PATIENCE`` (a factor, default 1) for slower machines
still.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["MAX_LOAD_FACTOR", "patience", "wait_for"]

MAX_LOAD_FACTOR = 4.0  # a hung server still fails in bounded time


def patience(seconds: float) -> float:
    """``seconds`` scaled to the host: at least ``seconds``, more on a loaded machine."""
    cores = os.cpu_count() or 1
    load = min(MAX_LOAD_FACTOR, max(1.0, os.getloadavg()[0] / cores))
    return seconds * load * max(1.0, float(os.environ.get("TEST_PATIENCE", "1")))


def wait_for(check: Callable[[], object], what: str, within_s: float, every_s: float = 0.1) -> None:
    """Poll ``check`` until it is true; fail naming ``what`` after ``patience(within_s)``."""
    limit = patience(within_s)
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {limit:.0f} s (a bound on the test only): {what}")
        time.sleep(every_s)
