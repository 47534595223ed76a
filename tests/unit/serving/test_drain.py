"""The entry points' drain gate (dispatch_service.serving.drain) over the `pb_utils` stand-in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from dispatch_contract import batched
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline.steps import FeatureEncoderStep
from dispatch_service.serving.drain import DRAIN_FILE_ENV, DrainGate
from dispatch_service.serving.fused_adapter import FusedDispatchAdapter
from dispatch_service.serving.step_adapters import TritonEncoderAdapter
from pb_stand_in import FakePbUtils, FakeRequest


def request(seed: int) -> FakeRequest:
    window = window_to_wire(generate_window(np.random.default_rng(seed), 4, 10))
    return FakeRequest(batched(window), f"r{seed}")


def test_the_gate_is_closed_only_once_its_file_exists(tmp_path: Path) -> None:
    flag = tmp_path / "draining"
    gate = DrainGate.from_environ({DRAIN_FILE_ENV: str(flag)})
    assert not gate.closed()
    flag.touch()
    assert gate.closed()
    assert not DrainGate.from_environ({}).closed()  # no file named: never closed


def test_the_encoder_refuses_new_windows_unavailable_while_draining(tmp_path: Path) -> None:
    """feature_encoder is where a window enters the `dispatch` ensembles: once the launcher
    closes the gate, each new request is refused UNAVAILABLE (retryable), unworked."""
    flag = tmp_path / "draining"
    adapter = TritonEncoderAdapter(FakePbUtils(), "feature_encoder", FeatureEncoderStep())
    adapter.drain_gate = DrainGate(str(flag))
    (served,) = adapter.execute([request(1)])
    assert not served.has_error()
    flag.touch()
    refused = adapter.execute([request(1), request(2)])
    assert [r.error().code() for r in refused] == ["UNAVAILABLE"] * 2
    assert "draining" in refused[0].error().message()


def test_dispatch_fused_refuses_new_windows_unavailable_while_draining(tmp_path: Path) -> None:
    flag = tmp_path / "draining"
    flag.touch()

    class Unreachable:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"a refused window was worked ({name})")

    adapter = FusedDispatchAdapter(FakePbUtils(), "dispatch_fused", Unreachable())  # type: ignore[arg-type]
    adapter.drain_gate = DrainGate(str(flag))
    refused = adapter.execute([request(3)])
    assert refused[0].error().code() == "UNAVAILABLE"
