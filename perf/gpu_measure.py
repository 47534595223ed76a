"""The GPU check's measurements: one caller's latency through `DispatchClient`, the
requests each entry point is sent, and perf_analyzer at concurrency 128.

Used by `perf.gpu_check` (see its docstring for the runs).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_client import DispatchClient
from dispatch_contract import FEATURE_ENTRY_INPUTS, FEATURE_ENTRY_MODEL_NAME
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import ENCODER_MODEL, model_layout
from dispatch_service.core.settings import load_settings
from dispatch_service.domain.cities import CitySettings
from dispatch_service.domain.features import EncoderSettings, encode_window
from dispatch_service.domain.window_wire import window_from_wire
from perf.pa import PaJob, SharedMemory
from perf.windows import NEUTRAL_OPTIONAL_INPUTS, optional_inputs

__all__ = [
    "RESERVE_S",
    "Tensors",
    "assignments",
    "c128_job",
    "csv_name",
    "feature_inputs",
    "pa_request_count",
    "pa_timeout",
    "perf_analyzer_c128",
    "sequential",
    "window_inputs",
]

Tensors = dict[str, NDArray[Any]]
# Seconds kept back for the fallback drill, the report and stopping the servers.
RESERVE_S = 45.0


def sequential(
    client: DispatchClient, window: Tensors, seconds: float, limit: int = 5000
) -> tuple[float, float, int, dict[str, Any]]:
    """(p50 ms, p99 ms, requests, last answer) of back-to-back requests."""
    answer = client.dispatch(window).to_json_dict()
    for _ in range(20):  # warm-up
        client.dispatch(window)
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(latencies) < limit:
        started = time.perf_counter()
        client.dispatch(window)
        latencies.append(time.perf_counter() - started)
    p50, p99 = np.percentile(np.asarray(latencies) * 1000.0, [50, 99])
    return float(p50), float(p99), len(latencies), answer


def assignments(answer: dict[str, Any]) -> list[Any]:
    return [order["assigned_rider_id"] for order in answer["orders"]]


def window_inputs(window: Tensors, model: str = "dispatch") -> Tensors:
    """The window with every optional input of `model` at its neutral value.

    perf_analyzer's shared-memory mode cannot leave an optional input out, and both runs of
    a comparison must send the same requests.
    """
    names = [n for n in optional_inputs(model=model) if n in NEUTRAL_OPTIONAL_INPUTS]
    return {**window, **{n: NEUTRAL_OPTIONAL_INPUTS[n].copy() for n in names}}


def feature_inputs(window: Tensors) -> Tensors:
    """What a co-located feature service sends `dispatch_features` for this window.

    The pair features come from the server's own encoder code with the settings of
    `feature_encoder/config.pbtxt`, so `dispatch_features` answers as `dispatch` does.
    """
    parameters = config_parameters(model_layout(MODEL_REPOSITORY, ENCODER_MODEL).config)
    located = window_from_wire(window)
    city = load_settings(CitySettings, parameters).registry().locate(located)
    pairs = encode_window(located, city, load_settings(EncoderSettings, parameters))
    tensors: Tensors = {
        "PAIR_FEATURES": pairs.pair_features,
        "CANDIDATE_RIDER_INDEX": pairs.candidate_rider_index,
    }
    for spec in FEATURE_ENTRY_INPUTS:  # the window's own (ORDER_FIELDS: stack-aware)
        if spec.name not in tensors and spec.name in window:
            tensors[spec.name] = window[spec.name]
    return window_inputs(tensors, FEATURE_ENTRY_MODEL_NAME)


def pa_request_count(p50_ms: float | None, seconds: float, cap: int = 10000) -> int:
    """Requests for one concurrency-128 run: ~8x what one caller did in `seconds`, bounded."""
    if not p50_ms:
        return 2000
    return int(min(cap, max(1000, 8 * 1000.0 / p50_ms * seconds)))


def pa_timeout(left_s: float, runs_left: int, reserve_s: float = RESERVE_S) -> float:
    """Seconds for the next perf_analyzer run: an even share of what is left, 20..60 s."""
    share = (left_s - reserve_s) / max(1, runs_left)
    return max(20.0, min(60.0, share))


def csv_name(config: str, shared_memory: SharedMemory) -> str:
    """perf_analyzer's CSV name for a row: `cpu`, `gpu-shm`, `dispatch_features`, ..."""
    return config.split()[0].rstrip(",") + ("-shm" if shared_memory != "none" else "")


def c128_job(
    url: str,
    input_data: Path,
    out: Path,
    name: str,
    shared_memory: SharedMemory,
    *,
    output_shm_size: int,
    requests: int,
    model: str = "dispatch",
) -> PaJob:
    """The perf_analyzer job at concurrency 128 for one row."""
    return PaJob(
        url=url,
        protocol="grpc",
        input_data=input_data,
        concurrency=128,
        request_count=max(requests, 128),
        csv_path=out / f"pa-{name}.csv",
        model=model,
        shared_memory=shared_memory,
        output_shm_size=output_shm_size if shared_memory != "none" else None,
    )


def perf_analyzer_c128(job: PaJob, timeout_s: float) -> tuple[float, float, float] | str:
    """(infer/s, p50 ms, p99 ms) at concurrency 128, or the reason it failed."""
    from perf.pa import PerfAnalyzer

    outcome = PerfAnalyzer.from_venv().run(job, timeout_s=timeout_s)
    if not outcome.ok:
        return f"perf_analyzer failed ({outcome.returncode}): {outcome.log_tail[-300:]}"
    row = outcome.rows[0]
    return row.throughput_per_s, row.p50_ms, row.p99_ms
