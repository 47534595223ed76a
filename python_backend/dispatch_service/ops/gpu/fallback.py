"""Device-level fallback: which GPUs `dispatch_model` runs on, changed live through Triton's
repository API (`model_control.load_model` with a config override).

| level | when | what the controller loads |
| ----- | ---- | ------------------------- |
| L0 | every GPU serves | the model's own instance groups (as found at start) |
| L1 | some GPUs unhealthy | the same groups without the unhealthy GPUs |
| L2 | no GPU serves | `cpu_instances` CPU instances; the router's `cpu_scoring` 1 |
| L3 | the CPU load failed | the router's timeout cut: the rule-based dispatcher answers |

Each override starts from the configuration the model runs with now and changes only
``instance_group``, so versions, batching and parameters set by others (a canary deploy)
stay. A failed load leaves Triton serving the previous configuration (checked on 2.51): L1
failing goes on to L2, L2 failing to L3; a failed change is tried again after
``retry_after_s``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Protocol

from dispatch_service.ops.gpu.settings import GpuMonitorSettings
from dispatch_service.ops.model_control import ModelControlError, load_model, model_config
from dispatch_service.routing.settings import RouterSettings

__all__ = [
    "DeviceLevel",
    "FallbackController",
    "LiveRouter",
    "RouterHook",
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


class RouterHook(Protocol):
    """Reads and changes dispatch_router's settings (live: `router_control`)."""

    def read(self) -> RouterSettings: ...

    def apply(self, settings: RouterSettings) -> None: ...


@dataclass(frozen=True)
class LiveRouter:
    """`RouterHook` over the repository API of a running server."""

    http_url: str
    admin_key: str | None = None
    timeout_s: float = 120.0

    # router_control imports the routing engine (numpy, SciPy): only when L3 needs it, so
    # the launcher's import stays light.
    def read(self) -> RouterSettings:
        from dispatch_service.ops.router_control import read_router_settings

        return read_router_settings(self.http_url, self.admin_key, self.timeout_s)

    def apply(self, settings: RouterSettings) -> None:
        from dispatch_service.ops.router_control import apply_router_settings

        apply_router_settings(self.http_url, settings, self.admin_key, self.timeout_s)


@dataclass(frozen=True)
class Transition:
    """One change of level, for logs, metrics and tests."""

    level: DeviceLevel
    serving: tuple[int, ...]
    config: Config | None  # the model configuration sent (None: only the router changed)
    seconds: float
    error: str | None = None  # the change failed; a later transition says where it went
    router: RouterSettings | None = None  # dispatch_router's settings after this change


class FallbackController:
    """Keeps `dispatch_model`'s instance groups in step with the GPUs' health.

    A change that fails (and the chain below it) is tried again after ``retry_after_s``,
    not on every round.
    """

    def __init__(
        self,
        http_url: str,
        settings: GpuMonitorSettings,
        admin_key: str | None = None,
        *,
        timeout_s: float = 300.0,
        load: Callable[..., None] = load_model,
        read: Callable[..., dict[str, Any]] = model_config,
        router: RouterHook | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.http_url = http_url
        self.settings = settings
        self.admin_key = admin_key
        self.timeout_s = timeout_s
        self._load, self._read, self._clock = load, read, clock
        self.router = router or LiveRouter(http_url, admin_key)
        self.base_groups: list[Config] | None = None
        self.level = DeviceLevel.L0_ALL_GPUS
        self.applied: frozenset[int] | None = None  # the serving set last applied
        self.transitions: list[Transition] = []
        self._router_timeout_before: int | None = None  # the router's timeout before L3
        self._failed: tuple[frozenset[int], float] | None = None  # (serving, retry at)

    def attach(self) -> None:
        """Remember the model's own instance groups (the L0 configuration)."""
        config = self._read(self.http_url, self.settings.model, self.timeout_s)
        self.base_groups = [dict(g) for g in config.get("instance_group") or []]

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
        if self._failed is not None and self._failed[0] == key and self._clock() < self._failed[1]:
            return []  # failed a moment ago: wait before trying again
        done: list[Transition] = []
        level = wanted
        while True:
            step = self._apply(level, key, gpus)
            done.append(step)
            if step.error is None or level in (DeviceLevel.L0_ALL_GPUS, DeviceLevel.L3_RULE_BASED):
                break
            level = DeviceLevel(level + 1)
        last = done[-1]
        if last.error is None:
            self.level, self.applied, self._failed = last.level, key, None
            if last.level is not DeviceLevel.L3_RULE_BASED:  # L3 set the router already
                router = self._sync_router(last.level, key)
                if router is not None:
                    done.append(router)
        else:
            self._failed = (key, self._clock() + self.settings.retry_after_s)
        self.transitions += done
        return done

    def _apply(
        self, level: DeviceLevel, serving: frozenset[int], gpus: Sequence[int]
    ) -> Transition:
        started = self._clock()
        config: Config | None = None
        router: RouterSettings | None = None
        error: str | None = None
        try:
            if level is DeviceLevel.L3_RULE_BASED:
                router = self._router_for(level)
            else:
                current = self._read(self.http_url, self.settings.model, self.timeout_s)
                config = self._config(level, current, serving, gpus)
                self._load(
                    self.http_url, self.settings.model, config, self.admin_key, self.timeout_s
                )
        except (ModelControlError, ValueError) as exc:
            error = str(exc)
        step = Transition(
            level, tuple(sorted(serving)), config, self._clock() - started, error, router
        )
        self._log(step)
        return step

    def _router_for(self, level: DeviceLevel) -> RouterSettings:
        """Bring dispatch_router's settings in line with `level`; returns what it runs with.

        L2: ``cpu_scoring`` 1, so the orders scored on CPU instances report
        ORDER_FALLBACK_LEVEL 3. L3: the CPU load failed and the model still sits on the
        broken GPUs, so ``bls_timeout_ms`` drops to ``l3_bls_timeout_ms``: a call waits at
        most that before the rule-based dispatcher answers, well within a request's
        deadline (the model stays loaded: unloading it would make a strict-readiness server
        report not ready). Other levels: both back as they were. Only these two fields
        change; a canary set meanwhile stays.
        """
        now = self.router.read()
        if level is DeviceLevel.L3_RULE_BASED:
            if self._router_timeout_before is None:
                self._router_timeout_before = now.bls_timeout_ms
            timeout_ms = min(now.bls_timeout_ms, self.settings.l3_bls_timeout_ms)
        else:
            timeout_ms = self._router_timeout_before or now.bls_timeout_ms
        wanted = dataclasses.replace(
            now, bls_timeout_ms=timeout_ms, cpu_scoring=int(level is DeviceLevel.L2_CPU)
        )
        if wanted != now:
            self.router.apply(wanted)
        if level is not DeviceLevel.L3_RULE_BASED:
            self._router_timeout_before = None
        return wanted

    def _sync_router(self, level: DeviceLevel, serving: frozenset[int]) -> Transition | None:
        """`_router_for` after a model configuration loaded; a step only when it failed or
        changed something. A failure is logged; the model's level stands."""
        started = self._clock()
        try:
            before = self.router.read()
            router = self._router_for(level)
        except (ModelControlError, ValueError) as exc:
            step = Transition(
                level, tuple(sorted(serving)), None, self._clock() - started,
                f"updating dispatch_router failed: {exc}",
            )  # fmt: skip
            self._log(step)
            return step
        if router == before:
            return None
        step = Transition(
            level, tuple(sorted(serving)), None, self._clock() - started, None, router
        )
        self._log(step)
        return step

    def _log(self, step: Transition) -> None:
        record: dict[str, Any] = {
            "event": "gpu_fallback_level",
            "model": self.settings.model,
            "level": f"L{int(step.level)}",
            "serving_gpus": list(step.serving),
            "seconds": round(step.seconds, 3),
            "instance_group": None if step.config is None else step.config.get("instance_group"),
        }
        if step.router is not None:
            record["router_bls_timeout_ms"] = step.router.bls_timeout_ms
            record["router_cpu_scoring"] = step.router.cpu_scoring
        if step.error is not None:
            record["error"] = step.error
        (logger.error if step.error else logger.warning)(json.dumps(record, sort_keys=True))

    def _config(
        self, level: DeviceLevel, current: Config, serving: frozenset[int], gpus: Sequence[int]
    ) -> Config:
        base = self.base_groups or []
        if level is DeviceLevel.L0_ALL_GPUS:
            return {**current, "instance_group": [dict(g) for g in base]}
        if level is DeviceLevel.L1_OTHER_GPUS:
            return l1_config(current, base, serving, gpus, self.settings)
        return cpu_config(current, self.settings)
