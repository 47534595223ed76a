"""Open-loop overload, measured on the server's own cores (`make bench`, or alone).

The server (tritonserver and its stubs) and the load (generator and probes) run on separate
cores (`perf.pinning`: on two cores the server on core 1, the load on core 0). In order:

1. unloaded: the probes alone (level 2 and level 1, `PROBE_RATE_PER_S` each): their p99;
2. capacity: `perf.overload`'s closed loop at concurrency 64 (the reference): accepted
   windows/s, the capacity every rate is a multiple of, and its p99;
3. open loop at 1.5x and 3x the capacity at the default level (2), a level-2 probe beside it;
4. open loop at 1.5x at level 2 (bulk) with a level-1 probe (the priority trickle).

Each burst lasts `seconds`; the probes keep running `tail_s` after it, so recovery (the first
normal answer after the burst's last send) can be read. A burst whose generator fell behind
its schedule (send-lag p99 > 5 ms) is marked INVALID (`perf.open_loop.lag_verdict`).
Closed-loop storms (`perf.overload.BENCH_RUNS`) stay a robustness test; they are not this.

`python -m perf.overload_bench [--seconds 10] [--tail 2] [--model dispatch_fused]` starts
this checkout's server, pins it and itself, and prints the figures as JSON;
`--url host:port` measures a running server from this process, unpinned (the bench runs
that form itself under `taskset`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import tritonclient.grpc as grpcclient

from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from perf.open_loop import (
    Send,
    lag_verdict,
    normal_latency_ms,
    open_loop,
    probe_process,
    recovery_s,
    sends_summary,
)
from perf.overload import run_overload
from perf.pinning import CoreSplit, cpu_list, pin_tree, split_cores

__all__ = [
    "BULK_LEVEL",
    "FACTORS",
    "PRIORITY_FACTOR",
    "PRIORITY_LEVEL",
    "OpenLoopPlan",
    "main",
    "measure",
    "measure_pinned",
    "queue_timeout_ms",
]

FACTORS: Final = (1.5, 3.0)  # open-loop rates, times the measured capacity
PRIORITY_FACTOR: Final = 1.5  # the bulk rate under which the level-1 trickle is probed
BULK_LEVEL: Final = 2
PRIORITY_LEVEL: Final = 1
REFERENCE_CONCURRENCY: Final = 64
_START_S: Final = 60.0  # the most a probe process may take to start (imports, connect)


@dataclass(frozen=True)
class OpenLoopPlan:
    seconds: float  # each phase (unloaded probes, capacity, each burst)
    tail_s: float  # the probes keep watching this long after a burst


def queue_timeout_ms(config: dict[str, Any], level: int) -> float | None:
    """The queue timeout (ms) the served config gives `level` (its priority policy, else the
    default policy); None when it sets none. `config`: get_model_config(as_json=True)."""
    batching = config.get("config", config).get("dynamic_batching", {})
    policies = batching.get("priority_queue_policy", {})
    policy = policies.get(str(level)) or batching.get("default_queue_policy") or {}
    micros = policy.get("default_timeout_microseconds")
    return float(micros) / 1000.0 if micros not in (None, "0", 0) else None


def _probed(
    url: str, model: str, probe_levels: Sequence[int], plan: OpenLoopPlan, rate: float
) -> tuple[dict[int, list[Send]], list[Send], float, float]:
    """Probes at `probe_levels` around one phase: an open-loop burst at `rate` (0: none).
    Returns the probes' sends per level, the burst's sends, its start and its end."""
    context = multiprocessing.get_context("spawn")  # no fork of a process with gRPC threads
    commands, answers = context.Queue(), context.Queue()
    probes = [
        context.Process(
            target=probe_process, args=(url, model, level, commands, answers), daemon=True
        )
        for level in probe_levels
    ]
    for process in probes:
        process.start()
    try:
        for _ in probes:
            answers.get(timeout=_START_S)
        start = time.monotonic() + 0.3
        for _ in probes:
            commands.put((start, start + plan.seconds + plan.tail_s))
        sends: list[Send] = []
        end = start + plan.seconds
        if rate > 0:
            sends, end = open_loop(url, model, rate, plan.seconds, level=BULK_LEVEL, start=start)
        seen = [answers.get(timeout=plan.seconds + plan.tail_s + _START_S) for _ in probes]
    finally:
        for process in probes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    by_level: dict[int, list[Send]] = {level: [] for level in probe_levels}
    by_level.update(dict(seen))
    return by_level, sends, start, end


def _unloaded(url: str, model: str, plan: OpenLoopPlan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for level in (BULK_LEVEL, PRIORITY_LEVEL):  # one probe at a time: each measured alone
        probes, _, _, _ = _probed(url, model, [level], OpenLoopPlan(plan.seconds, 0.0), 0.0)
        out[f"probe_level_{level}"] = sends_summary(probes[level], plan.seconds)
    return out


def _burst(
    url: str,
    model: str,
    plan: OpenLoopPlan,
    rate: float,
    *,
    probe_level: int,
    normal_ms: float | None,
) -> dict[str, Any]:
    probes, sends, start, end = _probed(url, model, [probe_level], plan, rate)
    probe = probes[probe_level]
    during = [s for s in probe if s.sent < end]
    recovery = recovery_s(probe, end, normal_ms) if normal_ms is not None else None
    return {
        "rate_per_s": rate,
        "bulk_level": BULK_LEVEL,
        "burst_s": end - start,
        "generator": {
            **sends_summary(sends, end - start),
            **lag_verdict([s.lag_ms for s in sends]),
        },
        "probe_level": probe_level,
        "probe": sends_summary(during, end - start),
        "probe_after_burst": sends_summary([s for s in probe if s.sent >= end], plan.tail_s),
        "normal_ms": normal_ms,
        "recovery_s": recovery,
        "recovered": recovery is not None,
    }


def measure(
    url: str, model: str, plan: OpenLoopPlan, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Every phase against a running server, from this process (pin it first)."""
    client = grpcclient.InferenceServerClient(url)
    try:
        config = client.get_model_config(model, as_json=True)
    finally:
        client.close()
    out: dict[str, Any] = {
        "model": model,
        "seconds": plan.seconds,
        "tail_s": plan.tail_s,
        "queue_timeout_ms": queue_timeout_ms(config, BULK_LEVEL),
    }
    say(f"open loop: probes alone at levels {BULK_LEVEL} and {PRIORITY_LEVEL}")
    out["unloaded"] = _unloaded(url, model, plan)
    say(f"open loop: capacity, closed loop at c={REFERENCE_CONCURRENCY}")
    reference = run_overload(url, model, REFERENCE_CONCURRENCY, plan.seconds).summary()
    level = reference.get("level_2", {})
    capacity = level.get("accepted_per_s") or 0.0
    out["capacity"] = {
        "concurrency": REFERENCE_CONCURRENCY,
        "accepted_per_s": capacity,
        "accepted_p99_ms": level.get("accepted_p99_ms"),
        "refused": level.get("refused", 0),
    }
    if capacity <= 0:
        out["error"] = "no capacity measured: nothing accepted at c=64"
        return out
    normal = {
        lvl: normal_latency_ms(out["unloaded"][f"probe_level_{lvl}"]["accepted_p99_ms"])
        for lvl in (BULK_LEVEL, PRIORITY_LEVEL)
    }
    bursts: dict[str, Any] = {}
    for factor in FACTORS:
        say(f"open loop: {factor:g}x capacity ({factor * capacity:,.0f}/s), level-2 probe")
        bursts[f"{factor:g}x"] = _burst(
            url,
            model,
            plan,
            factor * capacity,
            probe_level=BULK_LEVEL,
            normal_ms=normal[BULK_LEVEL],
        )
    say(f"open loop: level-1 probe under level-2 bulk at {PRIORITY_FACTOR:g}x")
    bursts["priority"] = _burst(
        url,
        model,
        plan,
        PRIORITY_FACTOR * capacity,
        probe_level=PRIORITY_LEVEL,
        normal_ms=normal[PRIORITY_LEVEL],
    )
    out["bursts"] = bursts
    return out


def measure_pinned(
    grpc_url: str,
    server_pid: int,
    model: str,
    plan: OpenLoopPlan,
    *,
    say: Callable[[str], None] = print,
    split: CoreSplit | None = None,
) -> dict[str, Any]:
    """Pin the server's process tree to its cores, run `measure` in a child process under
    `taskset` on the load's cores, then give the server every core back."""
    split = split or split_cores()
    everything = sorted(set(split.server) | set(split.load))
    with tempfile.TemporaryDirectory(prefix="dispatch-open-loop-") as tmp:
        out = Path(tmp) / "open_loop.json"
        command = [
            sys.executable, "-m", "perf.overload_bench", "--url", grpc_url, "--model", model,
            "--seconds", str(plan.seconds), "--tail", str(plan.tail_s), "--out", str(out),
        ]  # fmt: skip
        pinned: list[int] = []
        if split.pinned:
            pinned = pin_tree(server_pid, split.server)
            command = ["taskset", "-c", cpu_list(split.load), *command]
        say(f"open loop: {split.describe()} ({len(pinned)} server processes pinned)")
        try:
            limit = 10 * (plan.seconds + plan.tail_s) + 300
            subprocess.run(command, cwd=REPO_ROOT, check=True, timeout=limit)
            figures: dict[str, Any] = json.loads(out.read_text())
        finally:
            if split.pinned:
                pin_tree(server_pid, everything)
    figures["cores"] = split.describe()
    figures["server_processes_pinned"] = len(pinned)
    return figures


def _serve_and_measure(model: str, plan: OpenLoopPlan) -> dict[str, Any]:
    from perf.sessions import TritonSession  # starts servers: only for the standalone form

    with (
        tempfile.TemporaryDirectory(prefix="dispatch-open-loop-") as tmp,
        TritonSession(MODEL_REPOSITORY, Path(tmp) / "tritonserver.log") as triton,
    ):
        process = triton.server.process
        if process is None:
            raise RuntimeError("tritonserver did not start")
        return measure_pinned(triton.endpoints.grpc, process.pid, model, plan)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="gRPC host:port of a running server (loopback)")
    parser.add_argument("--model", default="dispatch_fused")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tail", type=float, default=2.0)
    parser.add_argument("--out", type=Path, help="write the JSON here instead of printing it")
    args = parser.parse_args(argv)
    plan = OpenLoopPlan(args.seconds, args.tail)
    if args.url:
        figures = measure(args.url, args.model, plan, lambda text: print(text, file=sys.stderr))
    else:
        figures = _serve_and_measure(args.model, plan)
    text = json.dumps(figures, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
