"""`make perf`: a quick perf_analyzer sweep of the `dispatch` ensemble over gRPC.

Starts this checkout's tritonserver on free loopback ports (or the fixed ones given with
--http-port/--grpc-port/--metrics-port), or measures a running server (--url), writes
perf_analyzer input files made from simulator windows (not random bytes), measures small
(1 x 20) and medium (64 x 200) windows at a few concurrency levels and writes
perf/reports/<stamp>/report.md, summary.json and plots in the `make bench` format.
Bounded: each level is one measurement of a fixed request count. `make bench` is the full
comparison (every entry point, the in-process limit, the FastAPI baseline).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from perf.bench import REPORTS, host_info, write_outputs
from perf.levels import Endpoints, pa_level
from perf.pa import PerfAnalyzer
from perf.results import BenchResults, Series
from perf.stats import request_budget
from perf.variants import config_digest
from perf.windows import SIZES, optional_inputs
from perf.workload import prepare_workload

__all__ = [
    "main",
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url", help="gRPC host:port of a running server (default: start one, see --*-port)"
    )
    parser.add_argument(
        "--http-port",
        type=int,
        help="ports of the server this run starts (default: three free ones); all three or none",
    )
    parser.add_argument("--grpc-port", type=int)
    parser.add_argument("--metrics-port", type=int)
    parser.add_argument(
        "--concurrency", default="1,2,4,8", help="comma-separated levels (default: 1,2,4,8)"
    )
    parser.add_argument(
        "--sizes", default="small,medium", help="window sizes (default: small,medium)"
    )
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="aimed duration per level (default: 3)"
    )
    parser.add_argument(
        "--out", type=Path, default=REPORTS, help=f"reports folder (default: {REPORTS})"
    )
    args = parser.parse_args(argv)
    fixed = (args.http_port, args.grpc_port, args.metrics_port)
    if any(p is not None for p in fixed) and (None in fixed or args.url):
        parser.error("--http-port, --grpc-port and --metrics-port go together, without --url")
    levels = [int(level) for level in args.concurrency.split(",") if level.strip()]

    started = time.monotonic()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out / stamp
    out.mkdir(parents=True, exist_ok=True)
    pa = PerfAnalyzer.from_venv()
    host = host_info(pa)
    for unused in ("locust", "fastapi", "uvicorn"):  # this sweep runs perf_analyzer only
        host.pop(unused, None)
    results = BenchResults(stamp=stamp, mode="gRPC sweep (make perf)", host=host)
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
            ports = Ports(*fixed) if None not in fixed else Ports.free()
            server = TritonServer(
                TritonRuntime.from_venv(),
                ServerOptions(model_repository=MODEL_REPOSITORY, ports=ports),
                out / "server.log",
            )
            stack.enter_context(server)
            endpoints = Endpoints(grpc=server.grpc_url, http=server.http_url)
            results.server = {"profile": "cpu", "models": config_digest(MODEL_REPOSITORY)}
        for workload in workloads:
            results.windows[workload.size.name] = workload.describe()
            series = Series("grpc", workload.size.name)
            rate = 100.0
            for concurrency in levels:
                count = request_budget(rate, args.seconds, concurrency)
                steps: dict[str, dict[str, float]] = {}
                row, failure, series.command = pa_level(
                    pa,
                    endpoints,
                    "grpc",
                    workload,
                    concurrency,
                    request_count=count,
                    out=out,
                    timeout_s=300,
                    breakdown=steps,
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
    results.duration_s = time.monotonic() - started
    results.host["loadavg_after"] = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    print(f"report: {write_outputs(results, out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
