"""Open-loop overload, measured on the server's own cores (`make bench`, or alone).

The server (tritonserver and its stubs) and the load (generator and probes) run on separate
cores (`perf.pinning`: on two cores the server on core 1, the load on core 0). In order:

1. unloaded: the probes alone (`PROBE_RATE_PER_S` each): level 2, level 1 on the priority lane
   (`dispatch_priority`, where `DispatchClient` sends level-1 windows) and level 1 on the
   model itself (Triton's queue order only): their p99;
2. capacity: `perf.overload`'s closed loop at concurrency 64 (the reference): accepted
   windows/s, the capacity every rate is a multiple of, and its p99;
3. open loop at 1.5x and 3x the capacity at the default level (2), a level-2 probe beside it;
4. open loop at 1.5x at level 2 (bulk) with a level-1 probe (the priority trickle) on the
   lane, then the same with the level-1 probe on the model itself.

Each burst lasts `seconds`; the probes keep running `tail_s` after it, so recovery (the first
normal answer after the burst's last send) can be read. A burst whose generator fell behind
its schedule (send-lag p99 > 5 ms) is marked INVALID (`perf.open_loop.lag_verdict`).
Closed-loop storms (`perf.overload.BENCH_RUNS`) stay a robustness test; they are not this.

`python -m perf.overload_bench [--seconds 10] [--tail 2] [--model dispatch_fused]
[--lane dispatch_priority]` starts this checkout's server, pins it and itself, and prints the
figures as JSON (`--lane ''`: no lane, level 1 probed on the model only);
`--url host:port` measures a running server from this process, unpinned (the bench runs
that form itself under `taskset`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import tritonclient.grpc as grpcclient

from dispatch_contract import PRIORITY_LANE_MODEL_NAME
from dispatch_contract.keys import PRIORITY_KEY_ENV
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
    "Probe",
    "main",
    "measure",
    "measure_pinned",
    "probes_of",
    "queue_timeout_ms",
]

FACTORS: Final = (1.5, 3.0)  # open-loop rates, times the measured capacity
PRIORITY_FACTOR: Final = 1.5  # the bulk rate under which the level-1 trickle is probed
BULK_LEVEL: Final = 2
PRIORITY_LEVEL: Final = 1
REFERENCE_CONCURRENCY: Final = 64
# The unloaded probes' keys: level 2, level 1 where a client sends it, and level 1 sent to the
# bulk's own model (Triton's queue order only), beside the lane's figures.
BULK_PROBE: Final = f"probe_level_{BULK_LEVEL}"
PRIORITY_PROBE: Final = f"probe_level_{PRIORITY_LEVEL}"
SAME_MODEL_PROBE: Final = f"{PRIORITY_PROBE}_same_model"
SAME_MODEL_BURST: Final = "priority_same_model"
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


@dataclass(frozen=True)
class Probe:
    """A probe process: one window at a time to `model` at priority `level`."""

    model: str
    level: int


def _probed(
    url: str, bulk_model: str, probe: Probe, plan: OpenLoopPlan, rate: float
) -> tuple[list[Send], list[Send], float, float]:
    """A probe around one phase: an open-loop burst of level-2 windows to `bulk_model` at
    `rate` (0: none). Returns the probe's sends, the burst's sends, its start and its end."""
    context = multiprocessing.get_context("spawn")  # no fork of a process with gRPC threads
    commands, answers = context.Queue(), context.Queue()
    process = context.Process(
        target=probe_process,
        args=(url, probe.model, probe.level, commands, answers),
        daemon=True,
    )
    process.start()
    try:
        answers.get(timeout=_START_S)
        start = time.monotonic() + 0.3
        commands.put((start, start + plan.seconds + plan.tail_s))
        sends: list[Send] = []
        end = start + plan.seconds
        if rate > 0:
            sends, end = open_loop(
                url, bulk_model, rate, plan.seconds, level=BULK_LEVEL, start=start
            )
        _, probed = answers.get(timeout=plan.seconds + plan.tail_s + _START_S)
    finally:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
    return probed, sends, start, end


def _unloaded(url: str, probes: Mapping[str, Probe], plan: OpenLoopPlan) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, probe in probes.items():  # one probe at a time: each measured alone
        sends, _, _, _ = _probed(url, probe.model, probe, OpenLoopPlan(plan.seconds, 0.0), 0.0)
        out[key] = {"model": probe.model, **sends_summary(sends, plan.seconds)}
    return out


def _burst(
    url: str,
    model: str,
    plan: OpenLoopPlan,
    rate: float,
    *,
    probe: Probe,
    normal_ms: float | None,
) -> dict[str, Any]:
    sends_of_probe, sends, start, end = _probed(url, model, probe, plan, rate)
    during = [s for s in sends_of_probe if s.sent < end]
    recovery = recovery_s(sends_of_probe, end, normal_ms) if normal_ms is not None else None
    return {
        "rate_per_s": rate,
        "bulk_level": BULK_LEVEL,
        "burst_s": end - start,
        "generator": {
            **sends_summary(sends, end - start),
            **lag_verdict([s.lag_ms for s in sends]),
        },
        "probe_model": probe.model,
        "probe_level": probe.level,
        "probe": sends_summary(during, end - start),
        "probe_after_burst": sends_summary(
            [s for s in sends_of_probe if s.sent >= end], plan.tail_s
        ),
        "normal_ms": normal_ms,
        "recovery_s": recovery,
        "recovered": recovery is not None,
    }


def probes_of(model: str, lane: str | None) -> dict[str, Probe]:
    """The unloaded probes: level 2 on `model`, level 1 where a client sends it (the lane, at
    its default level as `DispatchClient` sends it: the lane has no level 1; or `model`
    without one) and, beside a lane, level 1 on `model` itself."""
    probes = {
        BULK_PROBE: Probe(model, BULK_LEVEL),
        PRIORITY_PROBE: Probe(lane, 0) if lane else Probe(model, PRIORITY_LEVEL),
    }
    if lane:
        probes[SAME_MODEL_PROBE] = Probe(model, PRIORITY_LEVEL)
    return probes


def measure(
    url: str,
    model: str,
    plan: OpenLoopPlan,
    say: Callable[[str], None] = print,
    *,
    lane: str | None = PRIORITY_LANE_MODEL_NAME,
) -> dict[str, Any]:
    """Every phase against a running server, from this process (pin it first)."""
    client = grpcclient.InferenceServerClient(url)
    try:
        config = client.get_model_config(model, as_json=True)
    finally:
        client.close()
    out: dict[str, Any] = {
        "model": model,
        "lane": lane,
        "seconds": plan.seconds,
        "tail_s": plan.tail_s,
        "queue_timeout_ms": queue_timeout_ms(config, BULK_LEVEL),
    }
    probes = probes_of(model, lane)
    alone = ", ".join(f"{probe.model} level {probe.level}" for probe in probes.values())
    say(f"open loop: probes alone ({alone})")
    out["unloaded"] = _unloaded(url, probes, plan)
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
    normal = {key: normal_latency_ms(out["unloaded"][key]["accepted_p99_ms"]) for key in probes}
    bursts: dict[str, Any] = {}
    for factor in FACTORS:
        say(f"open loop: {factor:g}x capacity ({factor * capacity:,.0f}/s), level-2 probe")
        bursts[f"{factor:g}x"] = _burst(
            url,
            model,
            plan,
            factor * capacity,
            probe=probes[BULK_PROBE],
            normal_ms=normal[BULK_PROBE],
        )
    trickles = {"priority": PRIORITY_PROBE}
    if lane:
        trickles[SAME_MODEL_BURST] = SAME_MODEL_PROBE
    for name, key in trickles.items():
        probe = probes[key]
        say(f"open loop: level-1 probe on {probe.model} under level-2 bulk at {PRIORITY_FACTOR:g}x")
        bursts[name] = _burst(
            url, model, plan, PRIORITY_FACTOR * capacity, probe=probe, normal_ms=normal[key]
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
    lane: str | None = PRIORITY_LANE_MODEL_NAME,
    priority_key: str | None = None,
) -> dict[str, Any]:
    """Pin the server's process tree to its cores, run `measure` in a child process under
    `taskset` on the load's cores, then give the server every core back. ``priority_key``:
    the server's, which the lane's probe sends (through the child's environment)."""
    split = split or split_cores()
    everything = sorted(set(split.server) | set(split.load))
    with tempfile.TemporaryDirectory(prefix="dispatch-open-loop-") as tmp:
        out = Path(tmp) / "open_loop.json"
        command = [
            sys.executable, "-m", "perf.overload_bench", "--url", grpc_url, "--model", model,
            "--seconds", str(plan.seconds), "--tail", str(plan.tail_s), "--out", str(out),
            "--lane", lane or "",
        ]  # fmt: skip
        pinned: list[int] = []
        if split.pinned:
            pinned = pin_tree(server_pid, split.server)
            command = ["taskset", "-c", cpu_list(split.load), *command]
        say(f"open loop: {split.describe()} ({len(pinned)} server processes pinned)")
        try:
            limit = 10 * (plan.seconds + plan.tail_s) + 300
            env = {**os.environ, **({PRIORITY_KEY_ENV: priority_key} if priority_key else {})}
            subprocess.run(command, cwd=REPO_ROOT, check=True, timeout=limit, env=env)
            figures: dict[str, Any] = json.loads(out.read_text())
        finally:
            if split.pinned:
                pin_tree(server_pid, everything)
    figures["cores"] = split.describe()
    figures["server_processes_pinned"] = len(pinned)
    return figures


def _serve_and_measure(model: str, plan: OpenLoopPlan, lane: str | None) -> dict[str, Any]:
    from perf.sessions import TritonSession  # starts servers: only for the standalone form

    with (
        tempfile.TemporaryDirectory(prefix="dispatch-open-loop-") as tmp,
        TritonSession(MODEL_REPOSITORY, Path(tmp) / "tritonserver.log") as triton,
    ):
        process = triton.server.process
        if process is None:
            raise RuntimeError("tritonserver did not start")
        return measure_pinned(
            triton.endpoints.grpc,
            process.pid,
            model,
            plan,
            lane=lane,
            priority_key=triton.server.priority_key,
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="gRPC host:port of a running server (loopback)")
    parser.add_argument("--model", default="dispatch_fused")
    parser.add_argument(
        "--lane",
        default=PRIORITY_LANE_MODEL_NAME,
        help="where level-1 windows go ('' for --model; default: %(default)s)",
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tail", type=float, default=2.0)
    parser.add_argument("--out", type=Path, help="write the JSON here instead of printing it")
    args = parser.parse_args(argv)
    plan = OpenLoopPlan(args.seconds, args.tail)
    if args.url:
        figures = measure(
            args.url,
            args.model,
            plan,
            lambda text: print(text, file=sys.stderr),
            lane=args.lane or None,
        )
    else:
        figures = _serve_and_measure(args.model, plan, args.lane or None)
    text = json.dumps(figures, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
