"""ONNX Runtime's CUDA EP inside the Python backend: chosen explicitly, never a quiet CPU run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnxruntime as ort
import pytest

from dispatch_service.core.settings import load_settings
from dispatch_service.pipeline.onnx_runner import (
    OnnxScorer,
    OrtSettings,
    check_providers,
    execution_providers,
)
from dispatch_service.serving.step_adapters import with_instance_device

HAS_CUDA_EP = "CUDAExecutionProvider" in ort.get_available_providers()


def test_cpu_stays_the_default() -> None:
    assert OrtSettings().execution_provider == "cpu"
    assert execution_providers(OrtSettings()) == ["CPUExecutionProvider"]


def test_the_provider_is_a_config_parameter() -> None:
    settings = load_settings(OrtSettings, {"execution_provider": "cuda", "cuda_device_id": "1"})
    assert (settings.execution_provider, settings.cuda_device_id) == ("cuda", 1)
    with pytest.raises(ValueError, match="execution_provider must be one of cpu, cuda"):
        OrtSettings(execution_provider="tpu")
    with pytest.raises(ValueError, match="cuda_device_id"):
        OrtSettings(cuda_device_id=-1)


def test_cuda_asks_for_its_device_and_a_grow_as_needed_arena(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    (provider,) = execution_providers(OrtSettings(execution_provider="cuda", cuda_device_id=2))
    assert provider == (
        "CUDAExecutionProvider",
        {"device_id": "2", "arena_extend_strategy": "kSameAsRequested"},
    )


@pytest.mark.skipif(HAS_CUDA_EP, reason="this onnxruntime has the CUDA EP")
def test_cuda_on_a_cpu_only_onnxruntime_fails_the_load(contract_model: Path) -> None:
    with pytest.raises(RuntimeError, match=r"needs CUDAExecutionProvider.*onnxruntime-gpu"):
        OnnxScorer(contract_model, OrtSettings(execution_provider="cuda"))


class Session:
    def __init__(self, providers: list[str]) -> None:
        self.providers = providers

    def get_providers(self) -> list[str]:
        return self.providers


def test_a_session_that_dropped_to_the_cpu_is_refused() -> None:
    cuda = OrtSettings(execution_provider="cuda")
    dropped: Any = Session(["CPUExecutionProvider"])
    with pytest.raises(RuntimeError, match="did not enable CUDAExecutionProvider"):
        check_providers(dropped, cuda)
    check_providers(Session(["CUDAExecutionProvider", "CPUExecutionProvider"]), cuda)  # type: ignore[arg-type]
    check_providers(Session(["CPUExecutionProvider"]), OrtSettings())  # type: ignore[arg-type]


def test_a_gpu_instance_runs_on_its_own_device() -> None:
    gpu = {"model_instance_kind": "GPU", "model_instance_device_id": "3"}
    assert with_instance_device({"execution_provider": "cuda"}, gpu) == {
        "execution_provider": "cuda",
        "cuda_device_id": "3",
    }
    pinned = {"cuda_device_id": "0"}
    assert with_instance_device(pinned, gpu) == pinned
    cpu = {"model_instance_kind": "CPU", "model_instance_device_id": "0"}
    assert with_instance_device({}, cpu) == {}
