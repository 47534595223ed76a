"""What decision records cost the request path: `dispatch_fused` with records on and off.

Two servers of the same repository side by side, one writing decision records into an
SQLite store (`ServerOptions.outcome_store`), one without; rounds alternate between them
(so a drift of the host's load spreads over both) and each round is a closed-loop level of
small windows at ``--concurrency`` (default 64) over HTTP with the binary tensor extension
(`perf.loadgen`). Every request carries its own request id, as `DispatchClient` sends them
(a window without one is not recorded, so perf_analyzer, which sends none, cannot measure
this). Prints each round and the median throughput ratio on / off; writes a JSON report
(`perf/reports/decision-log-cost-<time>.json`).

    python -m perf.decision_log_cost [--rounds 5] [--requests 3000] [--concurrency 64]
                                     [--out FILE]

Not a test. The figure is only as quiet as the host: say what else ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import tempfile
from pathlib import Path
from typing import Any

import tritonclient.http as httpclient

from dispatch_contract import batched, spec_by_name
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from perf.bodies import OUTPUT_NAMES, RequestBody, triton_infer_path
from perf.loadgen import LoadPlan, run_load
from perf.outcomes_bench import report_path
from perf.windows import SIZES, simulated_windows

__all__ = ["bodies_with_ids", "main"]

MODEL = "dispatch_fused"


def bodies_with_ids(count: int) -> list[RequestBody]:
    """``count`` binary-extension bodies of the small windows, each with its own request id."""
    windows = simulated_windows(SIZES["small"])
    bodies = []
    for n in range(count):
        inputs = []
        for name, array in batched(windows[n % len(windows)]).items():
            tensor = httpclient.InferInput(name, list(array.shape), spec_by_name(name).triton_dtype)
            tensor.set_data_from_numpy(array, binary_data=True)
            inputs.append(tensor)
        outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in OUTPUT_NAMES]
        body, json_size = httpclient.InferenceServerClient.generate_request_body(
            inputs, outputs, request_id=f"cost-{os.getpid()}-{n}"
        )
        headers = {"Content-Type": "application/octet-stream"}
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        bodies.append(RequestBody(bytes(body), headers))
    return bodies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3000, help="per round and server")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="default: perf/reports/")
    args = parser.parse_args(argv)
    runtime = TritonRuntime.from_venv()
    folder = Path(tempfile.mkdtemp(prefix="decision-log-cost-"))
    store = folder / "outcomes.sqlite3"
    variants = {"on": str(store), "off": None}
    bodies = bodies_with_ids(args.requests * args.rounds)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
    servers = {
        name: TritonServer(
            runtime,
            ServerOptions(ports=Ports.free(), outcome_store=path),
            folder / f"server-{name}.log",
        )
        for name, path in variants.items()
    }
    for server in servers.values():
        server.start()
    try:
        for round_no in range(args.rounds):
            share = bodies[round_no * args.requests : (round_no + 1) * args.requests]
            order = ("on", "off") if round_no % 2 == 0 else ("off", "on")
            for name in order:
                url = f"http://{servers[name].http_url}{triton_infer_path(MODEL)}"
                plan = LoadPlan(url, share, args.concurrency, len(share), 600.0)
                stats = run_load(plan).stats()
                rounds[name].append(stats.to_dict())
                print(
                    f"round {round_no} records {name}: {stats.throughput_per_s:.1f}/s "
                    f"p50 {stats.p50_ms:.1f} ms p99 {stats.p99_ms:.1f} ms errors {stats.errors}",
                    flush=True,
                )
    finally:
        for server in servers.values():
            server.stop()
            server.release()
    ratios = [
        on["throughput_per_s"] / off["throughput_per_s"]
        for on, off in zip(rounds["on"], rounds["off"], strict=True)
    ]
    with sqlite3.connect(store) as conn:
        recorded = int(conn.execute("SELECT COUNT(*) FROM decisions").fetchone()[0])
    report = {
        "command": "python -m perf.decision_log_cost " + " ".join(argv or []),
        "model": MODEL,
        "window": "small (1 order x 20 riders)",
        "concurrency": args.concurrency,
        "rounds": rounds,
        "throughput_ratio_on_off": [round(r, 3) for r in ratios],
        "median_ratio_on_off": round(statistics.median(ratios), 3),
        "decisions_recorded": recorded,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    out = args.out or report_path("decision-log-cost")
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"median throughput on/off {report['median_ratio_on_off']}; report: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
