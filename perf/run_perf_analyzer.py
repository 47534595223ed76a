"""First capacity run: perf_analyzer against the `dispatch` ensemble with simulated windows.

Starts this checkout's tritonserver on free loopback ports (or uses --url), writes
perf_analyzer input files made from simulator windows (not random bytes), sweeps a few
concurrency levels over gRPC and writes perf/reports/<stamp>/report.md and summary.json.
Bounded: each level measures for a fixed interval; the whole run takes a few minutes.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from dispatch_service.paths import REPO_ROOT
from dispatch_service.server import Ports, ServerOptions, TritonRuntime, TritonServer
from dispatch_service.simulator import generate_window
from dispatch_service.window import window_to_tensors

SIZES = {"small": (1, 20), "medium": (64, 200)}


def input_data_file(path: Path, orders: int, riders: int, seeds: range) -> None:
    """perf_analyzer's --input-data JSON: one entry per simulated window."""
    entries = []
    for seed in seeds:
        tensors = window_to_tensors(generate_window(np.random.default_rng(seed), orders, riders))
        entry: dict[str, Any] = {}
        for name, array in tensors.items():
            content = (
                [v.decode() for v in array.reshape(-1)]
                if array.dtype.kind == "O"
                else array.reshape(-1).tolist()
            )
            entry[name] = {"content": content, "shape": list(array.shape)}
        entries.append(entry)
    path.write_text(json.dumps({"data": entries}))


def run_perf_analyzer(
    binary: str, library_path: str, url: str, data: Path, concurrency: str, out_csv: Path
) -> str:
    command = [
        binary,
        "-m",
        "dispatch",
        "-u",
        url,
        "-i",
        "grpc",
        "--input-data",
        str(data),
        "--concurrency-range",
        concurrency,
        "--measurement-mode",
        "time_windows",
        "--measurement-interval",
        "4000",
        "--stability-percentage",
        "25",
        "--max-trials",
        "6",
        "-f",
        str(out_csv),
    ]
    env = dict(os.environ, LD_LIBRARY_PATH=library_path)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed:\n{done.stdout[:3000]}\n{done.stderr[:3000]}")
    return " ".join(command)


def read_rows(out_csv: Path) -> list[dict[str, float]]:
    rows = []
    with out_csv.open() as handle:
        for row in csv.DictReader(handle):
            rows.append(
                {
                    "concurrency": float(row["Concurrency"]),
                    "throughput_infer_per_s": float(row["Inferences/Second"]),
                    "p50_ms": float(row["p50 latency"]) / 1000,
                    "p90_ms": float(row["p90 latency"]) / 1000,
                    "p95_ms": float(row["p95 latency"]) / 1000,
                    "p99_ms": float(row["p99 latency"]) / 1000,
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="gRPC host:port of a running server (default: start one)")
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "perf" / "reports")
    args = parser.parse_args()

    venv = Path(sys.prefix)
    site = Path(next(p for p in sys.path if p.endswith("site-packages")))
    perf_bin = str(venv / "bin" / "perf_analyzer")
    perf_libs = str(site / "nvidia" / "cuda_runtime" / "lib")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out / stamp
    out.mkdir(parents=True, exist_ok=True)

    server = None
    url = args.url
    if url is None:
        runtime = TritonRuntime.from_venv(venv, REPO_ROOT / ".triton" / "backends")
        server = TritonServer(runtime, ServerOptions(ports=Ports.free()), out / "server.log")
        server.start()
        url = server.grpc_url
    results: dict[str, Any] = {
        "when": stamp,
        "host": f"{platform.node()} {os.cpu_count()} cores",
        "endpoint": "gRPC",
        "model": "dispatch (ensemble)",
        "sizes": {},
    }
    try:
        for size, (orders, riders) in SIZES.items():
            data = out / f"input_{size}.json"
            input_data_file(data, orders, riders, range(1000, 1008))
            rows: list[dict[str, float]] = []
            for level in args.concurrency.split(","):
                out_csv = out / f"perf_{size}_c{level}.csv"
                command = run_perf_analyzer(
                    perf_bin, perf_libs, url, data, f"{level}:{level}", out_csv
                )
                rows += read_rows(out_csv)
            results["sizes"][size] = {
                "orders": orders,
                "riders": riders,
                "command": command,
                "rows": rows,
            }
    finally:
        if server is not None:
            server.stop()

    (out / "summary.json").write_text(json.dumps(results, indent=2))
    lines = [
        f"# perf_analyzer: dispatch ensemble over gRPC ({stamp})",
        "",
        f"Host: {results['host']}. Server: this checkout's `cpu` profile on loopback.",
        "Inputs: simulator windows (8 distinct per size). Latency is perf_analyzer's client-side",
        "request latency; throughput is windows (inferences) per second.",
        "",
    ]
    for size, block in results["sizes"].items():
        lines += [
            f"## {size}: {block['orders']} orders x {block['riders']} riders",
            "",
            "| concurrency | windows/s | orders/s | p50 ms | p95 ms | p99 ms |",
            "| ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in block["rows"]:
            lines.append(
                f"| {row['concurrency']:.0f} | {row['throughput_infer_per_s']:.1f} | "
                f"{row['throughput_infer_per_s'] * block['orders']:.0f} | {row['p50_ms']:.2f} | "
                f"{row['p95_ms']:.2f} | {row['p99_ms']:.2f} |"
            )
        lines += ["", f"Command: `{block['command']}`", ""]
    (out / "report.md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
