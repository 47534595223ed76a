"""Overload: more callers than the server can serve, and what the bounded queues do with them.

A closed loop of `concurrency` gRPC callers (coroutines on tritonclient's asyncio client,
one channel) sends small windows to one entry point for `seconds`; each caller sends its
next window as soon as its previous answer (or refusal) arrives. Every request records its
priority level, whether it was accepted, its latency and, when refused, the status. A mixed
run makes a share of the callers level-1 tenants (priority orders) and the rest level-3
tenants (bulk); each caller keeps its level. The bench reads these storms as a robustness
test, not as targets: accepted p99 against the same entry point's p99 at concurrency 64,
refusal p99, zero refusals at level 1, and the next request after the burst served. The
overload targets are open loop, on separate cores (`perf.overload_bench`); its capacity
measurement is this generator at concurrency 64.

The generator's own figures are those of one saturated client: its asyncio loop handles
thousands of answers a second on the two cores the server also needs, and an answer may wait
there long after the server sent it. So a run can also start probes: one process per level,
outside the generator, that sends one window every `PROBE_INTERVAL_S` while the burst runs
and times each answer. A probe is what one well-behaved caller sees while others overload the
server, and the honest reading of "a refusal is immediate". Each refusal also keeps its reason:
a full queue ("Exceeds maximum queue size", immediate by design) or an expired deadline
("Request timeout expired", which by definition waits out the deadline).

By default a refused caller sends again at once: the harshest client, whose refusals become a
storm of new requests. `--backoff` makes every caller behave like `DispatchClient` with its
default `RetryPolicy`: a refused window is sent again after a jittered backoff, at most
`attempts` times and while the generator's one `RetryThrottle` (one client, as all callers
share one channel) allows, then the caller moves on to its next window at once. Every send is one
outcome either way, so accepted and refused figures mean the same in both modes.

`python -m perf.overload --url 127.0.0.1:8001 --model dispatch_fused --concurrency 512
--seconds 5 [--priority-share 0.1] [--probe-levels 1,3] [--backoff]` prints the figures as JSON
(loopback only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from dispatch_client.retry import DEFAULT_RETRY, RetryPolicy, RetryThrottle
from dispatch_client.transport import grpc_error
from dispatch_contract import DISPATCH_ENSEMBLE_OUTPUTS, batched
from perf.loadgen import require_loopback
from perf.windows import SIZES, simulated_windows

__all__ = [
    "BENCH_RUNS",
    "MAX_CONCURRENCY",
    "MIXED_RUN",
    "OVERLOAD_RUN",
    "PROBE_INTERVAL_S",
    "REFERENCE_RUN",
    "Outcome",
    "OverloadResult",
    "grpc_inputs",
    "level_summary",
    "main",
    "refusal_reason",
    "run_bench_runs",
    "run_overload",
]

# The target load is 3,000 concurrent callers; the bound keeps the load finite.
MAX_CONCURRENCY = 4096
# The bench's three runs of this generator (perf.bench, perf.targets): the same callers at
# concurrency 64, the reference every overload figure is read against (same client on both
# sides); 512 callers at the default level; 512 callers, 10 % level 1 and the rest level 3.
REFERENCE_RUN: Final = "concurrency 64"
OVERLOAD_RUN: Final = "overload"
MIXED_RUN: Final = "mixed-priority overload"
# Each run: (label, callers, share of level-1 callers or None for all standard, probe levels).
BENCH_RUNS: Final = (
    (REFERENCE_RUN, 64, None, (2,)),
    (OVERLOAD_RUN, 512, None, (2,)),
    (MIXED_RUN, 512, 0.1, (1, 3)),
)
PROBE_INTERVAL_S: Final = 0.02  # a probe's pause between its answer and its next window
_PROBE_START_S: Final = 30.0  # the most a probe process may take to start (import, connect)


@dataclass(frozen=True)
class Outcome:
    level: int
    accepted: bool
    latency_ms: float
    status: str = ""
    reason: str = ""  # a refusal's: "queue full", "deadline" or "other"


def refusal_reason(message: str) -> str:
    """Why Triton refused: its queue policy's two messages, or anything else."""
    text = message.lower()
    if "exceeds maximum queue size" in text:
        return "queue full"
    if "timeout expired" in text:
        return "deadline"
    return "other"


def level_summary(outcomes: Sequence[Outcome], seconds: float) -> dict[str, Any]:
    """Counts and latencies of one level's outcomes (accepted, refused, and refused because
    the queue was full: the refusals that must be immediate)."""
    accepted = [o.latency_ms for o in outcomes if o.accepted]
    refused = [o for o in outcomes if not o.accepted]
    full = [o.latency_ms for o in refused if o.reason == "queue full"]
    reasons: dict[str, int] = {}
    for outcome in refused:
        reasons[outcome.reason or "other"] = reasons.get(outcome.reason or "other", 0) + 1
    return {
        "accepted": len(accepted),
        "refused": len(refused),
        "accepted_per_s": len(accepted) / seconds,
        "accepted_p50_ms": _percentile(accepted, 50),
        "accepted_p99_ms": _percentile(accepted, 99),
        "refusal_p50_ms": _percentile([o.latency_ms for o in refused], 50),
        "refusal_p99_ms": _percentile([o.latency_ms for o in refused], 99),
        "queue_full_refusal_p99_ms": _percentile(full, 99),
        "refusal_reasons": dict(sorted(reasons.items())),
        "refusal_statuses": sorted({o.status for o in refused}),
    }


@dataclass
class OverloadResult:
    model: str
    concurrency: int
    seconds: float
    outcomes: list[Outcome] = field(default_factory=list)
    next_request_served: bool = False
    # level -> the outcomes of that level's probe (a caller outside the generator)
    probes: dict[int, list[Outcome]] = field(default_factory=dict)
    backoff: RetryPolicy | None = None  # how a refused caller sends again (None: at once)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model,
            "concurrency": self.concurrency,
            "seconds": self.seconds,
            "next_request_served": self.next_request_served,
            "backoff": _policy_summary(self.backoff),
        }
        for level in sorted({o.level for o in self.outcomes}):
            mine = [o for o in self.outcomes if o.level == level]
            out[f"level_{level}"] = level_summary(mine, self.seconds)
        for level, outcomes in sorted(self.probes.items()):
            out[f"probe_level_{level}"] = level_summary(outcomes, self.seconds)
        return out


def _policy_summary(policy: RetryPolicy | None) -> dict[str, float] | None:
    if policy is None:
        return None
    return {
        "attempts": policy.attempts,
        "initial_backoff_ms": policy.initial_backoff_ms,
        "max_backoff_ms": policy.max_backoff_ms,
        "budget_ms": policy.budget_ms,
    }


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def grpc_inputs(window: Mapping[str, NDArray[Any]]) -> list[grpcclient.InferInput]:
    """A window as the gRPC client's inputs (batched: one window, batch size 1)."""
    inputs = []
    for name, array in batched(window).items():
        item = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def run_overload(
    url: str,
    model: str,
    concurrency: int,
    seconds: float,
    *,
    priority_share: float | None = None,
    seed: int = 11,
    probe_levels: Sequence[int] = (),
    backoff: RetryPolicy | None = None,
) -> OverloadResult:
    """`priority_share` None: every request at the default level (2, sent as 0); else that
    share of the callers sends at level 1 and the rest at level 3. `probe_levels`: one probe
    process per level, timing its own windows while the burst runs (`OverloadResult.probes`).
    `backoff`: the callers send a refused window again as `DispatchClient` with this policy
    would; None: at once, a new window."""
    require_loopback(f"http://{url}")  # the loopback rule of every load generator
    if not 1 <= concurrency <= MAX_CONCURRENCY or not 0 < seconds <= 60:
        raise ValueError(
            f"concurrency must be 1..{MAX_CONCURRENCY} and seconds 0..60 (bounded load only)"
        )
    if any(level not in (1, 2, 3) for level in probe_levels):
        raise ValueError(f"probe levels must be 1, 2 or 3, got {list(probe_levels)}")
    context = multiprocessing.get_context("spawn")  # no fork of a process with gRPC threads
    go, stop, answers = context.Event(), context.Event(), context.Queue()
    probes = [
        context.Process(
            target=_probe,
            args=(url, model, level, min(0.5, seconds / 4)),
            kwargs={"go": go, "stop": stop, "answers": answers},
            daemon=True,
        )
        for level in probe_levels
    ]
    for process in probes:
        process.start()
    try:
        for _ in probes:
            answers.get(timeout=_PROBE_START_S)  # each probe is connected and ready
        go.set()
        result = asyncio.run(
            _overload(
                url,
                model,
                concurrency,
                seconds,
                priority_share=priority_share,
                seed=seed,
                backoff=backoff,
            )
        )
        stop.set()
        for _ in probes:
            level, outcomes = answers.get(timeout=_PROBE_START_S + 60)
            result.probes[level] = outcomes
    finally:
        go.set()
        stop.set()
        for process in probes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
    return result


def run_bench_runs(
    url: str, model: str, seconds: float, say: Callable[[str], None] = print
) -> dict[str, dict[str, Any]]:
    """The bench's three runs (`BENCH_RUNS`) against `model`, `seconds` each: label ->
    `OverloadResult.summary()`. `say` is told each run before it starts."""
    summaries: dict[str, dict[str, Any]] = {}
    for label, concurrency, share, probes in BENCH_RUNS:
        say(
            f"{label}: {model}, concurrency {concurrency}, {seconds:g} s, "
            f"probes at levels {list(probes)}"
        )
        result = run_overload(
            url, model, concurrency, seconds, priority_share=share, probe_levels=probes
        )
        summaries[label] = result.summary()
    return summaries


def _outcome(level: int, started: float, error: InferenceServerException | None) -> Outcome:
    """A request sent at ``started`` (time.monotonic) and answered now: accepted, or refused
    with its status and reason."""
    latency = (time.monotonic() - started) * 1000.0
    if error is None:
        return Outcome(level, True, latency)
    return Outcome(level, False, latency, str(error.status()), refusal_reason(str(error)))


def _probe(
    url: str,
    model: str,
    level: int,
    warm_in: float,
    *,
    go: Any,
    stop: Any,
    answers: Any,
) -> None:
    """One caller outside the generator: a window, its answer, a pause, until `stop`."""
    client = grpcclient.InferenceServerClient(url)
    inputs = grpc_inputs(simulated_windows(SIZES["small"], ())[0])
    outputs = [grpcclient.InferRequestedOutput(spec.name) for spec in DISPATCH_ENSEMBLE_OUTPUTS]
    answers.put("ready")
    outcomes: list[Outcome] = []
    try:
        go.wait(_PROBE_START_S)
        stop.wait(warm_in)  # the burst fills the queues first
        while not stop.is_set():
            started, error = time.monotonic(), None
            try:
                client.infer(model, inputs, outputs=outputs, priority=level, client_timeout=60)
            except InferenceServerException as exc:
                error = exc
            outcomes.append(_outcome(level, started, error))
            stop.wait(PROBE_INTERVAL_S)
    finally:
        client.close()
        answers.put((level, outcomes))


async def _overload(
    url: str,
    model: str,
    concurrency: int,
    seconds: float,
    *,
    priority_share: float | None,
    seed: int,
    backoff: RetryPolicy | None,
) -> OverloadResult:
    windows = [grpc_inputs(w) for w in simulated_windows(SIZES["small"], ())]
    outputs = [grpcclient.InferRequestedOutput(spec.name) for spec in DISPATCH_ENSEMBLE_OUTPUTS]
    result = OverloadResult(model, concurrency, seconds, backoff=backoff)
    draw = random.Random(seed)
    throttle = RetryThrottle()
    client = grpcaio.InferenceServerClient(url)
    stop_at = time.monotonic() + seconds

    # A caller is a tenant: it sends at one level. Drawing the level per request instead
    # makes level 1 most of the requests in flight (bulk refusals return at once, level-1
    # answers wait), so "10 % level 1" would no longer be what the server sees.
    levels = [
        0 if priority_share is None else (1 if draw.random() < priority_share else 3)
        for _ in range(concurrency)
    ]

    async def caller(index: int) -> None:
        window = windows[index % len(windows)]
        level = levels[index]
        first, sends = time.monotonic(), 0
        while time.monotonic() < stop_at:
            started, error = time.monotonic(), None
            sends += 1
            try:
                await client.infer(
                    model, window, outputs=outputs, priority=level, client_timeout=60
                )
            except InferenceServerException as exc:
                error = exc
            result.outcomes.append(_outcome(level or 2, started, error))
            wait_ms = None
            if backoff is not None and error is None:
                throttle.succeeded()
            elif backoff is not None and error is not None:
                elapsed_ms = (time.monotonic() - first) * 1000.0
                refusal = grpc_error(error, url, 60)
                wait_ms = backoff.next_wait_ms(refusal, sends, elapsed_ms, throttle)
            if wait_ms is None:  # answered, or given up: the caller's next window, at once
                first, sends = time.monotonic(), 0
            else:
                await asyncio.sleep(wait_ms / 1000.0)

    try:
        await asyncio.gather(*(caller(i) for i in range(concurrency)))
        try:  # the next request after the burst, at the default level
            await client.infer(model, windows[0], outputs=outputs, client_timeout=30)
            result.next_request_served = True
        except InferenceServerException:
            result.next_request_served = False
    finally:
        await client.close()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="gRPC host:port (loopback)")
    parser.add_argument("--model", default="dispatch_fused")
    parser.add_argument("--concurrency", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--priority-share", type=float, default=None)
    parser.add_argument(
        "--probe-levels", default="", help="comma-separated levels, one probe process each"
    )
    parser.add_argument(
        "--backoff",
        action="store_true",
        help="callers send a refused window again as DispatchClient's default RetryPolicy does",
    )
    args = parser.parse_args(argv)
    probe_levels = [int(level) for level in args.probe_levels.split(",") if level.strip()]
    result = run_overload(
        args.url,
        args.model,
        args.concurrency,
        args.seconds,
        priority_share=args.priority_share,
        probe_levels=probe_levels,
        backoff=DEFAULT_RETRY if args.backoff else None,
    )
    print(json.dumps(result.summary(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
