"""`make bench`: every entry point of the dispatch service against two references.

One run, on this machine, with the same simulator windows everywhere:
1. the in-process limit (`perf.limit`): DispatchPipeline alone, 1 thread and 2 processes;
   and where one window's CPU goes in process, stage by stage (`perf.window_cost`);
2. Triton (this checkout's `cpu` profile on free loopback ports), both models that answer a
   window, side by side: the `dispatch` ensemble and `dispatch_fused` (the same pipeline in
   one Python model). perf_analyzer over gRPC, gRPC + system shared memory and HTTP binary;
   `perf.loadgen` over HTTP JSON (perf_analyzer 2.51 cannot send multi-element JSON tensors,
   see `perf.pa`); a short locust scenario (the ensemble);
3. the FastAPI + uvicorn + ONNX Runtime baseline (`perf/baselines/fastapi_service.py`,
   2 workers) driven by the same load generator at the same concurrency levels;
4. open-loop overload of `dispatch_fused` at 1.5x and 3x its c=64 capacity, the server and
   the load generator on separate cores, with probes for refusal latency, recovery and a
   level-1 trickle (`perf.overload_bench`); the closed-loop storms (`perf.overload`) after
   it, as a robustness test;
5. the small-window comparisons in alternating rounds, both servers up (`perf.rounds`):
   at c=64 dispatch_fused, the no-work floor (`perf.floor`, served beside it), FastAPI,
   dispatch and the in-process limit; at c=1 dispatch_fused's and the floor's p50; the
   c=64 and c=1 targets read the medians over the rounds.

Writes perf/reports/bench-<stamp>/: report.md, summary.json, one PNG per window size, the
perf_analyzer input files and CSVs, and the server logs. Bounded: every level is a fixed
request count with a time cap, and levels still waiting when the run's time budget is
spent are skipped and listed (full run: about 12-13 minutes on 2 cores; --quick: 4-6, a
smoke run whose figures are too short to judge).
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from dispatch_service.routing.settings import FUSED_MODEL_NAME
from perf import limit
from perf.bench_rounds import RoundsPlan, alternating_rounds
from perf.bodies import (
    decode_arrays,
    triton_infer_path,
)
from perf.floor import measure_floor
from perf.geocoding_bench import served_scenarios
from perf.idle_cost import cpu_per_window
from perf.levels import PA_ENTRIES, load_level, pa_level
from perf.locust_run import run_locust
from perf.overload import run_bench_runs
from perf.overload_bench import OpenLoopPlan, measure_pinned
from perf.pa import PerfAnalyzer
from perf.report import render_report
from perf.results import ENSEMBLE_MODEL, ENTRY_POINTS, MODELS, BenchResults, Series, entry_key
from perf.rounds import MIN_ROUNDS
from perf.sessions import FastApiSession, TritonSession
from perf.stats import request_budget
from perf.targets import summary
from perf.variants import TUNING_LOG, config_digest, parse_override, patched_repository
from perf.window_cost import stage_costs
from perf.windows import (
    SIZES,
    Tensors,
    optional_inputs,
)
from perf.workload import Workload, check_answer, post_body, prepare_workload, triton_json_answer

__all__ = [
    "FULL",
    "QUICK",
    "REPORTS",
    "TRITON_BUDGET_SHARE",
    "Bench",
    "Levels",
    "Plan",
    "host_info",
    "main",
    "write_outputs",
]

REPORTS = REPO_ROOT / "perf" / "reports"
TRITON_BUDGET_SHARE = 0.78
# perf.idle_cost's gaps: hot, and about what a stub waits between requests at c=1.
IDLE_GAPS_MS = (0.0, 2.0)
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
    # dispatch_fused at concurrency 64 (the reference), then 512 (all standard, then 10 % of
    # the callers level 1, the rest level 3) and the no-work floor of the contract
    # (perf.floor), each level this long
    overload_seconds: float = 0.0
    floor_seconds: float = 0.0
    # medium windows (64 x 200) with addresses through dispatch_fused (perf.geocoding_bench
    # --served): this many windows per scenario; 0 skips it
    geocoding_windows: int = 0
    # perf.overload_bench: open-loop bursts of this many seconds, the probe watching each
    # this long after it, server and load pinned to separate cores; 0 skips it
    open_loop_seconds: float = 0.0
    open_loop_tail_s: float = 2.0
    # perf.rounds: the small c=64 comparison in this many alternating rounds, each level
    # about round_seconds long; 0 skips it
    rounds: int = 0
    round_seconds: float = 3.0
    # perf.window_cost: windows timed per size, stage by stage, in process; none: skipped
    window_cost_calls: Mapping[str, int] = field(default_factory=dict)


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
    overload_seconds=10.0,
    floor_seconds=3.0,
    geocoding_windows=10,
    open_loop_seconds=10.0,
    open_loop_tail_s=3.0,
    rounds=MIN_ROUNDS,
    round_seconds=3.0,
    window_cost_calls={"small": 1000, "medium": 100, "large": 10},
)

QUICK = Plan(
    mode="quick",
    level_seconds=1.0,
    pa_levels={"small": (1, 64), "medium": (16,), "large": (1,)},
    http_json_levels={"small": (1, 64), "medium": (16,), "large": (1,)},
    fused_pa_levels={"small": (1, 64), "large": (1,)},
    fused_http_json_levels={},
    fastapi_json_levels={"small": (1, 64), "medium": (16,), "large": (1,)},
    fastapi_arrays_levels={"small": (1, 64), "large": (1,)},
    limit_seconds=1.0,
    locust_seconds=5,
    locust_users=8,
    budget_s=240.0,
    overload_seconds=3.0,
    floor_seconds=1.0,
    geocoding_windows=3,
    open_loop_seconds=2.0,
    open_loop_tail_s=1.5,
    rounds=MIN_ROUNDS,
    round_seconds=1.0,
    window_cost_calls={"small": 200, "medium": 20, "large": 3},
)


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
        self.phase("window cost", self.window_cost_phase)
        self.phase("Triton", self.triton_phase)
        self.phase("FastAPI baseline", self.fastapi_phase)
        if self.plan.rounds > 0 and "small" in self.workloads:
            self.phase("alternating rounds", self.rounds_phase)
        if self.plan.floor_seconds > 0:
            self.phase("no-work floor", self.floor_phase)
        if self.plan.geocoding_windows > 0:
            self.phase("addresses", self.geocoding_phase)
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
            if self.plan.open_loop_seconds > 0:
                self.phase("open loop", partial(self.open_loop_phase, triton))
            if self.plan.overload_seconds > 0:  # bounded: three runs of overload_seconds
                self.phase("closed-loop storms", partial(self.overload_levels, triton))
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

    def overload_levels(self, triton: TritonSession) -> None:
        """dispatch_fused under perf.overload's closed loop (`BENCH_RUNS`): 64 callers (the
        reference), 512 at the default level, 512 with mixed priorities; each as one note
        (JSON) in the report: accepted/refused per level, latencies, next request, and the
        probes' own figures."""
        self.results.overload = run_bench_runs(
            triton.endpoints.grpc, FUSED_MODEL_NAME, self.plan.overload_seconds, self.say
        )

    def open_loop_phase(self, triton: TritonSession) -> None:
        """perf.overload_bench: open-loop bursts with the server and the load pinned apart."""
        process = triton.server.process
        if process is None:
            raise RuntimeError("tritonserver is not running")
        plan = OpenLoopPlan(self.plan.open_loop_seconds, self.plan.open_loop_tail_s)
        self.results.open_loop = measure_pinned(
            triton.endpoints.grpc,
            process.pid,
            FUSED_MODEL_NAME,
            plan,
            say=self.say,
            priority_key=triton.server.priority_key,
        )

    def window_cost_phase(self) -> None:
        """perf.window_cost: where one window's CPU goes in process, stage by stage."""
        for size in self.sizes:
            calls = self.plan.window_cost_calls.get(size.name, 0)
            if calls > 0:
                self.say(f"window cost: {size.label}, {calls} windows stage by stage")
                self.results.window_cost[size.name] = stage_costs(size, calls, self.repository)

    def rounds_phase(self) -> None:
        """perf.rounds: the small-window comparisons in alternating rounds (`perf.bench_rounds`)."""
        self.say(f"alternating rounds: small c=64 and c=1, {self.plan.rounds} rounds")
        rounds = alternating_rounds(
            RoundsPlan(self.plan.rounds, self.plan.round_seconds),
            repository=self.repository,
            workload=self.workloads["small"],
            sweep=self.results,
            out=self.out,
            say=self.say,
        )
        self.results.rounds, self.results.served_cpu = rounds.figures, rounds.cpu

    def geocoding_phase(self) -> None:
        self.say(f"addresses: {self.plan.geocoding_windows} medium windows per scenario")
        self.results.geocoding = served_scenarios(windows=self.plan.geocoding_windows)

    def floor_phase(self) -> None:
        self.say("no-work floor of the contract (dispatch_floor)")
        # and the same overload runs as dispatch_fused's: what the host allows no work at all
        self.results.floor = measure_floor(
            self.plan.floor_seconds, self.out / "floor", self.plan.overload_seconds, self.say
        )
        # The work's side of the c=1 floor: one window's CPU hot and after an idle wait.
        self.say("one window in process after an idle gap (perf.idle_cost)")
        self.results.floor["idle_cost"] = cpu_per_window(
            "small", IDLE_GAPS_MS, self.plan.floor_seconds, self.repository
        )

    def fastapi_phase(self) -> None:
        # Its share of the budget even when the Triton phase ran over (the open loop and the
        # storms are not bounded by the budget): the FastAPI figures are the references.
        share = (1.0 - TRITON_BUDGET_SHARE) * self.plan.budget_s
        self.deadline = max(self.started + self.plan.budget_s, time.monotonic() + share)
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
                    triton_json_answer,
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
                    request_count=count,
                    out=self.out,
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
            if failure:
                series.failures.append(failure)
        self.results.series.append(series)

    def fastapi_size(self, fastapi: FastApiSession, workload: Workload) -> None:
        url = fastapi.base + "/dispatch/arrays"
        self.verify(
            "FastAPI",
            workload,
            lambda: decode_arrays(json.loads(post_body(url, workload.bodies["fastapi_arrays"][0]))),
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


def source_revision() -> str:
    """The checkout's commit, with "+ changes" where the working tree differs from it (what a
    report's figures were measured on); "unknown" outside a git checkout."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args],
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip

    try:
        commit = git("rev-parse", "--short=12", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit} + changes" if changed else commit


def host_info(pa: PerfAnalyzer) -> dict[str, Any]:
    return {
        "source": source_revision(),
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
    parser.add_argument("--quick", action="store_true", help="smoke run, about 4-6 minutes")
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
