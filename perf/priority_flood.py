"""A keyed level-1 client's latency while callers without the priority key flood level 1.

Starts its own launcher on free loopback ports, then runs ``--rounds`` rounds; each round
measures every variant in turn (alternating, so both see the same host load):

- ``unloaded``: ``--calls`` keyed level-1 windows (`DispatchClient` with the priority key,
  so they go to the lane `dispatch_priority`), nothing else running;
- then, for each variant, the bulk models' stubs are put in that variant's CPU state and
  ``--flooders`` callers without the key (in ``--processes`` processes, each caller a thread
  with its own gRPC channel) send level-1 windows to `dispatch_priority` and
  `dispatch_fused` in turn as fast as they are answered, while the keyed client sends
  ``--calls`` windows and a level-2 client on `dispatch_fused` sends ``--calls // 2``.

Variants, set by this script on every thread of the bulk stubs (every stub but the lane's)
before each flood: ``sched-other`` (the kernel's default policy, as the launcher runs them),
``sched-batch`` (the kernel's policy for CPU-bound threads, whose wake-up never preempts a
running thread: sched(7)). Their niceness is the stubs' own (``stub_nice``: 10, the lane's
0) in both. ``--flood-idle`` runs the flood's processes in
SCHED_IDLE, as if the callers ran on other hosts: then what competes with the lane is the
server's own work (and whatever else the host runs).

Each measurement records the answered share and p50/p99 of both clients, the flood's
outcomes, ``uptime`` before and after, and where the host's CPU went meanwhile (CPU seconds
of Triton's own threads, the lane's stubs, the bulk stubs, the flood's processes, the rest).
Timings are reported, not asserted: `perf/reports/priority-flood-<stamp>/report.json` and
`report.md`. `python -m perf.priority_flood --help`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from dispatch_client import DispatchClient
from dispatch_client.errors import DispatchError
from dispatch_service.core.repository_layout import FUSED_MODEL, PRIORITY_MODEL
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.ops.stubs import stub_models
from perf.deadline_burst import (
    BurstSettings,
    _start_launcher,
    classify,
    wait_ready,
    window_inputs,
)

__all__ = ["main"]

REPO_ROOT = Path(__file__).resolve().parent.parent
LANE = PRIORITY_MODEL
FUSED = FUSED_MODEL
# The models whose stubs are the lane's; every other stub is a bulk one.
LANE_MODELS = frozenset({PRIORITY_MODEL})
# Scheduling policy of the bulk stubs' threads in each variant.
VARIANTS = {"sched-other": os.SCHED_OTHER, "sched-batch": os.SCHED_BATCH}
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _flood_process(
    grpc_url: str, callers: int, *, idle: bool, stop: Any, started: Any, counts: Any
) -> None:
    """``callers`` threads without the key, level 1 into the lane and dispatch_fused in turn;
    ``started`` told once every caller has had an answer; each outcome counted into the
    shared ``counts`` (by model and outcome) on exit. ``idle``: in SCHED_IDLE."""
    if idle:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    inputs = window_inputs(BurstSettings(FUSED, orders=2, riders=8, seed=23))
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    answered = threading.Barrier(callers + 1)

    def caller(n: int) -> None:
        model = (LANE, FUSED)[n % 2]
        first = True
        with grpcclient.InferenceServerClient(grpc_url) as client:
            while not stop.is_set():
                try:
                    client.infer(model, inputs, priority=1, client_timeout=10)
                    kind = "served"
                except InferenceServerException as exc:
                    kind = classify(exc)
                with lock:
                    outcomes[f"{model} {kind}"] += 1
                if first:
                    first = False
                    answered.wait()

    threads = [threading.Thread(target=caller, args=(n,), daemon=True) for n in range(callers)]
    for thread in threads:
        thread.start()
    answered.wait()
    started.put(os.getpid())
    for thread in threads:
        thread.join()
    counts.update(dict(outcomes))


@contextmanager
def flood(
    grpc_url: str, flooders: int, processes: int, idle: bool
) -> Iterator[tuple[dict[str, int], list[int]]]:
    """The flood on while the block runs; yields (outcomes, filled in on exit; the pids)."""
    context = multiprocessing.get_context("spawn")
    manager = context.Manager()
    stop = manager.Event()
    started = manager.Queue()
    counts = manager.dict()
    shares = [
        flooders // processes + (1 if k < flooders % processes else 0) for k in range(processes)
    ]
    workers = [
        context.Process(
            target=_flood_process,
            args=(grpc_url, n),
            kwargs={"idle": idle, "stop": stop, "started": started, "counts": _Merge(counts)},
            daemon=True,
        )
        for n in shares
    ]
    for worker in workers:
        worker.start()
    outcomes: dict[str, int] = {}
    try:
        for _ in workers:
            started.get(timeout=300)  # every caller of every process answered once
        time.sleep(1.0)
        yield outcomes, [w.pid for w in workers if w.pid is not None]
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=60)
            if worker.is_alive():
                worker.kill()
        outcomes.update({k: int(v) for k, v in dict(counts).items()})
        manager.shutdown()


class _Merge:
    """A picklable adder into a manager dict (one call per flood process, on its exit)."""

    def __init__(self, shared: Any) -> None:
        self.shared = shared

    def update(self, counts: dict[str, int]) -> None:
        for key, value in counts.items():
            self.shared[key] = self.shared.get(key, 0) + value


def timed_calls(client: DispatchClient, window: dict[str, Any], calls: int) -> list[float | None]:
    """Each call's seconds, None where it failed."""
    seconds: list[float | None] = []
    for _ in range(calls):
        start = time.perf_counter()
        try:
            client.dispatch(window)
            seconds.append(time.perf_counter() - start)
        except DispatchError:
            seconds.append(None)
    return seconds


def summary(seconds: list[float | None]) -> dict[str, Any]:
    answered = [s * 1000 for s in seconds if s is not None]
    return {
        "answered": len(answered),
        "sent": len(seconds),
        "p50_ms": round(float(np.percentile(answered, 50)), 1) if answered else None,
        "p99_ms": round(float(np.percentile(answered, 99)), 1) if answered else None,
    }


def _cpu_ticks(pid: int) -> int:
    """utime + stime of every thread of ``pid`` (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def _host_ticks() -> int:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(f) for f in fields[:3]) + sum(int(f) for f in fields[5:8])  # busy, no idle


def cpu_groups(triton_pid: int, flood_pids: Sequence[int]) -> dict[str, int]:
    stubs = stub_models(triton_pid)
    groups = {
        "triton": _cpu_ticks(triton_pid),
        "lane_stubs": sum(_cpu_ticks(p) for p, m in stubs.items() if m in LANE_MODELS),
        "bulk_stubs": sum(_cpu_ticks(p) for p, m in stubs.items() if m not in LANE_MODELS),
        "flood": sum(_cpu_ticks(p) for p in flood_pids),
        "host": _host_ticks(),
    }
    return groups


def cpu_spent(before: dict[str, int], after: dict[str, int]) -> dict[str, float]:
    spent = {k: (after[k] - before[k]) / CLOCK_TICKS for k in before}
    spent["other"] = spent["host"] - sum(v for k, v in spent.items() if k != "host")
    return {k: round(v, 1) for k, v in spent.items()}


def thread_ids(pid: int) -> set[int]:
    """The ids of ``pid``'s threads (none when it has ended)."""
    try:
        return {int(name) for name in os.listdir(f"/proc/{pid}/task") if name.isdigit()}
    except OSError:
        return set()


def thread_policies(pid: int) -> dict[int, int]:
    """thread id -> scheduling policy (``os.SCHED_*``) of each of ``pid``'s threads."""
    policies = {}
    for tid in sorted(thread_ids(pid)):
        try:
            policies[tid] = os.sched_getscheduler(tid)
        except OSError:
            continue  # ended meanwhile
    return policies


def set_variant(triton_pid: int, variant: str) -> list[str]:
    """Every thread of the bulk stubs in ``variant``'s policy (their niceness, the stubs'
    own, is left as it is); returns the (policy, niceness) pairs they then have."""
    states = set()
    for pid, model in stub_models(triton_pid).items():
        if model in LANE_MODELS:
            continue
        for tid in sorted(thread_ids(pid)):
            try:
                os.sched_setscheduler(tid, VARIANTS[variant], os.sched_param(0))
                states.add((os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)))
            except OSError:
                continue  # ended meanwhile
    return [f"policy {policy}, nice {nice}" for policy, nice in sorted(states)]


def triton_pid_of(launcher_pid: int) -> int:
    """The tritonserver child of the launcher."""
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            parent = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if comm == "tritonserver" and parent == launcher_pid:
            return int(entry.name)
    raise RuntimeError(f"no tritonserver under launcher {launcher_pid}")


def measure(
    grpc_url: str,
    key: str,
    triton_pid: int,
    variant: str,
    *,
    flooders: int,
    processes: int,
    flood_idle: bool,
    calls: int,
) -> dict[str, Any]:
    window = window_to_wire(generate_window(np.random.default_rng(24), 4, 12))
    keyed = DispatchClient.grpc(grpc_url, model_name=FUSED, priority=1, priority_key=key)
    standard = DispatchClient.grpc(grpc_url, model_name=FUSED, deadline_ms=1000)
    result: dict[str, Any] = {"variant": variant, "uptime_before": uptime()}
    with keyed, standard:
        if variant == "unloaded":
            result["keyed"] = summary(timed_calls(keyed, window, calls))
        else:
            result["bulk_stub_threads"] = set_variant(triton_pid, variant)
            result["lane_stub_policies"] = sorted(
                {
                    policy
                    for pid, model in stub_models(triton_pid).items()
                    if model in LANE_MODELS
                    for policy in thread_policies(pid).values()
                }
            )
            with flood(grpc_url, flooders, processes, flood_idle) as (outcomes, pids):
                start = cpu_groups(triton_pid, pids)
                result["keyed"] = summary(timed_calls(keyed, window, calls))
                result["level_2"] = summary(timed_calls(standard, window, calls // 2))
                result["cpu_s"] = cpu_spent(start, cpu_groups(triton_pid, pids))
            result["flood"] = dict(sorted(outcomes.items()))
    result["uptime_after"] = uptime()
    return result


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Priority lane under a flood without the key",
        "",
        f"{report['flooders']} callers without the key in {report['processes']} processes"
        + (" (SCHED_IDLE)" if report["flood_idle"] else "")
        + "; "
        f"{report['calls']} keyed level-1 calls per measurement. CPU seconds during the "
        "flooded calls: Triton's own threads, the lane's stubs, the bulk stubs, the flood's "
        "processes, everything else.",
        "",
        "| round | variant | keyed answered | keyed p50 ms | keyed p99 ms | p99 / unloaded | "
        "level 2 answered | CPU s (triton/lane/bulk/flood/other) | uptime |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for number, measured in enumerate(report["rounds"], 1):
        unloaded = measured[0]["keyed"]["p99_ms"]
        for run in measured:
            keyed = run["keyed"]
            ratio = (
                f"{keyed['p99_ms'] / unloaded:.1f}"
                if keyed["p99_ms"] is not None and unloaded
                else "-"
            )
            level_2 = run.get("level_2")
            cpu = run.get("cpu_s")
            lines.append(
                f"| {number} | {run['variant']} | {keyed['answered']}/{keyed['sent']} | "
                f"{keyed['p50_ms']} | {keyed['p99_ms']} | {ratio} | "
                + (f"{level_2['answered']}/{level_2['sent']}" if level_2 else "-")
                + " | "
                + (
                    "/".join(
                        str(cpu[k])
                        for k in ("triton", "lane_stubs", "bulk_stubs", "flood", "other")
                    )
                    if cpu
                    else "-"
                )
                + f" | {run['uptime_after'].split('load average:')[-1].strip()} |"
            )
    lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flooders", type=int, default=192)
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument(
        "--flood-idle",
        action="store_true",
        help="the flood's processes in SCHED_IDLE: they take only CPU nothing else wants, as "
        "if the callers ran on other hosts",
    )
    parser.add_argument("--calls", type=int, default=100, help="keyed calls per measurement")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--out", type=Path, default=None, help="report folder")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    folder = args.out or REPO_ROOT / "perf" / "reports" / time.strftime(
        "priority-flood-%Y%m%d-%H%M%S"
    )
    folder.mkdir(parents=True, exist_ok=True)
    log = (folder / "launcher.out").open("w")
    process, grpc_url, health = _start_launcher(folder, [], log)
    report: dict[str, Any] = {
        "flooders": args.flooders,
        "processes": args.processes,
        "flood_idle": args.flood_idle,
        "calls": args.calls,
        "rounds": [],
    }
    try:
        if not wait_ready(health, checks=480, alive=lambda: process.poll() is None):
            out(f"the launcher never became ready: see {folder / 'launcher.out'}")
            return 1
        key = (folder / "keys" / "priority.key").read_text().strip()
        triton_pid = triton_pid_of(process.pid)
        for number in range(args.rounds):
            measured = []
            order = variants if number % 2 == 0 else variants[::-1]
            for variant in ["unloaded", *order]:
                run = measure(
                    grpc_url,
                    key,
                    triton_pid,
                    variant,
                    flooders=args.flooders,
                    processes=args.processes,
                    flood_idle=args.flood_idle,
                    calls=args.calls,
                )
                measured.append(run)
                out(json.dumps(run))
            report["rounds"].append(measured)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=90)
        log.close()
        (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        (folder / "report.md").write_text(_markdown(report))
        out(f"report: {folder / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
