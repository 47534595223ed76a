"""What a model's stub process says and seals about itself: its JSON log lines, and its
shared-memory region made unreachable by name.

`pb_utils` is passed in because it only exists inside the backend stub.
"""

from __future__ import annotations

import json
from typing import Any

from dispatch_service.core.backend_shm import seal_own_region
from dispatch_service.core.log_text import describe_error

__all__ = ["log_event", "seal_backend_region"]


def log_event(pb_utils: Any, level: str, **fields: Any) -> None:
    """One JSON log line through Triton's logger (never with request payload)."""
    line = json.dumps(fields, sort_keys=True, default=str)
    getattr(pb_utils.Logger, f"log_{level}")(line)


def seal_backend_region(pb_utils: Any, model_name: str) -> None:
    """Make this stub's shared-memory region unreachable by name (`core.backend_shm`); the
    first thing every adapter's construction from Triton's args does. A failure is logged,
    never fails the load."""
    try:
        seal_own_region()
    except OSError as exc:
        log_event(
            pb_utils,
            "warn",
            event="shm_region_not_sealed",
            model=model_name,
            error=describe_error(exc),
        )
