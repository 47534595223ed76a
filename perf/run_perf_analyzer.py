"""`make perf`: a quick perf_analyzer sweep of the `dispatch` ensemble over gRPC.

Starts this checkout's tritonserver on free loopback ports (or uses --url), writes
perf_analyzer input files made from simulator windows (not random bytes), measures small
(1 x 20) and medium (64 x 200) windows at a few concurrency levels and writes
perf/reports/<stamp>/report.md, summary.json and plots in the `make bench` format.
Bounded: each level is one measurement of a fixed request count. `make bench` is the full
comparison (every entry point, the in-process limit, the FastAPI baseline).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from perf.bench import REPORTS, host_info, write_outputs
from perf.levels import Endpoints, pa_level
from perf.pa import PerfAnalyzer
from perf.results import BenchResults, Series
from perf.sessions import TritonSession
from perf.stats import request_budget
from perf.variants import config_digest
from perf.windows import SIZES, optional_inputs
from perf.workload import prepare_workload

__all__ = [
    "main",
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="gRPC host:port of a running server (default: start one)")
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels")
    parser.add_argument("--sizes", default="small,medium")
    parser.add_argument("--seconds", type=float, default=3.0, help="aimed duration per level")
    parser.add_argument("--out", type=Path, default=REPORTS)
    args = parser.parse_args(argv)
    levels = [int(level) for level in args.concurrency.split(",") if level.strip()]

    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out / stamp
    out.mkdir(parents=True, exist_ok=True)
    pa = PerfAnalyzer.from_venv()
    results = BenchResults(stamp=stamp, mode="gRPC sweep (make perf)", host=host_info(pa))
    pipeline = DispatchPipeline.from_repository()
    optional = optional_inputs(MODEL_REPOSITORY)
    workloads = [
        prepare_workload(SIZES[name], pipeline, out, optional) for name in args.sizes.split(",")
    ]
    with ExitStack() as stack:
        if args.url:
            endpoints = Endpoints(grpc=args.url, http="")
            results.server = {"profile": "external", "url": args.url}
        else:
            session = stack.enter_context(TritonSession(MODEL_REPOSITORY, out / "server.log"))
            endpoints = session.endpoints
            results.server = {"profile": "cpu", "models": config_digest(MODEL_REPOSITORY)}
        for workload in workloads:
            results.windows[workload.size.name] = workload.describe()
            series = Series("grpc", workload.size.name)
            rate = 100.0
            for concurrency in levels:
                count = request_budget(rate, args.seconds, concurrency)
                steps: dict[str, dict[str, float]] = {}
                row, failure, series.command = pa_level(
                    pa, endpoints, "grpc", workload, concurrency, count, out, 300, steps
                )
                if concurrency == 1 and steps:
                    results.breakdown[workload.size.name] = steps
                if failure:
                    series.failures.append(failure)
                if row is None:
                    continue
                rate = row.throughput_per_s
                series.rows.append(row)
                print(
                    f"{workload.size.name} c={concurrency}: {row.throughput_per_s:.1f} windows/s,"
                    f" p50 {row.p50_ms:.2f} ms, p99 {row.p99_ms:.2f} ms",
                    flush=True,
                )
            results.series.append(series)
    print(f"report: {write_outputs(results, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
