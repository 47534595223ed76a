"""`make bench`: every entry point of the dispatch service against two references.

One run, on this machine, with the same simulator windows everywhere:
1. the in-process limit (`perf.limit`): DispatchPipeline alone, 1 thread and 2 processes;
2. Triton (this checkout's `cpu` profile on free loopback ports), both models that answer a
   window, side by side: the `dispatch` ensemble and `dispatch_fused` (the same pipeline in
   one Python model). perf_analyzer over gRPC, gRPC + system shared memory and HTTP binary;
   `perf.loadgen` over HTTP JSON (perf_analyzer 2.51 cannot send multi-element JSON tensors,
   see `perf.pa`); a short locust scenario (the ensemble);
3. the FastAPI + uvicorn + ONNX Runtime baseline (`perf/baselines/fastapi_service.py`,
   2 workers) driven by the same load generator at the same concurrency levels.

Writes perf/reports/bench-<stamp>/: report.md, summary.json, one PNG per window size, the
perf_analyzer input files and CSVs, and the server logs. Bounded: every level is a fixed
request count with a time cap, and levels still waiting when the run's time budget is
spent are skipped and listed (full run: under 10 minutes on 2 cores; --quick: 1-2).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.ops.server import (
    ChildService,
    Ports,
    ServerOptions,
    TritonRuntime,
    TritonServer,
)
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from perf import limit
from perf.bodies import (
    RequestBody,
    decode_arrays,
    decode_triton_json_answer,
    fastapi_arrays_body,
    fastapi_window_body,
    triton_infer_path,
    triton_json_body,
)
from perf.loadgen import LoadPlan, run_load
from perf.pa import PaJob, PerfAnalyzer, output_shm_size, write_input_data
from perf.report import render_report
from perf.results import ENSEMBLE_MODEL, ENTRY_POINTS, MODELS, BenchResults, Series, entry_key
from perf.stats import LevelStats, request_budget
from perf.targets import summary
from perf.variants import TUNING_LOG, config_digest, parse_override, patched_repository
from perf.windows import (
    FIRST_SEED,
    SIZES,
    Tensors,
    WindowSize,
    optional_inputs,
    simulated_windows,
)

__all__ = [
    "FULL",
    "PA_ENTRIES",
    "PA_TRANSPORTS",
    "QUICK",
    "REPORTS",
    "TRITON_BUDGET_SHARE",
    "Bench",
    "Endpoints",
    "FastApiSession",
    "Levels",
    "Plan",
    "TritonSession",
    "Workload",
    "check_answer",
    "host_info",
    "load_level",
    "main",
    "pa_job",
    "pa_level",
    "parse_locust_stats",
    "prepare_workload",
    "run_locust",
    "write_outputs",
]

REPORTS = REPO_ROOT / "perf" / "reports"
TRITON_BUDGET_SHARE = 0.78
Levels = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class Plan:
    mode: str
    level_seconds: float  # aimed duration of one level (request count = rate x this)
    pa_levels: Levels  # grpc, grpc_shm, http_binary of the dispatch ensemble
    http_json_levels: Levels
    # dispatch_fused: fewer levels than the ensemble where it saves time, always including
    # the targets' levels (small c=1 and c=64 over gRPC, large c=1 over gRPC and gRPC + shm)
    fused_pa_levels: Levels
    fused_http_json_levels: Levels
    fastapi_json_levels: Levels
    fastapi_arrays_levels: Levels
    limit_seconds: float
    locust_seconds: int
    locust_users: int
    budget_s: float  # after this, remaining levels are skipped (and listed)


FULL = Plan(
    mode="full",
    level_seconds=3.0,
    pa_levels={"small": (1, 4, 16, 64, 128), "medium": (1, 4, 16, 64), "large": (1, 4)},
    http_json_levels={"small": (1, 4, 16, 64, 128), "medium": (1, 16, 64), "large": (1, 4)},
    fused_pa_levels={"small": (1, 4, 16, 64, 128), "medium": (1, 16, 64), "large": (1, 4)},
    fused_http_json_levels={"small": (1, 64), "medium": (16,), "large": (1,)},
    fastapi_json_levels={"small": (1, 4, 16, 64, 128), "medium": (1, 16, 64), "large": (1, 4)},
    fastapi_arrays_levels={"small": (1, 64), "medium": (1, 64), "large": (1,)},
    limit_seconds=3.0,
    locust_seconds=15,
    locust_users=16,
    budget_s=540.0,
)

QUICK = Plan(
    mode="quick",
    level_seconds=1.0,
    pa_levels={"small": (1, 64), "medium": (16,), "large": (1,)},
    http_json_levels={"small": (1, 64), "medium": (16,), "large": (1,)},
    fused_pa_levels={"small": (1, 64), "large": (1,)},
    fused_http_json_levels={},
    fastapi_json_levels={"small": (1, 64), "medium": (16,), "large": (1,)},
    fastapi_arrays_levels={"small": (64,)},
    limit_seconds=1.0,
    locust_seconds=5,
    locust_users=8,
    budget_s=150.0,
)


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
    if not np.allclose(expected["TOPK_SCORE"], got["TOPK_SCORE"], rtol=1e-4, atol=1e-6):
        return "TOPK_SCORE differs from the in-process pipeline"
    return ""


def _post(url: str, body: RequestBody, timeout_s: float = 60.0) -> bytes:
    request = urllib.request.Request(url, data=body.data, headers=body.headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return bytes(response.read())


def _triton_json_answer(url: str, body: RequestBody) -> Tensors:
    return decode_triton_json_answer(_post(url, body))


# ---- servers ---------------------------------------------------------------------------------


class TritonSession:
    """This checkout's tritonserver on free loopback ports, stopped on exit."""

    def __init__(self, repository: Path, log_path: Path) -> None:
        runtime = TritonRuntime.from_venv()
        options = ServerOptions(model_repository=repository, ports=Ports.free())
        self.server = TritonServer(runtime, options, log_path)
        self.pa = PerfAnalyzer.from_venv()

    def __enter__(self) -> TritonSession:
        self.server.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.stop()

    @property
    def http_base(self) -> str:
        return f"http://{self.server.http_url}"

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints(grpc=self.server.grpc_url, http=self.server.http_url)


class FastApiSession(ChildService):
    """The FastAPI baseline under uvicorn (own process group), stopped on exit."""

    def __init__(self, repository: Path, log_path: Path, workers: int = 2) -> None:
        super().__init__(log_path, "FastAPI baseline")
        self.port = Ports.free().http
        self.repository = repository
        self.workers = workers

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FastApiSession:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env["DISPATCH_BASELINE_MODEL_REPOSITORY"] = str(self.repository)
        command = [
            sys.executable,
            "-m",
            "perf.baselines.fastapi_service",
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
        ]
        self.spawn(command, env, cwd=REPO_ROOT)
        self.wait_http_ok(f"{self.base}/health", timeout_s=120)
        return self


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
    request_count: int,
    out: Path,
    timeout_s: float,
    breakdown: dict[str, dict[str, float]] | None = None,
) -> tuple[LevelStats | None, str, str]:
    """(row or None, failure text or a note on the row, command) for one level.

    `entry` is one of PA_ENTRIES (its model and transport). `breakdown`, when given, receives
    the server-side time per ensemble step, or the single model's own split.
    """
    job = pa_job(entry, endpoints, workload, concurrency, request_count, out)
    outcome = pa.run(job, timeout_s)
    if breakdown is not None:
        breakdown.update(outcome.server)
    if outcome.ok:
        note = f"c={concurrency}: {outcome.note}" if outcome.note else ""
        return outcome.rows[0], note, outcome.command
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
        mode="count_windows",
    )


def load_level(
    url: str, bodies: Sequence[RequestBody], concurrency: int, request_count: int, cap_s: float
) -> tuple[LevelStats | None, str]:
    result = run_load(LoadPlan(url, bodies, concurrency, request_count, cap_s))
    if result.errors or not result.latencies_s:
        return None, f"c={concurrency}: {result.errors} errors, first: {result.first_error}"
    return result.stats(), ""


# ---- locust ----------------------------------------------------------------------------------


def parse_locust_stats(text: str) -> dict[str, Any]:
    """The 'Aggregated' row of locust's `--csv` *_stats.csv (times in ms)."""
    import csv
    import io

    for row in csv.DictReader(io.StringIO(text)):
        if row.get("Name") == "Aggregated":
            return {
                "requests": int(row["Request Count"]),
                "failures": int(row["Failure Count"]),
                "rps": float(row["Requests/s"]),
                "p50_ms": float(row["50%"]),
                "p95_ms": float(row["95%"]),
                "p99_ms": float(row["99%"]),
            }
    raise ValueError("no Aggregated row in locust stats")


def run_locust(
    host: str, size: str, body: str, users: int, seconds: int, max_requests: int, out: Path
) -> dict[str, Any]:
    prefix = out / f"locust_{size}_{body}"
    command = [
        str(Path(sys.prefix) / "bin" / "locust"),
        "-f",
        str(REPO_ROOT / "perf" / "locustfile.py"),
        "--headless",
        "--host",
        host,
        "-u",
        str(users),
        "-r",
        str(users),
        "--run-time",
        f"{seconds}s",
        "--stop-timeout",
        "5",
        "--csv",
        str(prefix),
        "--only-summary",
        "--loglevel",
        "WARNING",
        "--window-size",
        size,
        "--body",
        body,
        "--max-requests",
        str(max_requests),
    ]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    info: dict[str, Any] = {
        "users": users,
        "size": size,
        "body": body,
        "run_time": f"{seconds} s",
        "max_requests": max_requests,
        "command": " ".join(command),
    }
    try:
        done = subprocess.run(
            command,
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=seconds + 90,
            check=False,
        )
        (out / f"locust_{size}_{body}.log").write_text(done.stdout + done.stderr)
        info.update(parse_locust_stats(Path(f"{prefix}_stats.csv").read_text()))
    except (subprocess.TimeoutExpired, OSError, ValueError, KeyError) as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


# ---- the run ---------------------------------------------------------------------------------


class Bench:
    def __init__(
        self, plan: Plan, sizes: Sequence[str], repository: Path, out: Path, overrides: list[str]
    ) -> None:
        self.plan = plan
        self.sizes = [SIZES[name] for name in sizes]
        self.repository = repository
        self.out = out
        self.started = time.monotonic()
        self.deadline = self.started + plan.budget_s
        self.results = BenchResults(stamp=out.name.removeprefix("bench-"), mode=plan.mode)
        self.results.server = {
            "profile": "cpu",
            "models": config_digest(repository),
            "overrides": overrides,
        }
        self.workloads: dict[str, Workload] = {}
        self.optional = optional_inputs(repository)

    def say(self, text: str) -> None:
        print(f"[bench {time.monotonic() - self.started:5.0f} s] {text}", flush=True)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def rate_guess(self, size: str, model: str = ENSEMBLE_MODEL) -> float:
        """Expected windows/s at concurrency 1, to size the first level's request count."""
        for entry in (entry_key("grpc", model), "grpc"):
            measured = self.results.find(entry, size)
            if measured is not None and measured.rows:
                return measured.rows[0].throughput_per_s
        stats = self.results.limits.get(size)
        return stats.single.throughput_per_s * 0.4 if stats else 20.0

    def run(self) -> BenchResults:
        self.results.host = host_info(PerfAnalyzer.from_venv())
        pipeline = DispatchPipeline.from_repository(self.repository)
        for size in self.sizes:
            self.say(f"preparing {size.label} windows")
            workload = prepare_workload(size, pipeline, self.out, self.optional)
            self.workloads[size.name] = workload
            self.results.windows[size.name] = workload.describe()
        del pipeline
        self.say("in-process limit (1 thread, then 2 processes)")
        self.results.limits = limit.measure(
            [size.name for size in self.sizes],
            max_windows=5000,
            max_seconds=self.plan.limit_seconds,
            repository=self.repository,
        )
        self.phase("Triton", self.triton_phase)
        self.phase("FastAPI baseline", self.fastapi_phase)
        self.results.host["loadavg_after"] = _loadavg()
        self.results.duration_s = time.monotonic() - self.started
        self.results.tuning_log = json.loads(TUNING_LOG.read_text()) if TUNING_LOG.exists() else []
        return self.results

    def phase(self, name: str, body: Callable[[], None]) -> None:
        """Run one phase; a failure is reported and the measurements so far are kept."""
        try:
            body()
        except Exception as exc:
            self.say(f"{name} phase failed: {type(exc).__name__}: {exc}")
            self.results.notes.append(f"{name} phase failed: {type(exc).__name__}: {exc}")

    def triton_phase(self) -> None:
        # Triton's four entry points may use this share of the budget; FastAPI keeps the rest.
        self.deadline = self.started + TRITON_BUDGET_SHARE * self.plan.budget_s
        self.say("starting tritonserver")
        with TritonSession(self.repository, self.out / "tritonserver.log") as triton:
            for size in self.sizes:
                self.triton_size(triton, self.workloads[size.name])
            if "small" in self.workloads and self.remaining() > 0:
                self.say("locust scenario")
                self.results.locust = run_locust(
                    triton.http_base,
                    "small",
                    "binary",
                    self.plan.locust_users,
                    self.plan.locust_seconds,
                    max_requests=20000,
                    out=self.out,
                )

    def fastapi_phase(self) -> None:
        self.deadline = self.started + self.plan.budget_s
        self.say("starting the FastAPI baseline")
        with FastApiSession(self.repository, self.out / "fastapi.log") as fastapi:
            for size in self.sizes:
                self.fastapi_size(fastapi, self.workloads[size.name])

    def verify(self, who: str, workload: Workload, ask: Callable[[], Tensors]) -> None:
        """Note whether `who` answers window 0 as the in-process pipeline does."""
        try:
            problem = check_answer(workload.answers[0], ask())
        except (OSError, ValueError, KeyError) as exc:  # URLError is an OSError
            problem = f"no usable answer ({type(exc).__name__}: {exc})"
        self.results.notes.append(
            f"{workload.size.name}: {who}'s answer to window 0 "
            + (f"DIFFERS: {problem}" if problem else "matches the in-process pipeline")
        )

    def triton_size(self, triton: TritonSession, workload: Workload) -> None:
        for model in MODELS:  # the same window 0 to both models, checked the same way
            self.verify(
                f"Triton `{model}`",
                workload,
                partial(
                    _triton_json_answer,
                    triton.http_base + triton_infer_path(model),
                    workload.bodies["http_json"][0],
                ),
            )
        for entry in PA_ENTRIES:
            self.pa_series(triton, workload, entry)
        for model in MODELS:
            self.load_series(
                entry_key("http_json", model),
                workload,
                triton.http_base + triton_infer_path(model),
                self.plan.http_json_levels
                if model == ENSEMBLE_MODEL
                else self.plan.fused_http_json_levels,
            )

    def pa_series(self, triton: TritonSession, workload: Workload, entry: str) -> None:
        """One perf_analyzer entry at one window size over its concurrency levels."""
        name = workload.size.name
        model = ENTRY_POINTS[entry].model
        levels = self.plan.pa_levels if model == ENSEMBLE_MODEL else self.plan.fused_pa_levels
        if not levels.get(name):
            return
        series = Series(entry, name)
        rate = self.rate_guess(name, model)
        for concurrency in levels[name]:
            if self.remaining() <= 0:
                series.failures.append(f"c={concurrency}: skipped, time budget spent")
                continue
            count = request_budget(rate, self.plan.level_seconds, concurrency)
            self.say(f"{entry} {name} c={concurrency} ({count} requests)")
            # Generous against the expected duration, but a stuck run cannot eat the budget.
            expected_s = count / max(rate, 0.1)
            timeout_s = min(300.0, max(45.0, 4 * expected_s + 30.0), self.remaining() + 60.0)
            steps: dict[str, dict[str, float]] = {}
            try:
                row, failure, series.command = pa_level(
                    triton.pa,
                    triton.endpoints,
                    entry,
                    workload,
                    concurrency,
                    count,
                    self.out,
                    timeout_s=max(30.0, timeout_s),
                    breakdown=steps,
                )
            except Exception as exc:  # one level's surprise must not end the run
                row, failure = None, f"c={concurrency}: {type(exc).__name__}: {exc}"
            if row is not None:
                series.rows.append(row)
                rate = row.throughput_per_s
                if ENTRY_POINTS[entry].transport == "grpc" and concurrency == 1 and steps:
                    self.results.breakdowns()[model][name] = steps
            if failure:  # with a row: a note on how it was measured
                series.failures.append(failure)
        self.results.series.append(series)

    def fastapi_size(self, fastapi: FastApiSession, workload: Workload) -> None:
        url = fastapi.base + "/dispatch/arrays"
        self.verify(
            "FastAPI",
            workload,
            lambda: decode_arrays(json.loads(_post(url, workload.bodies["fastapi_arrays"][0]))),
        )
        self.load_series(
            "fastapi_json", workload, fastapi.base + "/dispatch", self.plan.fastapi_json_levels
        )
        self.load_series(
            "fastapi_arrays",
            workload,
            fastapi.base + "/dispatch/arrays",
            self.plan.fastapi_arrays_levels,
        )

    def load_series(self, entry: str, workload: Workload, url: str, levels: Levels) -> None:
        name = workload.size.name
        point = ENTRY_POINTS[entry]
        series = Series(entry, name, command=f"perf.loadgen POST {url}")
        rate = self.rate_guess(name, point.model or ENSEMBLE_MODEL)
        bodies = workload.bodies[point.transport]  # the same bodies for both Triton models
        for concurrency in levels.get(name, ()):
            if self.remaining() <= 0:
                series.failures.append(f"c={concurrency}: skipped, time budget spent")
                continue
            count = request_budget(rate, self.plan.level_seconds, concurrency)
            self.say(f"{entry} {name} c={concurrency} ({count} requests)")
            try:
                row, failure = load_level(
                    url,
                    bodies,
                    concurrency,
                    count,
                    cap_s=min(self.plan.level_seconds * 3, max(5.0, self.remaining())),
                )
            except Exception as exc:  # one level's surprise must not end the run
                row, failure = None, f"c={concurrency}: {type(exc).__name__}: {exc}"
            if row is not None:
                series.rows.append(row)
                rate = row.throughput_per_s
            else:
                series.failures.append(failure)
        if levels.get(name):
            self.results.series.append(series)


def _loadavg() -> str:
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def _package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def host_info(pa: PerfAnalyzer) -> dict[str, Any]:
    return {
        "node": platform.node(),
        "cpus": os.cpu_count(),
        "platform": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "loadavg_before": _loadavg(),
        "perf_analyzer": pa.version(),
        "triton": "2.51 (nvidia-pytriton " + _package_version("nvidia-pytriton") + ")",
        "locust": _package_version("locust"),
        "fastapi": _package_version("fastapi"),
        "uvicorn": _package_version("uvicorn"),
        "onnxruntime": _package_version("onnxruntime"),
    }


def write_outputs(results: BenchResults, out: Path) -> Path:
    from perf.plots import plot_size

    plots: dict[str, str] = {}
    for size in results.sizes():
        try:
            plot_size(results, size, out / f"{size}.png")
            plots[size] = f"{size}.png"
        except Exception as exc:  # a plot must not lose the measurements
            results.notes.append(f"plot for {size} failed: {type(exc).__name__}: {exc}")
    (out / "summary.json").write_text(json.dumps(summary(results), indent=2) + "\n")
    report = out / "report.md"
    report.write_text(render_report(results, plots))
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Benchmark every entry point (make bench)")
    parser.add_argument("--quick", action="store_true", help="smoke run, about 1-2 minutes")
    parser.add_argument("--sizes", default="small,medium,large")
    parser.add_argument("--out", type=Path, default=REPORTS)
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        help="model config override for this run, e.g. dispatch_model.queue_delay_us=0",
    )
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown sizes {unknown}; known: {', '.join(SIZES)}")
    overrides = [parse_override(text) for text in args.override]
    out = args.out / f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dispatch-bench-") as tmp:
        repository = MODEL_REPOSITORY
        if overrides:
            repository = patched_repository(MODEL_REPOSITORY, Path(tmp) / "repository", overrides)
        bench = Bench(plan, sizes, repository, out, [str(o) for o in overrides])
        results = bench.run()
    report = write_outputs(results, out)
    bench.say(f"report: {report}")
    for target in summary(results)["targets"]:
        measured = "n/a" if target["measured"] is None else f"{target['measured']:.2f}"
        print(
            f"  {target['name']} [{target['model']}]: {measured} (goal {target['goal']})"
            f" -> {target['met']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
