"""The GPU check's rows and report: the planned runs on the gpu server, one `Row` per
configuration, and the Markdown that `perf.gpu_check` writes (report.md).

Pure: renders what was measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dispatch_contract import FEATURE_ENTRY_MODEL_NAME
from perf.pa import SharedMemory

__all__ = [
    "DESIGN_FIGURES",
    "GPU_RUNS",
    "GpuRun",
    "Row",
    "render",
    "render_zero_copy",
]


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
