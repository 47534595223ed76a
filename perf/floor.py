"""The serving floor of the contract: what Triton costs per window when the model does nothing.

`dispatch_floor` is a Python-backend model with `dispatch_fused`'s config (contract v2
inputs and outputs, ragged dynamic batching, queue policies, 2 instances) whose `execute`
reads every input of every request and answers zeros of the right shapes. Measured with
perf_analyzer over gRPC on the same small windows as the bench, it is the ceiling any entry
point of this contract can reach on this host: the rest of the gap is the pipeline's work.

With `--overload-seconds S` (as `make bench` runs it) the floor also takes the bench's three
overload runs (`perf.overload.BENCH_RUNS`: 64 callers, 512, 512 with mixed priorities), so the
report shows what this host allows a model that does nothing: on 2 cores shared with the
load generator, the refusal storm of 512 closed-loop callers takes the CPU whatever the model
does (docs/operations.md).

`python -m perf.floor [--seconds 3] [--overload-seconds 0]` prints the figures (JSON); a
repository copy with the floor model added is made in a temporary folder and removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

from dispatch_service.core.model_config import read_model_config, write_model_config
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import FUSED_MODEL, model_layout
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from perf.overload import run_bench_runs
from perf.pa import PaJob
from perf.sessions import TritonSession
from perf.stats import request_budget
from perf.windows import SIZES, optional_inputs
from perf.workload import prepare_workload

__all__ = [
    "FLOOR_MODEL",
    "FLOOR_MODEL_PY",
    "floor_job",
    "floor_repository",
    "main",
    "measure_floor",
]

FLOOR_MODEL: Final = "dispatch_floor"
FLOOR_MODEL_PY: Final = '''"""No work: read every input, answer zeros (perf.floor)."""

import numpy as np
import triton_python_backend_utils as pb_utils

K = 5


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            orders = 0
            for tensor in request.inputs():
                array = tensor.as_numpy()
                if tensor.name() == "ORDER_IDS":
                    orders = array.shape[1]
            shapes = {
                "TOPK_RIDER_INDEX": ((1, orders, K), np.int32),
                "TOPK_OBJECTIVES": ((1, orders, K, 4), np.float32),
                "ASSIGNED_RIDER_INDEX": ((1, orders), np.int32),
                "ASSIGNED_SCORE": ((1, orders), np.float32),
                "ASSIGNED_OBJECTIVES": ((1, orders, 3), np.float32),
                "ORDER_MODEL_VERSION": ((1, orders), np.int32),
                "ORDER_FALLBACK_LEVEL": ((1, orders), np.int32),
            }
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor(n, np.zeros(s, d)) for n, (s, d) in shapes.items()]
                )
            )
        return responses
'''


def floor_repository(target: Path, source: Path = MODEL_REPOSITORY) -> Path:
    """A copy of `source` with `dispatch_floor` added (dispatch_fused's config, no work)."""
    shutil.copytree(source, target)
    config = read_model_config(model_layout(source, FUSED_MODEL).config)
    config.name = FLOOR_MODEL
    config.ClearField("parameters")  # the fused model's settings: the floor reads none
    config.ClearField("model_warmup")  # its warm-up files stay with dispatch_fused
    floor = model_layout(target, FLOOR_MODEL)
    floor.version(1).mkdir(parents=True)
    write_model_config(floor.config, config)
    floor.python_model(1).write_text(FLOOR_MODEL_PY)
    return target


def floor_job(
    grpc_url: str, input_data: Path, concurrency: int, *, request_count: int, csv_path: Path
) -> PaJob:
    """perf_analyzer on `dispatch_floor` over gRPC, as every floor figure is measured."""
    return PaJob(
        url=grpc_url,
        protocol="grpc",
        input_data=input_data,
        concurrency=concurrency,
        request_count=request_count,
        csv_path=csv_path,
        model=FLOOR_MODEL,
    )


def measure_floor(
    seconds: float, work: Path, overload_seconds: float = 0.0, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """p50 at concurrency 1 and windows/s at concurrency 64, small windows, gRPC; with
    `overload_seconds` > 0 also the bench's overload runs (under "overload", label -> summary)."""
    # The throwaway repository goes to a temporary folder, not the report: its model.py
    # would otherwise sit among the project's modules (and their public-surface test).
    work.mkdir(parents=True, exist_ok=True)  # the inputs and the server log stay in the report
    with tempfile.TemporaryDirectory(prefix="dispatch-floor-") as scratch:
        repository = floor_repository(Path(scratch) / "repo")
        return _measure(seconds, work, repository, overload_seconds, say)


def _measure(
    seconds: float,
    work: Path,
    repository: Path,
    overload_seconds: float,
    say: Callable[[str], None],
) -> dict[str, Any]:
    pipeline = DispatchPipeline.from_repository(repository)
    workload = prepare_workload(SIZES["small"], pipeline, work, optional_inputs(repository))
    figures: dict[str, Any] = {"model": FLOOR_MODEL, "size": "small (1 x 20)", "protocol": "grpc"}
    with TritonSession(repository, work / "server.log") as session:
        rate = 2000.0
        for concurrency in (1, 64):
            job = floor_job(
                session.endpoints.grpc,
                workload.input_data,
                concurrency,
                request_count=request_budget(rate, seconds, concurrency),
                csv_path=work / f"floor_c{concurrency}.csv",
            )
            outcome = session.pa.run(job, 120)
            if not outcome.ok:  # once more: the bench's report must show the floor
                figures[f"c{concurrency}_first_attempt"] = f"failed: {outcome.log_tail[-300:]}"
                outcome = session.pa.run(job, 120)
            if not outcome.ok:
                figures[f"c{concurrency}"] = f"failed: {outcome.log_tail[-300:]}"
                continue
            row = outcome.rows[0]
            rate = row.throughput_per_s
            figures[f"c{concurrency}"] = row.to_dict()
        if overload_seconds > 0:
            figures["overload"] = run_bench_runs(
                session.endpoints.grpc, FLOOR_MODEL, overload_seconds, say
            )
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per level")
    parser.add_argument(
        "--overload-seconds", type=float, default=0.0, help="per overload run; 0: none"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dispatch-floor-") as tmp:
        figures = measure_floor(args.seconds, Path(tmp), args.overload_seconds, _to_stderr)
        print(json.dumps(figures, indent=2))
    return 0


def _to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
