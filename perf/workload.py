"""The windows a benchmark sends, encoded once per entry point, and how answers are checked.

Split from `perf.bench` so that `perf.tuning` and `perf.run_perf_analyzer` reuse it.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from perf.bodies import (
    RequestBody,
    decode_triton_json_answer,
    fastapi_arrays_body,
    fastapi_window_body,
    triton_json_body,
)
from perf.pa import output_shm_size, write_input_data
from perf.windows import (
    FIRST_SEED,
    Tensors,
    WindowSize,
    simulated_windows,
)

__all__ = [
    "Workload",
    "check_answer",
    "post_body",
    "prepare_workload",
    "triton_json_answer",
]


# ---- workloads -------------------------------------------------------------------------------


@dataclass
class Workload:
    """One window size: its windows, their in-process answers and the files made from them."""

    size: WindowSize
    windows: list[Tensors]
    answers: list[Tensors]
    input_data: Path
    input_data_bytes: int
    output_shm_size: int
    bodies: dict[str, list[RequestBody]] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "orders": self.size.orders,
            "riders": self.size.riders,
            "count": self.size.count,
            "first_seed": FIRST_SEED,
            "input_data_bytes": self.input_data_bytes,
            "output_shm_size": self.output_shm_size,
        }


def prepare_workload(
    size: WindowSize, pipeline: DispatchPipeline, out: Path, optional: Sequence[str]
) -> Workload:
    """Windows with the `optional` inputs set to neutral values, answered in process."""
    windows = simulated_windows(size, optional)
    answers = [pipeline.run(window) for window in windows]
    data = out / f"input_{size.name}.json"
    return Workload(
        size=size,
        windows=windows,
        answers=answers,
        input_data=data,
        input_data_bytes=write_input_data(data, windows),
        output_shm_size=output_shm_size(answers),
        bodies={
            "http_json": [triton_json_body(w) for w in windows],
            "fastapi_json": [fastapi_window_body(w) for w in windows],
            "fastapi_arrays": [fastapi_arrays_body(w) for w in windows],
        },
    )


def check_answer(expected: Mapping[str, NDArray[Any]], got: Mapping[str, NDArray[Any]]) -> str:
    """'' when `got` decides like `expected` (same Top-K riders, same assignment)."""
    for name in ("TOPK_RIDER_INDEX", "ASSIGNED_RIDER_INDEX"):
        if name not in got:
            return f"{name} missing"
        if not np.array_equal(np.asarray(expected[name]), np.asarray(got[name])):
            return f"{name} differs from the in-process pipeline"
    if not np.allclose(expected["TOPK_OBJECTIVES"], got["TOPK_OBJECTIVES"], rtol=1e-4, atol=1e-6):
        return "TOPK_OBJECTIVES differs from the in-process pipeline"
    return ""


def post_body(url: str, body: RequestBody, timeout_s: float = 60.0) -> bytes:
    request = urllib.request.Request(url, data=body.data, headers=body.headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return bytes(response.read())


def triton_json_answer(url: str, body: RequestBody) -> Tensors:
    """One window's answer, without the batch dimension of 1 (contract v2)."""
    return {
        name: value[0] for name, value in decode_triton_json_answer(post_body(url, body)).items()
    }
