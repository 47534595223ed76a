"""What decision records cost the request path: `dispatch_fused` with records on and off.

Two servers of the same repository side by side, one writing decision records into an
SQLite store (`ServerOptions.outcome_store`), one without; rounds alternate between them
(so a drift of the host's load spreads over both) and each round is a closed-loop level of
small windows at ``--concurrency`` (default 64) over HTTP with the binary tensor extension
(`perf.loadgen`). Every request carries its own request id, as `DispatchClient` sends them
(a window without one is not recorded, so perf_analyzer, which sends none, cannot measure
this). The store is not emptied between rounds: it grows by every round's records, as a
serving store does.

After each level the next waits until every request of the level is in the store (the
writer's last batch lands after the answers; its work must not fall into the other arm's
level), and that wait is reported. Beside the throughput, each level's server CPU (Triton
and its stubs, user + system) per request sent, warm-ups included: the cost itself, which
the host's other load blurs far less than it blurs a throughput. Prints each round and the
median ratios on / off; writes a JSON report
(`perf/reports/decision-log-cost-<time>.json`).

    python -m perf.decision_log_cost [--rounds 5] [--requests 3000] [--concurrency 64]
                                     [--in-process 6000] [--out FILE]

``--in-process N`` first measures the same in this process, away from Triton and the
network: `FusedDispatch.run` over N small windows with records (a `DecisionWriter` on a
fresh SQLite store, each window handed over as `dispatch_fused` hands it) and N without, in
alternating blocks of 250; the median CPU per window of the process and of the request
thread, the writer thread's, and the median over adjacent off / on blocks of the CPU
records add and of the ratio. ``--rounds 0`` measures that alone.

Not a test. The figure is only as quiet as the host: say what else ran.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tritonclient.http as httpclient

from dispatch_contract import batched, spec_by_name
from dispatch_service.core.model_config import config_parameters, profile_config_path
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from dispatch_service.outcomes.sql_store import open_store
from dispatch_service.outcomes.writer import DecisionWriter
from dispatch_service.pipeline.fused import FusedDispatch
from dispatch_service.routing.settings import FUSED_MODEL_NAME, FusedSettings
from dispatch_service.serving.decision_log import fused_answered_window
from perf.bodies import OUTPUT_NAMES, RequestBody, triton_infer_path
from perf.loadgen import LoadPlan, run_load
from perf.outcomes_bench import report_path
from perf.server_cpu import server_cpu_s
from perf.windows import SIZES, simulated_windows

__all__ = ["bodies_with_ids", "in_process_cost", "main"]

MODEL = "dispatch_fused"
# How long the next level waits at most for the last level's records to be in the store.
SETTLE_TIMEOUT_S = 60.0
# Windows per block of the in-process measurement (about a third of a second each).
IN_PROCESS_BLOCK = 250


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


def recorded(store: Path) -> int:
    """Decisions in the store (0 before the first is written)."""
    if not store.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{store}?mode=ro", uri=True)) as conn:
        try:
            return int(conn.execute("SELECT COUNT(*) FROM decisions").fetchone()[0])
        except sqlite3.OperationalError:  # the schema is not made yet
            return 0


def settle(store: Path, expected: int) -> float:
    """Seconds until the store holds ``expected`` decisions (SETTLE_TIMEOUT_S at most)."""
    start = time.perf_counter()
    while recorded(store) < expected and time.perf_counter() - start < SETTLE_TIMEOUT_S:
        time.sleep(0.05)
    return time.perf_counter() - start


def _thread_cpu_s(native_id: int) -> float:
    """CPU seconds of one thread of this process, to the nanosecond (Linux
    ``/proc/self/task/<id>/schedstat``: its time on a CPU, where ``stat`` counts 10 ms ticks)."""
    return int(Path(f"/proc/self/task/{native_id}/schedstat").read_text().split()[0]) / 1e9


def in_process_cost(windows: int, block: int = IN_PROCESS_BLOCK) -> dict[str, Any]:
    """Microseconds of CPU per small window that `FusedDispatch.run` costs in this process
    with records and without, and the writer thread's share: what a stub pays for its
    records, which the host's other load moves little.

    ``windows`` per arm, in blocks of ``block`` alternating off / on (the order swapped
    each pair, so that a drift of the host's load falls on both); the request thread's
    figure is the median over the blocks. One writer on a fresh SQLite store takes the on
    blocks' windows as `dispatch_fused` hands them and writes while the next windows run,
    as in a stub; each on block ends with a flush, so none of its batches falls into an off
    block."""
    settings = FusedSettings.from_parameters(
        config_parameters(profile_config_path(MODEL_REPOSITORY / FUSED_MODEL_NAME))
    )
    dispatch = FusedDispatch.from_repository(MODEL_REPOSITORY, settings)
    inputs = simulated_windows(SIZES["small"])
    for window in inputs:  # warm-up
        dispatch.run(window)
    store = Path(tempfile.mkdtemp(prefix="decision-log-cost-in-process-")) / "o.sqlite3"
    writer = DecisionWriter(lambda: open_store(store))
    blocks = max(1, windows // block)
    request: dict[str, list[float]] = {"off": [], "on": []}
    process: dict[str, list[float]] = {"off": [], "on": []}
    writing = 0.0
    sent = 0
    try:
        for pair in range(blocks):
            for name in ("off", "on") if pair % 2 == 0 else ("on", "off"):
                before_writer = _thread_cpu_s(writer.thread_id)
                cpu, thread = time.process_time(), time.thread_time()
                for n in range(block):
                    result = dispatch.run(inputs[n % len(inputs)])
                    if name == "on":
                        sent += 1
                        answered = fused_answered_window(f"in-process-{sent}", MODEL, result)
                        if answered is not None:
                            writer.submit(answered)
                if name == "on":
                    writer.flush(60.0)
                request[name].append((time.thread_time() - thread) / block)
                process[name].append((time.process_time() - cpu) / block)
                writing += _thread_cpu_s(writer.thread_id) - before_writer
        written = writer.counts.written
    finally:
        writer.close()
    per_window = {
        "off": round(1e6 * statistics.median(process["off"]), 1),
        "on": round(1e6 * statistics.median(process["on"]), 1),
        "off_request_thread": round(1e6 * statistics.median(request["off"]), 1),
        "on_request_thread": round(1e6 * statistics.median(request["on"]), 1),
        "writer": round(1e6 * writing / (blocks * block), 1),
    }
    # each pair's blocks ran side by side: their difference is what the host's drift blurs least
    paired = [on - off for off, on in zip(process["off"], process["on"], strict=True)]
    return {
        "windows_per_arm": blocks * block,
        "block": block,
        "records_written": written,
        "cpu_us_per_window": per_window,
        "cpu_ratio_off_on": round(per_window["off"] / per_window["on"], 3),
        "paired_cpu_us_added": round(1e6 * statistics.median(paired), 1),
        "paired_cpu_ratio_off_on": round(
            statistics.median(
                off / on for off, on in zip(process["off"], process["on"], strict=True)
            ),
            3,
        ),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _ratios(rounds: dict[str, list[dict[str, Any]]], key: str) -> list[float]:
    return [
        round(on[key] / off[key], 3) for on, off in zip(rounds["on"], rounds["off"], strict=True)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="0: the in-process figure alone")
    parser.add_argument("--requests", type=int, default=3000, help="per round and server")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--in-process", type=int, default=0, help="windows per arm, in process (0: none)"
    )
    parser.add_argument("--out", type=Path, default=None, help="default: perf/reports/")
    args = parser.parse_args(argv)
    in_process = in_process_cost(args.in_process) if args.in_process else None
    if in_process is not None:
        print(
            f"in process, CPU us per small window: {in_process['cpu_us_per_window']}, "
            f"off/on {in_process['cpu_ratio_off_on']}, paired blocks: "
            f"{in_process['paired_cpu_us_added']} us added, off/on "
            f"{in_process['paired_cpu_ratio_off_on']}",
            flush=True,
        )
    command = " ".join(["python -m perf.decision_log_cost", *(argv or sys.argv[1:])])
    out = args.out or report_path("decision-log-cost")
    if args.rounds < 1:
        out.write_text(json.dumps({"command": command, "in_process": in_process}, indent=2) + "\n")
        print(f"report: {out}")
        return 0
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
    expected = 0  # requests answered by the server with records: one record each
    try:
        for round_no in range(args.rounds):
            share = bodies[round_no * args.requests : (round_no + 1) * args.requests]
            order = ("on", "off") if round_no % 2 == 0 else ("off", "on")
            for name in order:
                server = servers[name]
                url = f"http://{server.http_url}{triton_infer_path(MODEL)}"
                plan = LoadPlan(url, share, args.concurrency, len(share), 600.0)
                cpu_before = server_cpu_s(server)
                result = run_load(plan)
                stats = result.stats()
                level = stats.to_dict()
                if name == "on":
                    expected += len(result.latencies_s)
                    level["settle_s"] = round(settle(store, expected), 3)
                    level["store_decisions"] = recorded(store)
                level["load_average_1m"] = round(os.getloadavg()[0], 2)  # the host's noise
                level["server_cpu_ms_per_request"] = round(
                    1000.0 * (server_cpu_s(server) - cpu_before) / (len(share) + args.concurrency),
                    3,
                )
                rounds[name].append(level)
                print(
                    f"round {round_no} records {name}: {stats.throughput_per_s:.1f}/s "
                    f"p50 {stats.p50_ms:.1f} ms p99 {stats.p99_ms:.1f} ms errors {stats.errors} "
                    f"server CPU {level['server_cpu_ms_per_request']:.3f} ms/request "
                    f"load {level['load_average_1m']}"
                    + (
                        f" store {level['store_decisions']} settled in {level['settle_s']} s"
                        if name == "on"
                        else ""
                    ),
                    flush=True,
                )
    finally:
        for server in servers.values():
            server.stop()
            server.release()
    ratios = _ratios(rounds, "throughput_per_s")
    cpu_ratios = _ratios(rounds, "server_cpu_ms_per_request")
    decisions = recorded(store)
    report = {
        "command": command,
        "model": MODEL,
        "window": "small (1 order x 20 riders)",
        "concurrency": args.concurrency,
        "requests_per_round": args.requests,
        "rounds": rounds,
        "throughput_ratio_on_off": ratios,
        "median_ratio_on_off": round(statistics.median(ratios), 3),
        "server_cpu_ratio_on_off": cpu_ratios,
        "median_server_cpu_ratio_on_off": round(statistics.median(cpu_ratios), 3),
        "decisions_recorded": decisions,
        "requests_answered_with_records": expected,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "in_process": in_process,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"median throughput on/off {report['median_ratio_on_off']}, server CPU per request "
        f"on/off {report['median_server_cpu_ratio_on_off']}; {decisions} decisions for "
        f"{expected} answered requests; report: {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
