"""Settings of the GPU monitor and the device-level fallback, parsed into one typed object.

The monitor runs in the launcher, not in a Triton model, so its settings arrive as
``KEY=VALUE`` strings on the launcher's command line (``--gpu-monitor KEY=VALUE``); they are
parsed and checked like a model's config.pbtxt ``parameters`` (`core.settings`): an unknown
key or a bad value fails at start.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Final

from dispatch_service.core.settings import load_settings, reject_unknown

__all__ = ["INSTANCE_KINDS", "GpuMonitorSettings"]

INSTANCE_KINDS: Final = ("KIND_GPU", "KIND_CPU")


@dataclass(frozen=True)
class GpuMonitorSettings:
    """Thresholds, the trip and recovery rules, and what the fallback loads.

    Defaults follow the original design (section 4.3): a sample is over threshold when
    utilisation > 95 %, memory > 92 % and temperature > 85 degC hold together, when the
    uncorrected ECC count rose, when a CUDA context cannot be created, or when NVML cannot
    read the device; 3 consecutive such samples mark the GPU unhealthy.
    """

    sample_period_s: float = 1.0
    utilization_percent: float = 95.0
    memory_percent: float = 92.0
    temperature_c: float = 85.0
    trip_samples: int = 3  # consecutive samples over threshold that mark a GPU unhealthy
    # Hysteresis: an unhealthy GPU counts as clear only below the thresholds minus these
    # margins, and returns to service after `restore_after_s` of clear samples in a row.
    recovery_margin_percent: float = 5.0
    recovery_margin_c: float = 5.0
    restore_after_s: float = 60.0
    # CUDA context probe (a child process creates one per GPU); 0 = never probe.
    context_probe_period_s: float = 30.0
    context_probe_timeout_s: float = 10.0
    # The fallback: which model, whether to act at all (False: observe and export only).
    model: str = "dispatch_model"
    act: bool = True
    instances_per_gpu: int = 1
    cpu_instances: int = 2  # L2: CPU instances of the model when no GPU is healthy
    # L3 (the CPU load failed): the router's per-call timeout while the model stays on the
    # broken GPUs, so the rule-based dispatcher answers within a request's deadline.
    l3_bls_timeout_ms: int = 100
    retry_after_s: float = 30.0  # a failed change is tried again after this long
    # KIND_GPU: L1 keeps the model's GPU instance groups, minus unhealthy GPUs. KIND_CPU:
    # each healthy GPU stands as `instances_per_gpu` CPU instances named <model>_gpu<i>
    # (the cpu profile's stand-in, so the whole chain runs against a live CPU server).
    l1_instance_kind: str = "KIND_GPU"
    # Prometheus endpoint of the monitor (its own port; 0 = none).
    metrics_port: int = 8004  # 8003 is the launcher's health port
    metrics_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        for name in (
            "sample_period_s",
            "utilization_percent",
            "memory_percent",
            "temperature_c",
            "restore_after_s",
            "context_probe_timeout_s",
            "retry_after_s",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("recovery_margin_percent", "recovery_margin_c", "context_probe_period_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("trip_samples", "instances_per_gpu", "cpu_instances", "l3_bls_timeout_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"metrics_port must be within [0, 65535], got {self.metrics_port}")
        if self.l1_instance_kind not in INSTANCE_KINDS:
            raise ValueError(
                f"l1_instance_kind must be one of {', '.join(INSTANCE_KINDS)}, "
                f"got {self.l1_instance_kind!r}"
            )
        if not self.model or "/" in self.model:
            raise ValueError(f"model must be a model name, got {self.model!r}")

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> GpuMonitorSettings:
        """Parse string parameters; an unknown key or a bad value raises SettingsError."""
        reject_unknown(parameters, cls)
        return load_settings(cls, parameters)

    @classmethod
    def from_pairs(cls, pairs: list[str] | None) -> GpuMonitorSettings:
        """Parse ``KEY=VALUE`` strings (the launcher's ``--gpu-monitor`` options)."""
        parameters: dict[str, str] = {}
        for pair in pairs or ():
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise ValueError(f"--gpu-monitor takes KEY=VALUE, got {pair!r}")
            parameters[key.strip()] = value.strip()
        return cls.from_parameters(parameters)

    def to_parameters(self) -> dict[str, str]:
        return {name: str(value) for name, value in asdict(self).items()}
