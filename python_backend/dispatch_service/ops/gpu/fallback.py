"""Device-level fallback: which GPUs `dispatch_model` runs on, changed live through Triton's
repository API (`model_control.load_model` with a config override).

| level | when | what the controller loads |
| ----- | ---- | ------------------------- |
| L0 | every GPU serves | the model's own instance groups (as found at start) |
| L1 | some GPUs unhealthy | the same groups without the unhealthy GPUs |
| L2 | no GPU serves | `cpu_instances` CPU instances (ONNX Runtime on the CPU) |
| L3 | the CPU load failed | model unloaded: the rule-based dispatcher answers at once |

Each override starts from the configuration the model runs with now and changes only
``instance_group``, so versions, batching and parameters set by others (a canary deploy)
stay. A failed load leaves Triton serving the previous configuration (checked on 2.51): L1
failing goes on to L2, L2 failing to L3; a failed return to L0 is retried on the next step.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from dispatch_service.ops.gpu.settings import GpuMonitorSettings
from dispatch_service.ops.model_control import (
    ModelControlError,
    load_model,
    model_config,
    unload_model,
)

__all__ = [
    "DeviceLevel",
    "FallbackController",
    "Transition",
    "cpu_config",
    "instance_groups_for",
    "l1_config",
    "level_for",
]

logger = logging.getLogger(__name__)

Config = dict[str, Any]


class DeviceLevel(IntEnum):
    """Exported as dispatch_device_fallback_level."""

    L0_ALL_GPUS = 0
    L1_OTHER_GPUS = 1
    L2_CPU = 2
    L3_RULE_BASED = 3


def level_for(serving: frozenset[int], gpus: Sequence[int]) -> DeviceLevel:
    """The level the node's health asks for (before any load fails)."""
    if not gpus or serving >= set(gpus):
        return DeviceLevel.L0_ALL_GPUS
    return DeviceLevel.L1_OTHER_GPUS if serving & set(gpus) else DeviceLevel.L2_CPU


def instance_groups_for(
    base_groups: Sequence[Mapping[str, Any]],
    serving: frozenset[int],
    gpus: Sequence[int],
    settings: GpuMonitorSettings,
) -> list[Config]:
    """``instance_group`` of the model on the serving GPUs only (L1).

    KIND_GPU: each GPU group of the base keeps only its serving GPUs (a group without a
    ``gpus`` list covers every GPU); a group left without GPUs goes. Other groups stay.
    KIND_CPU (the cpu profile's stand-in): one CPU group ``<model>_gpu<i>`` per serving GPU.
    """
    if settings.l1_instance_kind == "KIND_CPU":
        return [
            {
                "name": f"{settings.model}_gpu{i}",
                "kind": "KIND_CPU",
                "count": settings.instances_per_gpu,
            }
            for i in sorted(serving & set(gpus))
        ]
    groups: list[Config] = []
    for group in base_groups:
        if group.get("kind") != "KIND_GPU":
            groups.append(dict(group))
            continue
        covered = [int(g) for g in (group.get("gpus") or gpus)]
        kept = [g for g in covered if g in serving]
        if kept:
            groups.append({**group, "gpus": kept})
    if not any(g.get("kind") == "KIND_GPU" for g in groups):
        raise ValueError(f"no GPU instance group of {settings.model} is left on {sorted(serving)}")
    return groups


def l1_config(
    current: Mapping[str, Any],
    base_groups: Sequence[Mapping[str, Any]],
    serving: frozenset[int],
    gpus: Sequence[int],
    settings: GpuMonitorSettings,
) -> Config:
    """The L1 override: `current` with instance groups on the serving GPUs only."""
    return {**current, "instance_group": instance_groups_for(base_groups, serving, gpus, settings)}


def cpu_config(current: Mapping[str, Any], settings: GpuMonitorSettings) -> Config:
    """The L2 override: `current` with CPU instances only (the native onnxruntime backend and
    the cpu profile's Python runner both run ONNX Runtime's CPU provider then)."""
    group = {"name": f"{settings.model}_cpu", "kind": "KIND_CPU", "count": settings.cpu_instances}
    config = {**current, "instance_group": [group]}
    parameters = dict(current.get("parameters") or {})
    if "execution_provider" in parameters:  # a Python-backend runner told to use CUDA
        parameters["execution_provider"] = {"string_value": "cpu"}
        config["parameters"] = parameters
    return config


@dataclass(frozen=True)
class Transition:
    """One change of level, for logs, metrics and tests."""

    level: DeviceLevel
    serving: tuple[int, ...]
    config: Config | None  # what was sent (None: an unload)
    seconds: float
    error: str | None = None  # the load failed; a later transition says where it went


class FallbackController:
    """Keeps `dispatch_model`'s instance groups in step with the GPUs' health."""

    def __init__(
        self,
        http_url: str,
        settings: GpuMonitorSettings,
        admin_key: str | None = None,
        timeout_s: float = 300.0,
        load: Callable[..., None] = load_model,
        read: Callable[..., dict[str, Any]] = model_config,
        unload: Callable[..., None] = unload_model,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.http_url = http_url
        self.settings = settings
        self.admin_key = admin_key
        self.timeout_s = timeout_s
        self._load, self._read, self._unload, self._clock = load, read, unload, clock
        self.base_groups: list[Config] | None = None
        self.level = DeviceLevel.L0_ALL_GPUS
        self.applied: frozenset[int] | None = None  # the serving set last applied
        self.transitions: list[Transition] = []
        self._known: Config | None = None  # the latest configuration read from the server

    def attach(self) -> None:
        """Remember the model's own instance groups (the L0 configuration)."""
        config = self._current()
        self.base_groups = [dict(g) for g in config.get("instance_group") or []]

    def _current(self) -> Config:
        """The model's configuration now; after an L3 unload, the last one read."""
        try:
            self._known = self._read(self.http_url, self.settings.model, self.timeout_s)
        except ModelControlError:
            if self._known is None or self.level is not DeviceLevel.L3_RULE_BASED:
                raise
        return dict(self._known)

    def reconcile(self, serving: frozenset[int], gpus: Sequence[int]) -> list[Transition]:
        """Load the configuration `serving` asks for, if it differs from the applied one."""
        if self.base_groups is None:
            self.attach()
        wanted = level_for(serving, gpus)
        key = frozenset(serving & set(gpus))
        if wanted is DeviceLevel.L0_ALL_GPUS and self.level is DeviceLevel.L0_ALL_GPUS:
            self.applied = key
            return []
        if self.applied == key and self.level >= wanted:
            return []  # done already (or already further down the chain)
        done: list[Transition] = []
        level = wanted
        while True:
            step = self._apply(level, key, gpus)
            done.append(step)
            if step.error is None or level is DeviceLevel.L0_ALL_GPUS:
                break
            if level is DeviceLevel.L3_RULE_BASED:
                break
            level = DeviceLevel(level + 1)
        last = done[-1]
        if last.error is None:
            self.level, self.applied = last.level, key
        self.transitions += done
        return done

    def _apply(
        self, level: DeviceLevel, serving: frozenset[int], gpus: Sequence[int]
    ) -> Transition:
        started = self._clock()
        config: Config | None = None
        try:
            if level is DeviceLevel.L3_RULE_BASED:
                self._unload(self.http_url, self.settings.model, self.admin_key, self.timeout_s)
            else:
                config = self._config(level, self._current(), serving, gpus)
                self._load(
                    self.http_url, self.settings.model, config, self.admin_key, self.timeout_s
                )
        except (ModelControlError, ValueError) as exc:
            step = Transition(
                level, tuple(sorted(serving)), config, self._clock() - started, str(exc)
            )
        else:
            step = Transition(level, tuple(sorted(serving)), config, self._clock() - started)
        record = {
            "event": "gpu_fallback_level",
            "model": self.settings.model,
            "level": f"L{int(level)}",
            "serving_gpus": list(step.serving),
            "seconds": round(step.seconds, 3),
            "instance_group": None if config is None else config.get("instance_group"),
        }
        if step.error is not None:
            record["error"] = step.error
        (logger.error if step.error else logger.warning)(json.dumps(record, sort_keys=True))
        return step

    def _config(
        self, level: DeviceLevel, current: Config, serving: frozenset[int], gpus: Sequence[int]
    ) -> Config:
        base = self.base_groups or []
        if level is DeviceLevel.L0_ALL_GPUS:
            return {**current, "instance_group": [dict(g) for g in base]}
        if level is DeviceLevel.L1_OTHER_GPUS:
            return l1_config(current, base, serving, gpus, self.settings)
        return cpu_config(current, self.settings)
