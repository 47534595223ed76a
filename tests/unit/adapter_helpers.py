"""Stand-in steps and requests for the Triton adapter tests (tests/unit/serving)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import batched, pack_window
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.window import window_to_tensors
from dispatch_service.offline.simulator import generate_window
from pb_stand_in import FakePbUtils, FakeRequest

__all__ = ["EchoStep", "echo_request", "json_lines", "logical_window", "window_request"]


class EchoStep:
    """Doubles X; raises on a marker value so tests can pick which request fails."""

    input_names: ClassVar[tuple[str, ...]] = ("X",)

    def __init__(self) -> None:
        self.calls = 0

    def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> dict[str, NDArray[Any]]:
        self.calls += 1
        x = inputs["X"]
        if x is None:
            raise DispatchInputError("X", "is required but missing", "missing")
        if (x < 0).any():
            raise DispatchInputError("X", f"must be >= 0 (row {int(np.argmax(x < 0))})", "range")
        if (x == 13).any():
            raise RuntimeError("unlucky number")
        return {"Y": x * 2, "N": np.array([x.size], dtype=np.int64)}


def echo_request(value: int, request_id: str = "") -> FakeRequest:
    # one "window" per request: the batch dimension of 1 every window-level model gets
    return FakeRequest({"X": np.array([[value, value + 1]])}, request_id)


def json_lines(pb: FakePbUtils, level: str) -> list[dict[str, Any]]:
    return [json.loads(line) for lvl, line in pb.Logger.lines if lvl == level]


def logical_window(seed: int) -> dict[str, NDArray[Any]]:
    return dict(window_to_tensors(generate_window(np.random.default_rng(seed), 4, 10)))


def window_request(
    seed: int,
    request_id: str = "",
    wire: dict[str, NDArray[Any]] | None = None,
    **changes: NDArray[Any],
) -> FakeRequest:
    """A v2 request (batch of 1) of a simulated window, with fields changed before packing
    (by WINDOW_INPUTS name) and wire tensors replaced after."""
    tensors = logical_window(seed)
    tensors.update(changes)
    packed = {**pack_window(tensors), **(wire or {})}
    return FakeRequest(batched(packed), request_id)
