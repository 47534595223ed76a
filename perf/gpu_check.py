"""GPU check: cpu profile vs gpu profile with CUDA shared memory vs gpu profile with copies.

Run through `perf/gpu_check.sh` (which fails fast without an NVIDIA GPU and bounds the run to
five minutes). Three configurations of the window entry point `dispatch`, one window size
(default 64 orders x 200 riders), and the feature-level entry point on the gpu server:

1. ``cpu``: the embedded Triton, `cpu` profile, plain gRPC (tensors copied into messages).
2. ``gpu + CUDA shm``: the `gpu` profile; the client's `GrpcShmTransport` with
   `CudaShmBackend` (inputs and outputs in CUDA IPC regions registered once), and
   perf_analyzer ``--shared-memory cuda`` for the load run.
3. ``gpu + copies``: the same `gpu` server, plain gRPC.
4. + 5. ``dispatch_features`` on the same `gpu` server, CUDA shm vs plain gRPC: the original
   design's zero-copy vs copy comparison. The same window encoded on the client as a
   co-located feature service would (`feature_inputs`: the server's encoder settings), the
   same `--input-data` file for both runs, perf_analyzer at concurrency 128 only
   (``--shared-memory cuda`` vs none). The report sets both rows beside the design's figures.

Which `gpu` server runs depends on the host, and the report says which:

- ``native``: a stock tritonserver with the onnxruntime backend (the NGC image's
  /opt/tritonserver, or ``--tritonserver``): `dispatch_model/configs/gpu.pbtxt` as shipped,
  Triton's ORT backend with the CUDA EP, ``KIND_GPU``.
- ``python-ort-cuda``: the embedded Triton has no onnxruntime backend, so dispatch_model
  stays a Python-backend model whose ONNX Runtime session uses the CUDA EP
  (``execution_provider: "cuda"``, onnxruntime-gpu; the load fails rather than run on the
  CPU). Its config is derived from `config.pbtxt` into a scratch repository (KIND_GPU; if
  the embedded build refuses a GPU instance for a Python model, KIND_CPU with the session
  still on GPU 0, noted in the report). This measures the GPU for the model step only;
  the encoder, router and resolver run on the CPU in every configuration.

Per `dispatch` configuration: latency p50/p99 of sequential requests from `DispatchClient`
(concurrency 1), throughput and p50/p99 from perf_analyzer at concurrency 128, and GPU memory
in use (nvidia-smi) after the runs. Each perf_analyzer run gets a share of the time left
(`pa_timeout`) so that all five fit the budget. Writes report.md and summary.json to --out.

The GPU monitor (`perf.gpu_monitor_check`) runs on the real NVML while the gpu server is
measured (observe-only, 1 s period: its CPU share and the GPUs' states), then drills the
device fallback on that server (every GPU marked unhealthy by synthetic readings -> L2 CPU
instances, answers checked -> healthy -> L0).

Modules: `perf.gpu_host` (GPUs, servers, the derived repository), `perf.gpu_measure` (the
measurements), `perf.gpu_report` (rows and report.md); this one runs them in order.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_client import DispatchClient
from dispatch_client.errors import DispatchError
from dispatch_client.shm import CudaShmBackend, GrpcShmTransport, ShmCapacity
from dispatch_client.transport import GrpcTransport, Transport
from dispatch_contract import (
    DISPATCH_ENSEMBLE_OUTPUTS,
    FEATURE_ENTRY_MODEL_NAME,
    FEATURE_ENTRY_OUTPUTS,
)
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.ops.child_process import ServerError
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from perf.gpu_host import (
    NATIVE_TRITONSERVER,
    NoGpuError,
    derived_repository,
    gpu_memory_mib,
    gpu_names,
    load_failure,
    native_tritonserver,
)
from perf.gpu_measure import (
    RESERVE_S,
    Tensors,
    assignments,
    c128_job,
    csv_name,
    feature_inputs,
    pa_request_count,
    pa_timeout,
    perf_analyzer_c128,
    sequential,
    window_inputs,
)
from perf.gpu_monitor_check import (
    DrillResult,
    OverheadResult,
    fallback_drill,
    render_monitor,
    run_overhead,
)
from perf.gpu_report import DESIGN_FIGURES, GPU_RUNS, GpuRun, Row, render, render_zero_copy
from perf.pa import SharedMemory, output_shm_size, write_input_data

__all__ = [
    "DESIGN_FIGURES",
    "GPU_RUNS",
    "NATIVE_TRITONSERVER",
    "OUTPUT_NAMES",
    "RESERVE_S",
    "GpuCheck",
    "GpuRun",
    "NoGpuError",
    "Row",
    "Tensors",
    "assignments",
    "c128_job",
    "csv_name",
    "derived_repository",
    "feature_inputs",
    "gpu_memory_mib",
    "gpu_names",
    "load_failure",
    "main",
    "native_tritonserver",
    "pa_request_count",
    "pa_timeout",
    "perf_analyzer_c128",
    "render",
    "render_zero_copy",
    "sequential",
    "window_inputs",
]

OUTPUT_NAMES = [spec.name for spec in DISPATCH_ENSEMBLE_OUTPUTS]
# What each measured entry point answers (the feature-level entry runs no encoder: no city).
OUTPUTS_OF = {
    "dispatch": OUTPUT_NAMES,
    FEATURE_ENTRY_MODEL_NAME: [spec.name for spec in FEATURE_ENTRY_OUTPUTS],
}


class GpuCheck:
    """One run: the window and its input files, the time left, and what the rows share (the
    cpu server's answer every row is checked against, perf_analyzer's request count)."""

    def __init__(self, args: argparse.Namespace, baseline: list[int]) -> None:
        self.args = args
        self.out: Path = args.out
        self.deadline = time.monotonic() + float(args.budget)
        self.baseline = baseline
        self.window = window_to_wire(
            generate_window(np.random.default_rng(4242), args.orders, args.riders)
        )
        # One --input-data file per entry point, each used by both of its runs (shm, copies).
        self.inputs: dict[str, Tensors] = {
            "dispatch": window_inputs(self.window),
            FEATURE_ENTRY_MODEL_NAME: feature_inputs(self.window),
        }
        self.input_files: dict[str, Path] = {}
        for model, tensors in self.inputs.items():
            self.input_files[model] = self.out / f"input-{model}.json"
            write_input_data(self.input_files[model], [tensors])
        self.capacity = ShmCapacity.for_window(self.window)
        self.native = native_tritonserver(args.tritonserver)
        self.summary: dict[str, Any] = {
            "gpus": gpu_names(),
            "gpu_memory_mib_before": baseline,
            "window": {"orders": args.orders, "riders": args.riders},
            "gpu_server": "native" if self.native else "python-ort-cuda",
        }
        self.rows: list[Row] = []
        self.cpu_assigned: NDArray[Any] | None = None  # the cpu server's ASSIGNED_RIDER_INDEX
        self.cpu_answer: dict[str, Any] | None = None
        self.pa_requests = 2000
        self.pa_runs_left = 1 + len(GPU_RUNS)
        self.monitored: list[OverheadResult] = []
        self.drill: DrillResult | None = None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    # ---- one row ----

    def measure(
        self,
        row: Row,
        server: TritonServer,
        make: Callable[[], Transport] | None,
        shared_memory: SharedMemory,
        model: str = "dispatch",
    ) -> NDArray[Any] | None:
        """Measure one row; returns the probe answer's ASSIGNED_RIDER_INDEX (None if none)."""
        self.pa_runs_left -= 1
        if self.left() < 30:
            row.notes.append("skipped: out of time")
            return None
        if make is not None and not self.one_caller(row, make):
            return None
        probe = GrpcTransport(server.grpc_url)
        try:  # perf_analyzer needs one region size for every output: the largest, with room
            answer_arrays = probe.infer(model, dict(self.inputs[model]), OUTPUTS_OF[model])
        except DispatchError as exc:
            row.notes.append(f"probe request failed: {exc.message[:300]}")
            return None
        finally:
            probe.close()
        assigned = answer_arrays["ASSIGNED_RIDER_INDEX"]
        if make is None and self.cpu_assigned is not None:
            row.same_assignment_as_cpu = bool(np.array_equal(assigned, self.cpu_assigned))
        shm = output_shm_size([answer_arrays])
        self.load_run(row, server, shared_memory=shared_memory, model=model, shm=shm)
        row.gpu_memory_mib = gpu_memory_mib()[0]
        return assigned

    def one_caller(self, row: Row, make: Callable[[], Transport]) -> bool:
        """Sequential requests through DispatchClient; False when the client failed."""
        try:
            with DispatchClient(make()) as client:
                row.p50_ms, row.p99_ms, row.requests, answer = sequential(
                    client, self.window, min(self.args.seconds, self.left() / 4)
                )
        except DispatchError as exc:
            row.notes.append(f"client failed: {exc.message[:300]}")
            return False
        if self.cpu_answer is None:
            self.cpu_answer = answer
        row.same_assignment_as_cpu = assignments(answer) == assignments(self.cpu_answer)
        self.pa_requests = pa_request_count(row.p50_ms, self.args.seconds)
        return True

    def load_run(
        self, row: Row, server: TritonServer, *, shared_memory: SharedMemory, model: str, shm: int
    ) -> None:
        """perf_analyzer at concurrency 128 for one row."""
        job = c128_job(
            server.grpc_url,
            self.input_files[model],
            self.out,
            csv_name(row.config, shared_memory),
            shared_memory,
            output_shm_size=shm,
            requests=self.pa_requests,
            model=model,
        )
        result = perf_analyzer_c128(job, timeout_s=pa_timeout(self.left(), self.pa_runs_left + 1))
        if isinstance(result, str):
            row.notes.append(result)
        else:
            row.c128_per_s, row.c128_p50_ms, row.c128_p99_ms = result

    # ---- the servers ----

    def cpu_profile(self) -> None:
        """1. the cpu profile, plain gRPC: the row every other one is checked against."""
        cpu_row = Row("cpu (plain gRPC)", "embedded, cpu profile")
        self.rows.append(cpu_row)
        # perf_analyzer's shm runs cannot send the shm key over gRPC: loopback servers, open.
        options = ServerOptions(ports=Ports.free(), unlocked_groups=("shared-memory",))
        try:
            log = self.out / "server-cpu.log"
            with TritonServer(TritonRuntime.from_venv(), options, log) as server:
                self.cpu_assigned = self.measure(
                    cpu_row, server, partial(GrpcTransport, server.grpc_url), "none"
                )
        except ServerError as exc:
            cpu_row.notes.append(f"server failed: {str(exc)[:300]}")
            self.pa_runs_left = len(GPU_RUNS)

    def gpu_attempts(self) -> list[tuple[str, TritonRuntime, Path]]:
        """The gpu servers to try, in order: native ORT, else the derived repositories."""
        if self.native is not None:
            runtime = TritonRuntime.from_install(self.native, Path(sys.prefix) / "bin")
            return [("native ORT backend, KIND_GPU", runtime, MODEL_REPOSITORY)]
        attempts = []
        for kind in ("KIND_GPU", "KIND_CPU"):
            repo = derived_repository(self.out / f"repository-{kind.lower()}", kind)
            label = f"embedded, Python-backend ORT with CUDA EP, {kind} instance"
            attempts.append((label, TritonRuntime.from_venv(), repo))
        return attempts

    def start_gpu_server(self, stack: ExitStack, rows: list[Row]) -> TritonServer | None:
        """The first gpu server that starts (its label on `rows`), or None."""
        for label, runtime, repo in self.gpu_attempts():
            if self.left() < 60:
                break
            options = ServerOptions(
                model_repository=repo,
                ports=Ports.free(),
                profile="gpu",
                unlocked_groups=("shared-memory",),
            )
            log = self.out / f"server-gpu-{len(self.summary.get('gpu_attempts', []))}.log"
            tried = self.summary.setdefault("gpu_attempts", [])
            try:
                server = stack.enter_context(TritonServer(runtime, options, log))
            except ServerError as exc:
                tried.append(f"{label}: {load_failure(log) or str(exc)[-300:]}")
                continue
            tried.append(f"{label}: started")
            for row in rows:
                row.server = label
            return server
        for row in rows:
            row.notes.append("no gpu server could start (see summary.json gpu_attempts)")
        return None

    def gpu_profile(self) -> None:
        """2-5. the gpu profile: dispatch, then dispatch_features, each with CUDA shm and with
        copies; then the fallback drill on the same server."""
        gpu_rows = [(run, Row(run.config, "")) for run in GPU_RUNS]
        self.rows += [row for _, row in gpu_rows]
        with ExitStack() as stack:
            server = self.start_gpu_server(stack, [row for _, row in gpu_rows])
            if server is None:
                return
            cuda_shm: str | None = None
            try:
                CudaShmBackend()
            except DispatchError as exc:
                cuda_shm = f"CUDA shm unavailable: {exc.message[:300]}"
            for run, row in gpu_rows:
                if run.shared_memory == "cuda" and cuda_shm is not None:
                    row.notes.append(cuda_shm)
                    self.pa_runs_left -= 1
                    continue
                make = self.transport(run, server.grpc_url)
                self.measure(row, server, make, run.shared_memory, run.model)
            if self.left() > 45:
                self.drill = fallback_drill(
                    server.http_url,
                    range(len(self.baseline)),
                    partial(self.score_one, server.grpc_url),
                    admin_key=server.admin_key,
                )

    def transport(self, run: GpuRun, url: str) -> Callable[[], Transport] | None:
        """How the row's one caller connects (None: the row has no sequential run)."""
        if run.sequential and run.shared_memory == "cuda":
            return partial(GrpcShmTransport, url, capacity=self.capacity, backend="cuda")
        if run.sequential:
            return partial(GrpcTransport, url)
        return None

    def score_one(self, url: str) -> str:
        with DispatchClient(GrpcTransport(url)) as client:
            orders = client.dispatch(self.window).to_json_dict()["orders"]
        levels = sorted({str(o.get("fallback_level")) for o in orders})
        return f"{len(orders)} orders answered, fallback levels {levels}"

    # ---- the run ----

    def run(self) -> None:
        self.cpu_profile()
        # The monitor on the real NVML, on its own thread while the gpu server is measured.
        watcher = threading.Thread(
            target=lambda: self.monitored.append(
                run_overhead(min(60.0, max(10.0, self.left() / 3)))
            ),
            daemon=True,
        )
        watcher.start()
        self.gpu_profile()
        watcher.join(timeout=max(1.0, self.left() - 5))

    def write(self) -> Path:
        """summary.json and report.md in the output folder; the report's path."""
        overhead = self.monitored[0] if self.monitored else None
        self.summary["gpu_monitor"] = {
            "overhead": None
            if overhead is None
            else {**asdict(overhead), "share_of_core": overhead.share_of_core},
            "drill": None if self.drill is None else asdict(self.drill),
        }
        self.summary["rows"] = [asdict(row) for row in self.rows]
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=2))
        monitor_lines = render_monitor(overhead, self.drill)
        report = self.out / "report.md"
        report.write_text(render(self.summary, self.rows) + "\n".join(monitor_lines))
        return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--orders", type=int, default=64)
    parser.add_argument("--riders", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=5.0, help="sequential run per config")
    parser.add_argument("--budget", type=float, default=270.0, help="seconds for everything")
    parser.add_argument("--tritonserver", type=Path, help="stock tritonserver with ORT backend")
    args = parser.parse_args(argv)
    try:
        baseline = gpu_memory_mib()
    except NoGpuError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    check = GpuCheck(args, baseline)
    check.run()
    print(check.write().read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
