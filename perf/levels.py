"""One measured level: a perf_analyzer job or a load-generator run at one concurrency."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from perf.bodies import (
    RequestBody,
)
from perf.loadgen import LoadPlan, run_load
from perf.pa import PaJob, PerfAnalyzer
from perf.results import ENTRY_POINTS, MODELS, entry_key
from perf.stats import LevelStats
from perf.workload import Workload

__all__ = [
    "PA_ENTRIES",
    "PA_TRANSPORTS",
    "Endpoints",
    "load_level",
    "pa_job",
    "pa_level",
]


# ---- one level -------------------------------------------------------------------------------

PA_TRANSPORTS = ("grpc", "grpc_shm", "http_binary")
# Measured in this order: each transport for the ensemble, then for dispatch_fused.
PA_ENTRIES = tuple(entry_key(t, model) for t in PA_TRANSPORTS for model in MODELS)


@dataclass(frozen=True)
class Endpoints:
    grpc: str  # host:port
    http: str  # host:port


def pa_level(
    pa: PerfAnalyzer,
    endpoints: Endpoints,
    entry: str,
    workload: Workload,
    concurrency: int,
    *,
    request_count: int,
    out: Path,
    timeout_s: float,
    breakdown: dict[str, dict[str, float]] | None = None,
) -> tuple[LevelStats | None, str, str]:
    """(row and "", or None and why it failed; command) for one level.

    `entry` is one of PA_ENTRIES (its model and transport). `breakdown`, when given, receives
    the server-side time per ensemble step, or the single model's own split.
    """
    job = pa_job(entry, endpoints, workload, concurrency, request_count=request_count, out=out)
    outcome = pa.run(job, timeout_s)
    if breakdown is not None:
        breakdown.update(outcome.server)
    if outcome.ok:
        return outcome.rows[0], "", outcome.command
    last = [line for line in outcome.log_tail.splitlines() if line.strip()][-1:] or ["no output"]
    return (
        None,
        f"c={concurrency}: perf_analyzer exit {outcome.returncode}: {last[0]}",
        (outcome.command),
    )


def pa_job(
    entry: str,
    endpoints: Endpoints,
    workload: Workload,
    concurrency: int,
    *,
    request_count: int,
    out: Path,
) -> PaJob:
    """The perf_analyzer invocation of one PA_ENTRIES level."""
    if entry not in PA_ENTRIES:
        raise ValueError(f"{entry} is not measured with perf_analyzer")
    point = ENTRY_POINTS[entry]
    grpc = point.transport.startswith("grpc")
    shm = point.transport == "grpc_shm"
    return PaJob(
        url=endpoints.grpc if grpc else endpoints.http,
        protocol="grpc" if grpc else "http",
        input_data=workload.input_data,
        concurrency=concurrency,
        request_count=request_count,
        csv_path=out / f"pa_{entry}_{workload.size.name}_c{concurrency}.csv",
        model=point.model,
        shared_memory="system" if shm else "none",
        output_shm_size=workload.output_shm_size if shm else None,
    )


def load_level(
    url: str, bodies: Sequence[RequestBody], concurrency: int, request_count: int, cap_s: float
) -> tuple[LevelStats | None, str]:
    result = run_load(LoadPlan(url, bodies, concurrency, request_count, cap_s))
    if result.errors or not result.latencies_s:
        return None, f"c={concurrency}: {result.errors} errors, first: {result.first_error}"
    return result.stats(), ""
