"""Measured figures, whichever tool produced them, and how they are summarised."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = [
    "LevelStats",
    "LimitStats",
    "level_stats",
    "request_budget",
]


@dataclass(frozen=True)
class LevelStats:
    """Closed-loop load at one concurrency: windows (requests) per second and latency."""

    concurrency: int
    throughput_per_s: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    requests: int = 0
    errors: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LevelStats:
        return cls(
            concurrency=int(data["concurrency"]),
            throughput_per_s=float(data["throughput_per_s"]),
            p50_ms=float(data["p50_ms"]),
            p90_ms=float(data["p90_ms"]),
            p95_ms=float(data["p95_ms"]),
            p99_ms=float(data["p99_ms"]),
            requests=int(data.get("requests", 0)),
            errors=int(data.get("errors", 0)),
        )


def level_stats(
    concurrency: int, latencies_s: Sequence[float], elapsed_s: float, errors: int = 0
) -> LevelStats:
    """Summarise successful request latencies (seconds) measured over `elapsed_s`."""
    if not latencies_s or elapsed_s <= 0:
        raise ValueError("need at least one successful request and a positive duration")
    p50, p90, p95, p99 = np.percentile(np.asarray(latencies_s) * 1000.0, [50, 90, 95, 99])
    return LevelStats(
        concurrency=concurrency,
        throughput_per_s=len(latencies_s) / elapsed_s,
        p50_ms=float(p50),
        p90_ms=float(p90),
        p95_ms=float(p95),
        p99_ms=float(p99),
        requests=len(latencies_s),
        errors=errors,
    )


def request_budget(
    rate_per_s: float, seconds: float, concurrency: int, floor: int = 30, ceiling: int = 5000
) -> int:
    """Requests for one level: about `seconds` at the expected rate, bounded both ways.

    At least 4 per concurrent stream so every stream is measured in steady state.
    """
    wanted = int(rate_per_s * seconds) if rate_per_s > 0 else floor
    return max(floor, 4 * concurrency, min(ceiling, wanted))


@dataclass(frozen=True)
class LimitStats:
    size: str
    orders: int
    single: LevelStats  # one thread; concurrency 1
    processes: int
    multi_windows_per_s: float  # `processes` worker processes together

    @property
    def single_orders_per_s(self) -> float:
        return self.single.throughput_per_s * self.orders

    @property
    def multi_orders_per_s(self) -> float:
        return self.multi_windows_per_s * self.orders

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "single": self.single.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LimitStats:
        return cls(
            size=str(data["size"]),
            orders=int(data["orders"]),
            single=LevelStats.from_dict(data["single"]),
            processes=int(data["processes"]),
            multi_windows_per_s=float(data["multi_windows_per_s"]),
        )
