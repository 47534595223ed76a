"""What the monitor exports, as one immutable value read under its lock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dispatch_service.ops.gpu.fallback import DeviceLevel
from dispatch_service.ops.gpu.health import GpuHealth

__all__ = ["MonitorSnapshot", "SnapshotSource"]


@dataclass(frozen=True)
class MonitorSnapshot:
    """What the exporter reads, taken under the monitor's lock."""

    gpu_count: int  # 0: no GPU (or not sampled yet)
    gpus: tuple[GpuHealth, ...]
    level: DeviceLevel
    transitions: dict[int, int]  # level -> successful transitions into it
    sample_seconds: float  # CPU time of the latest round (the monitor's thread)
    rounds: int = 0
    cpu_seconds_total: float = 0.0  # CPU time of every round so far


class SnapshotSource(Protocol):
    def snapshot(self) -> MonitorSnapshot: ...
