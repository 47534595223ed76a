"""Synthetic GPU readings and a stand-in of Triton's repository API for the GPU monitor's
unit tests (tests/unit/ops/test_gpu_*.py)."""

from __future__ import annotations

import copy
import json
from typing import Any

from dispatch_service.ops.gpu.fallback import FallbackController
from dispatch_service.ops.gpu.sampling import GpuSample
from dispatch_service.ops.gpu.settings import GpuMonitorSettings
from dispatch_service.ops.model_control import ModelControlError
from dispatch_service.routing.settings import RouterSettings

__all__ = [
    "GIB",
    "GPU_CONFIG",
    "GPU_GROUP",
    "Clock",
    "FakeRepository",
    "FakeRouter",
    "calm",
    "hot",
]

GIB = 1 << 30


def calm(index: int = 0, ecc: int | None = 0) -> GpuSample:
    return GpuSample(index, f"GPU-{index}", 40.0, 8 * GIB, 80 * GIB, 60.0, ecc, True)


def hot(index: int = 0, temperature: float = 90.0) -> GpuSample:
    """Utilisation 99 %, memory 95 % and the given temperature: the design's throttle rule."""
    used = int(0.95 * 80 * GIB)
    return GpuSample(index, f"GPU-{index}", 99.0, used, 80 * GIB, temperature, 0, True)


# dispatch_model on the gpu profile (configs/gpu.pbtxt) as Triton's config endpoint returns
# it on a node with two GPUs: no `gpus` in the file, so Triton lists every visible one.
GPU_GROUP = {
    "name": "dispatch_model",
    "kind": "KIND_GPU",
    "count": 1,
    "gpus": [0, 1],
    "secondary_devices": [],
    "profile": [],
    "passive": False,
    "host_policy": "",
}
GPU_CONFIG: dict[str, Any] = {
    "name": "dispatch_model",
    "backend": "onnxruntime",
    "max_batch_size": 32768,
    "version_policy": {"specific": {"versions": [1, 2]}},
    "instance_group": [GPU_GROUP],
    "parameters": {"gpu_mem_limit": {"string_value": "1073741824"}},
}


class FakeRepository:
    """Answers model_config / load_model / unload_model like Triton: a refused load keeps the
    old configuration."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config: dict[str, Any] | None = copy.deepcopy(config)
        self.sent: list[tuple[str, str | None]] = []  # (action, config JSON)
        self.refuse: set[str] = set()  # instance kinds whose load fails
        self.router = FakeRouter()

    def read(self, url: str, model: str, timeout_s: float) -> dict[str, Any]:
        if self.config is None:
            raise ModelControlError("HTTP 400: Request for unknown model", 400)
        return copy.deepcopy(self.config)

    def load(
        self, url: str, model: str, config: dict[str, Any], key: Any, timeout_s: float
    ) -> None:
        self.sent.append(("load", json.dumps(config, sort_keys=True)))
        kinds = {g["kind"] for g in config["instance_group"]}
        if kinds & self.refuse:
            raise ModelControlError("HTTP 400: failed to load 'dispatch_model'", 400)
        self.config = copy.deepcopy(config)

    def controller(
        self, settings: GpuMonitorSettings | None = None, clock: Clock | None = None
    ) -> FallbackController:
        return FallbackController(
            "127.0.0.1:8000",
            settings or GpuMonitorSettings(),
            "k",
            load=self.load,
            read=self.read,
            router=self.router,
            clock=clock or Clock(),
        )


class FakeRouter:
    """dispatch_router's settings, read and replaced like router_control does."""

    def __init__(self) -> None:
        self.settings = RouterSettings(stable_version=1, canary_version=2)
        self.applied: list[RouterSettings] = []

    def read(self) -> RouterSettings:
        return self.settings

    def apply(self, settings: RouterSettings) -> None:
        self.applied.append(settings)
        self.settings = settings


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
