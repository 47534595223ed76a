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
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
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
    FEATURE_ENTRY_INPUTS,
    FEATURE_ENTRY_MODEL_NAME,
)
from dispatch_service.core.model_config import (
    CONFIG_NAME,
    config_parameters,
    read_model_config,
    write_model_config,
)
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.settings import load_settings
from dispatch_service.domain.cities import CitySettings
from dispatch_service.domain.features import EncoderSettings, encode_window
from dispatch_service.domain.window import window_from_wire, window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.ops.server import (
    Ports,
    ServerError,
    ServerOptions,
    TritonRuntime,
    TritonServer,
)
from perf.gpu_monitor_check import (
    DrillResult,
    OverheadResult,
    fallback_drill,
    render_monitor,
    run_overhead,
)
from perf.pa import PaJob, SharedMemory
from perf.windows import NEUTRAL_OPTIONAL_INPUTS, optional_inputs

__all__ = [
    "DESIGN_FIGURES",
    "GPU_RUNS",
    "NATIVE_TRITONSERVER",
    "OUTPUT_NAMES",
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

NATIVE_TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")
OUTPUT_NAMES = [spec.name for spec in DISPATCH_ENSEMBLE_OUTPUTS]
Tensors = dict[str, NDArray[Any]]


class NoGpuError(RuntimeError):
    pass


@dataclass(frozen=True)
class GpuRun:
    """One measurement on the gpu server: which entry point, over what, and how."""

    config: str  # the report's row label
    model: str  # the entry point perf_analyzer loads
    shared_memory: SharedMemory  # perf_analyzer --shared-memory (and the c=1 transport)
    sequential: bool  # also latency of one caller through DispatchClient (dispatch only)


# The gpu server's runs, in order. The window entry point first (as before), then the
# feature-level entry point: the original design's zero-copy vs copy comparison.
GPU_RUNS: tuple[GpuRun, ...] = (
    GpuRun("gpu + CUDA shm", "dispatch", "cuda", True),
    GpuRun("gpu + copies (plain gRPC)", "dispatch", "none", True),
    GpuRun(f"{FEATURE_ENTRY_MODEL_NAME}, gpu + CUDA shm", FEATURE_ENTRY_MODEL_NAME, "cuda", False),
    GpuRun(
        f"{FEATURE_ENTRY_MODEL_NAME}, gpu + copies (plain gRPC)",
        FEATURE_ENTRY_MODEL_NAME,
        "none",
        False,
    ),
)

# The original design's table (GPU inference at concurrency 128, its Go service on ORT):
# (label, average latency ms, QPS). Quoted as the design's figures, not measured here.
DESIGN_FIGURES: tuple[tuple[str, float, float], ...] = (
    ("original design: zero-copy", 3.8, 2890.0),
    ("original design: memcpy", 8.1, 1940.0),
)

# Seconds kept back for the fallback drill, the report and stopping the servers.
RESERVE_S = 45.0


@dataclass
class Row:
    config: str
    server: str
    p50_ms: float | None = None
    p99_ms: float | None = None
    requests: int = 0
    c128_per_s: float | None = None
    c128_p50_ms: float | None = None
    c128_p99_ms: float | None = None
    gpu_memory_mib: int | None = None
    same_assignment_as_cpu: bool | None = None
    notes: list[str] = field(default_factory=list)


# ---- host ------------------------------------------------------------------------------------


def gpu_memory_mib() -> list[int]:
    """Memory in use per GPU (nvidia-smi); raises NoGpuError without a usable GPU."""
    if shutil.which("nvidia-smi") is None:
        raise NoGpuError("no NVIDIA GPU: nvidia-smi not found")
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    values = [int(v) for v in done.stdout.split() if v.strip().isdigit()]
    if done.returncode != 0 or not values:
        raise NoGpuError(f"no NVIDIA GPU: nvidia-smi failed ({done.stderr.strip()[:200]})")
    return values


def gpu_names() -> str:
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return "; ".join(line.strip() for line in done.stdout.splitlines() if line.strip())


def native_tritonserver(given: Path | None) -> Path | None:
    """A tritonserver that has the onnxruntime backend next to it, if any."""
    for candidate in (given, NATIVE_TRITONSERVER):
        if candidate is not None and candidate.exists():
            runtime = TritonRuntime.from_install(candidate, Path(sys.prefix) / "bin")
            if (runtime.backend_dir / "onnxruntime").is_dir():
                return candidate
    return None


def derived_repository(target: Path, kind: str) -> Path:
    """The model repository with dispatch_model's `gpu` config = its `cpu` config on CUDA."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for folder in MODEL_REPOSITORY.iterdir():
        if folder.is_dir() and folder.name != "dispatch_model":
            (target / folder.name).symlink_to(folder.resolve(), target_is_directory=True)
    source = MODEL_REPOSITORY / "dispatch_model"
    model = target / "dispatch_model"
    model.mkdir()
    for entry in source.iterdir():
        if entry.name != "configs":
            (model / entry.name).symlink_to(entry.resolve())
    config = read_model_config(source / CONFIG_NAME)
    del config.instance_group[:]
    group = config.instance_group.add()
    group.count = 1
    group.kind = group.Kind.Value(kind)
    config.parameters["execution_provider"].string_value = "cuda"
    (model / "configs").mkdir()
    write_model_config(model / "configs" / "gpu.pbtxt", config)
    return target


def load_failure(log: Path) -> str:
    """The server log's first model-load failure, on one line (why a gpu server did not start)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        if "failed to load '" in line and "version" in line:
            return line.split("] ", 1)[-1].split("\\n", 1)[0][:400]
    return ""


# ---- measurements ----------------------------------------------------------------------------


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
    parameters = config_parameters(MODEL_REPOSITORY / "feature_encoder" / CONFIG_NAME)
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


# ---- the run ---------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--orders", type=int, default=64)
    parser.add_argument("--riders", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=5.0, help="sequential run per config")
    parser.add_argument("--budget", type=float, default=270.0, help="seconds for everything")
    parser.add_argument("--tritonserver", type=Path, help="stock tritonserver with ORT backend")
    args = parser.parse_args(argv)
    deadline = time.monotonic() + float(args.budget)

    try:
        baseline = gpu_memory_mib()
    except NoGpuError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    window = window_to_wire(generate_window(np.random.default_rng(4242), args.orders, args.riders))
    from perf.pa import output_shm_size, write_input_data

    # One --input-data file per entry point, each used by both of its runs (shm and copies).
    inputs: dict[str, Tensors] = {
        "dispatch": window_inputs(window),
        FEATURE_ENTRY_MODEL_NAME: feature_inputs(window),
    }
    input_files: dict[str, Path] = {}
    for model, tensors in inputs.items():
        input_files[model] = args.out / f"input-{model}.json"
        write_input_data(input_files[model], [tensors])
    capacity = ShmCapacity.for_window(window)

    native = native_tritonserver(args.tritonserver)
    summary: dict[str, Any] = {
        "gpus": gpu_names(),
        "gpu_memory_mib_before": baseline,
        "window": {"orders": args.orders, "riders": args.riders},
        "gpu_server": "native" if native else "python-ort-cuda",
    }
    rows: list[Row] = []
    cpu_assigned: NDArray[Any] | None = None  # the cpu server's ASSIGNED_RIDER_IDS
    cpu_answer: dict[str, Any] | None = None
    pa_requests = 2000
    pa_runs_left = 1 + len(GPU_RUNS)

    def left() -> float:
        return deadline - time.monotonic()

    def measure(
        row: Row,
        server: TritonServer,
        make: Callable[[], Transport] | None,
        shared_memory: SharedMemory,
        model: str = "dispatch",
    ) -> NDArray[Any] | None:
        """Measure one row; returns the probe answer's ASSIGNED_RIDER_IDS (None if none)."""
        nonlocal cpu_answer, pa_requests, pa_runs_left
        pa_runs_left -= 1
        if left() < 30:
            row.notes.append("skipped: out of time")
            return None
        if make is not None:
            try:
                with DispatchClient(make()) as client:
                    row.p50_ms, row.p99_ms, row.requests, answer = sequential(
                        client, window, min(args.seconds, left() / 4)
                    )
            except DispatchError as exc:
                row.notes.append(f"client failed: {exc.message[:300]}")
                return None
            if cpu_answer is None:
                cpu_answer = answer
            row.same_assignment_as_cpu = assignments(answer) == assignments(cpu_answer)
            pa_requests = pa_request_count(row.p50_ms, args.seconds)
        probe = GrpcTransport(server.grpc_url)
        try:  # perf_analyzer needs one region size for every output: the largest, with room
            answer_arrays = probe.infer(model, dict(inputs[model]), OUTPUT_NAMES)
        except DispatchError as exc:
            row.notes.append(f"probe request failed: {exc.message[:300]}")
            return None
        finally:
            probe.close()
        assigned = answer_arrays["ASSIGNED_RIDER_IDS"]
        if make is None and cpu_assigned is not None:
            row.same_assignment_as_cpu = bool(np.array_equal(assigned, cpu_assigned))
        job = c128_job(
            server.grpc_url,
            input_files[model],
            args.out,
            csv_name(row.config, shared_memory),
            shared_memory,
            output_shm_size([answer_arrays]),
            pa_requests,
            model=model,
        )
        result = perf_analyzer_c128(job, timeout_s=pa_timeout(left(), pa_runs_left + 1))
        if isinstance(result, str):
            row.notes.append(result)
        else:
            row.c128_per_s, row.c128_p50_ms, row.c128_p99_ms = result
        row.gpu_memory_mib = gpu_memory_mib()[0]
        return assigned

    # 1. cpu profile
    cpu_row = Row("cpu (plain gRPC)", "embedded, cpu profile")
    rows.append(cpu_row)
    cpu_runtime = TritonRuntime.from_venv()
    # perf_analyzer's shm runs cannot send the shm key over gRPC: loopback servers, left open.
    cpu_options = ServerOptions(ports=Ports.free(), unlocked_groups=("shared-memory",))
    try:
        with TritonServer(cpu_runtime, cpu_options, args.out / "server-cpu.log") as server:
            cpu_assigned = measure(cpu_row, server, partial(GrpcTransport, server.grpc_url), "none")
    except ServerError as exc:
        cpu_row.notes.append(f"server failed: {str(exc)[:300]}")
        pa_runs_left = len(GPU_RUNS)

    # The monitor on the real NVML, on its own thread while the gpu server is measured.
    monitored: list[OverheadResult] = []
    watcher = threading.Thread(
        target=lambda: monitored.append(run_overhead(min(60.0, max(10.0, left() / 3)))),
        daemon=True,
    )
    watcher.start()
    drill: DrillResult | None = None

    # 2-5. gpu profile: dispatch, then dispatch_features, each with CUDA shm and with copies
    gpu_rows = [(run, Row(run.config, "")) for run in GPU_RUNS]
    rows += [row for _, row in gpu_rows]
    with ExitStack() as stack:
        gpu_server: TritonServer | None = None
        attempts: list[tuple[str, TritonRuntime, Path]] = []
        if native is not None:
            runtime = TritonRuntime.from_install(native, Path(sys.prefix) / "bin")
            attempts.append(("native ORT backend, KIND_GPU", runtime, MODEL_REPOSITORY))
        else:
            for kind in ("KIND_GPU", "KIND_CPU"):
                repo = derived_repository(args.out / f"repository-{kind.lower()}", kind)
                label = f"embedded, Python-backend ORT with CUDA EP, {kind} instance"
                attempts.append((label, cpu_runtime, repo))
        for label, runtime, repo in attempts:
            if left() < 60:
                break
            options = ServerOptions(
                model_repository=repo,
                ports=Ports.free(),
                profile="gpu",
                unlocked_groups=("shared-memory",),
            )
            log = args.out / f"server-gpu-{len(summary.get('gpu_attempts', []))}.log"
            try:
                gpu_server = stack.enter_context(TritonServer(runtime, options, log))
            except ServerError as exc:
                reason = load_failure(log) or str(exc)[-300:]
                summary.setdefault("gpu_attempts", []).append(f"{label}: {reason}")
                continue
            summary.setdefault("gpu_attempts", []).append(f"{label}: started")
            for _, row in gpu_rows:
                row.server = label
            break
        if gpu_server is None:
            for _, row in gpu_rows:
                row.notes.append("no gpu server could start (see summary.json gpu_attempts)")
        else:
            url = gpu_server.grpc_url
            cuda_shm: str | None = None
            try:
                CudaShmBackend()
            except DispatchError as exc:
                cuda_shm = f"CUDA shm unavailable: {exc.message[:300]}"
            for run, row in gpu_rows:
                if run.shared_memory == "cuda" and cuda_shm is not None:
                    row.notes.append(cuda_shm)
                    pa_runs_left -= 1
                    continue
                make: Callable[[], Transport] | None = None
                if run.sequential and run.shared_memory == "cuda":
                    make = partial(GrpcShmTransport, url, capacity=capacity, backend="cuda")
                elif run.sequential:
                    make = partial(GrpcTransport, url)
                measure(row, gpu_server, make, run.shared_memory, run.model)
            if left() > 45:

                def score_one() -> str:
                    with DispatchClient(GrpcTransport(url)) as client:
                        orders = client.dispatch(window).to_json_dict()["orders"]
                    levels = sorted({str(o.get("fallback_level")) for o in orders})
                    return f"{len(orders)} orders answered, fallback levels {levels}"

                drill = fallback_drill(
                    gpu_server.http_url,
                    range(len(baseline)),
                    score_one,
                    admin_key=gpu_server.admin_key,
                )
    watcher.join(timeout=max(1.0, left() - 5))
    summary["gpu_monitor"] = {
        "overhead": None
        if not monitored
        else {**asdict(monitored[0]), "share_of_core": monitored[0].share_of_core},
        "drill": None if drill is None else asdict(drill),
    }

    summary["rows"] = [asdict(row) for row in rows]
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    monitor_lines = render_monitor(monitored[0] if monitored else None, drill)
    (args.out / "report.md").write_text(render(summary, rows) + "\n".join(monitor_lines))
    print((args.out / "report.md").read_text())
    return 0


def _fmt(value: float | int | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def render(summary: dict[str, Any], rows: Sequence[Row]) -> str:
    window = summary["window"]
    lines = [
        "# GPU check: cpu profile vs gpu profile (CUDA shared memory / copies)",
        "",
        f"GPUs: {summary['gpus']}. Window: {window['orders']} orders x {window['riders']} "
        f"riders. gpu server: `{summary['gpu_server']}` (see perf/gpu_check.py for what "
        "each measures). GPU memory before any server: "
        f"{summary['gpu_memory_mib_before']} MiB.",
        "",
        "| config | server | p50 ms (c=1) | p99 ms (c=1) | infer/s (c=128) | p50 ms (c=128) "
        "| p99 ms (c=128) | GPU MiB used | same assignment as cpu |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in rows:
        same = {None: "-", True: "yes", False: "no"}[row.same_assignment_as_cpu]
        lines.append(
            f"| {row.config} | {row.server or '-'} | {_fmt(row.p50_ms)} | {_fmt(row.p99_ms)} "
            f"| {_fmt(row.c128_per_s, 1)} | {_fmt(row.c128_p50_ms)} | {_fmt(row.c128_p99_ms)} "
            f"| {_fmt(row.gpu_memory_mib)} | {same} |"
        )
    lines += [
        "",
        "c=1: sequential requests from `DispatchClient` (the CUDA shm row through "
        '`GrpcShmTransport(backend="cuda")`); `dispatch` only, the `dispatch_features` rows '
        "are c=128 only. c=128: perf_analyzer over gRPC (`--shared-memory cuda` for the CUDA "
        "shm rows). Same assignment: the riders assigned, against the cpu server's "
        "`dispatch`. GPU memory: nvidia-smi, GPU 0, after the runs.",
        "",
    ]
    lines += render_zero_copy(rows)
    notes = [f"- {row.config}: {note}" for row in rows for note in row.notes]
    notes += [f"- gpu server attempt: {a}" for a in summary.get("gpu_attempts", [])]
    if notes:
        lines += ["Notes:", "", *notes, ""]
    return "\n".join(lines)


def _ratio(numerator: float | None, denominator: float | None) -> str:
    if not numerator or not denominator:
        return "-"
    return f"{numerator / denominator:.2f}x"


def render_zero_copy(rows: Sequence[Row]) -> list[str]:
    """The feature-level rows beside the original design's zero-copy vs memcpy figures."""
    shm, copies = (
        next((row for row in rows if row.config == run.config), None)
        for run in GPU_RUNS
        if run.model == FEATURE_ENTRY_MODEL_NAME
    )
    (_, zero_ms, zero_qps), (_, copy_ms, copy_qps) = DESIGN_FIGURES
    lines = [
        f"## Zero-copy vs copy at the feature-level entry point `{FEATURE_ENTRY_MODEL_NAME}` "
        "(c=128)",
        "",
        "| source | latency ms | infer/s (c=128) |",
        "| --- | ---: | ---: |",
    ]
    for label, ms, qps in DESIGN_FIGURES:
        lines.append(f"| {label} (quoted, average) | {_fmt(ms, 1)} | {_fmt(qps, 0)} |")
    shm_ms, shm_qps = (None, None) if shm is None else (shm.c128_p50_ms, shm.c128_per_s)
    copy_p50, copy_per_s = (
        (None, None) if copies is None else (copies.c128_p50_ms, copies.c128_per_s)
    )
    lines += [
        f"| this run: CUDA shm (measured, p50) | {_fmt(shm_ms)} | {_fmt(shm_qps, 1)} |",
        f"| this run: plain gRPC (measured, p50) | {_fmt(copy_p50)} | {_fmt(copy_per_s, 1)} |",
    ]
    ours_ms = _ratio(copy_p50, shm_ms)
    ours_qps = _ratio(shm_qps, copy_per_s)
    lines += [
        "",
        f"Copy / zero-copy latency: design {_ratio(copy_ms, zero_ms)}, this run {ours_ms}. "
        f"Zero-copy / copy throughput: design {_ratio(zero_qps, copy_qps)}, this run "
        f"{ours_qps}.",
        "",
        "The design's figures are quoted from the original design article (its Go service "
        "calling ONNX Runtime in-process, average latency, its hardware and model); they were "
        "not measured here. This run: perf_analyzer over gRPC at concurrency 128 on the gpu "
        "server, the same `--input-data` (pair features encoded on the client with the "
        "server's encoder settings) with `--shared-memory cuda` and without; p50 latency.",
        "",
    ]
    return lines


if __name__ == "__main__":
    sys.exit(main())
