"""Request priority and deadline: which queue a window waits in, and for how long at most.

Every window-level model has three priority levels with a bounded queue each
(`docs/operations.md`): 1 priority orders and premium tenants, 2 standard (Triton's default),
3 bulk re-dispatch, shed first under overload. `PriorityMap` is the tenant-to-level map a
caller keeps in a small JSON file::

    {"default": 2, "tenants": {"premium-co": 1, "redispatch-batch": 3}}

A window's level is the most urgent of its orders' levels: an order whose tenant
(`ORDER_USER_IDS`) maps to 1, or that carries the PRIORITY constraint bit, makes the whole
window level 1. A deadline is the caller's own queue timeout (`allow_timeout_override`): a
window still queued when it expires is refused at once with UNAVAILABLE.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike

from dispatch_contract import OrderConstraint
from dispatch_contract.keys import PRIORITY_KEY_HEADER

__all__ = [
    "BULK",
    "MAX_DEADLINE_MS",
    "PREMIUM",
    "PRIORITY_LEVELS",
    "STANDARD",
    "PriorityMap",
    "check_deadline_ms",
    "check_priority",
    "request_options",
]

PREMIUM: Final = 1
STANDARD: Final = 2
BULK: Final = 3
PRIORITY_LEVELS: Final = (PREMIUM, STANDARD, BULK)
# Longer than any sane dispatch decision; a typo (seconds for milliseconds) is refused.
MAX_DEADLINE_MS: Final = 60_000.0


def check_priority(level: int, what: str = "priority") -> int:
    """`level` if it is one of the served levels; ValueError naming `what` otherwise."""
    if isinstance(level, bool) or not isinstance(level, int | np.integer):
        raise ValueError(f"{what} must be an integer level 1, 2 or 3, got {level!r}")
    if int(level) not in PRIORITY_LEVELS:
        raise ValueError(
            f"{what} must be 1 (priority/premium), 2 (standard) or 3 (bulk), got {level}"
        )
    return int(level)


def check_deadline_ms(value: float | None) -> float | None:
    """A deadline in milliseconds, (0, 60000]; None means the server's default timeout."""
    if value is None:
        return None
    deadline = float(value)
    if not np.isfinite(deadline) or not 0.0 < deadline <= MAX_DEADLINE_MS:
        raise ValueError(
            f"deadline_ms must be within (0, {MAX_DEADLINE_MS:g}] milliseconds, got {value!r}"
        )
    return deadline


@dataclass(frozen=True)
class PriorityMap:
    """Tenant (user id) -> priority level; `default` for every tenant not listed."""

    default: int = STANDARD
    tenants: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_priority(self.default, "default")
        for tenant, level in self.tenants.items():
            check_priority(level, f"tenants[{tenant!r}]")

    @classmethod
    def from_dict(cls, data: Any) -> PriorityMap:
        if not isinstance(data, dict):
            raise ValueError("a priority map must be a JSON object")
        unknown = sorted(set(data) - {"default", "tenants"})
        if unknown:
            raise ValueError(f"unknown priority map key(s) {', '.join(unknown)}")
        tenants = data.get("tenants", {})
        if not isinstance(tenants, dict):
            raise ValueError("tenants must be an object of tenant id -> level")
        return cls(default=data.get("default", STANDARD), tenants=dict(tenants))

    @classmethod
    def from_file(cls, path: str | Path) -> PriorityMap:
        """Read the JSON map; ValueError naming the file for anything malformed."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            return cls.from_dict(data)
        except (OSError, ValueError) as exc:
            raise ValueError(f"priority map {path}: {exc}") from exc

    def level_of(self, window: Mapping[str, ArrayLike]) -> int:
        """The most urgent level among the window's orders (its tenants and PRIORITY bits)."""
        users = window.get("ORDER_USER_IDS")
        levels = [
            self.tenants.get(
                user.decode("utf-8", "replace") if isinstance(user, bytes) else str(user),
                self.default,
            )
            for user in ([] if users is None else np.asarray(users, dtype=object).ravel())
        ]
        level = min(levels, default=self.default)
        constraints = window.get("ORDER_CONSTRAINTS")
        if constraints is not None:
            bits = np.asarray(constraints).astype(np.int64, copy=False)
            if (bits & int(OrderConstraint.PRIORITY)).any():
                level = PREMIUM
        return level


def request_options(
    priority: int = 0, timeout_us: int = 0, priority_key: str = ""
) -> dict[str, Any]:
    """tritonclient's `infer` keywords for a priority, a queue timeout and the priority key
    (a header, `dispatch_contract.keys`), only those set (0 leaves the model's default level
    and timeout)."""
    options: dict[str, Any] = {}
    if priority:
        options["priority"] = priority
    if timeout_us:
        options["timeout"] = timeout_us
    if priority_key:
        options["headers"] = {PRIORITY_KEY_HEADER: priority_key}
    return options
