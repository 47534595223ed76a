"""Overload: more callers than the server can serve, and what the bounded queues do with them.

A closed loop of `concurrency` gRPC callers (coroutines on tritonclient's asyncio client,
one channel) sends small windows to one entry point for `seconds`; each caller sends its
next window as soon as its previous answer (or refusal) arrives. Every request records its
priority level, whether it was accepted, its latency and, when refused, the status. A mixed
run makes a share of the callers level-1 tenants (priority orders) and the rest level-3
tenants (bulk); each caller keeps its level. The targets of issue 11 read: accepted p99
against the same entry point's p99 at concurrency 64, refusal p99 (a refusal must be
immediate), zero refusals at level 1, and the next request after the burst served.

`python -m perf.overload --url 127.0.0.1:8001 --model dispatch_fused --concurrency 512
--seconds 5 [--priority-share 0.1]` prints the figures as JSON (loopback only).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from dispatch_contract import DISPATCH_ENSEMBLE_OUTPUTS, batched
from perf.loadgen import require_loopback
from perf.windows import SIZES, simulated_windows

__all__ = ["MAX_CONCURRENCY", "Outcome", "OverloadResult", "main", "run_overload"]

# Issue 10 asks for 3,000 concurrent callers; the bound keeps the load finite.
MAX_CONCURRENCY = 4096


@dataclass(frozen=True)
class Outcome:
    level: int
    accepted: bool
    latency_ms: float
    status: str = ""


@dataclass
class OverloadResult:
    model: str
    concurrency: int
    seconds: float
    outcomes: list[Outcome] = field(default_factory=list)
    next_request_served: bool = False

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model,
            "concurrency": self.concurrency,
            "seconds": self.seconds,
            "next_request_served": self.next_request_served,
        }
        for level in sorted({o.level for o in self.outcomes}):
            mine = [o for o in self.outcomes if o.level == level]
            accepted = [o.latency_ms for o in mine if o.accepted]
            refused = [o.latency_ms for o in mine if not o.accepted]
            out[f"level_{level}"] = {
                "accepted": len(accepted),
                "refused": len(refused),
                "accepted_per_s": len(accepted) / self.seconds,
                "accepted_p50_ms": _percentile(accepted, 50),
                "accepted_p99_ms": _percentile(accepted, 99),
                "refusal_p50_ms": _percentile(refused, 50),
                "refusal_p99_ms": _percentile(refused, 99),
                "refusal_statuses": sorted({o.status for o in mine if not o.accepted}),
            }
        return out


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _inputs(window: Mapping[str, NDArray[Any]]) -> list[grpcclient.InferInput]:
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
    priority_share: float | None = None,
    seed: int = 11,
) -> OverloadResult:
    """`priority_share` None: every request at the default level (2, sent as 0); else that
    share of the callers sends at level 1 and the rest at level 3."""
    require_loopback(f"http://{url}")  # the loopback rule of every load generator
    if not 1 <= concurrency <= MAX_CONCURRENCY or not 0 < seconds <= 60:
        raise ValueError(
            f"concurrency must be 1..{MAX_CONCURRENCY} and seconds 0..60 (bounded load only)"
        )
    return asyncio.run(_overload(url, model, concurrency, seconds, priority_share, seed))


async def _overload(
    url: str,
    model: str,
    concurrency: int,
    seconds: float,
    priority_share: float | None,
    seed: int,
) -> OverloadResult:
    windows = [_inputs(w) for w in simulated_windows(SIZES["small"], ())]
    outputs = [grpcclient.InferRequestedOutput(spec.name) for spec in DISPATCH_ENSEMBLE_OUTPUTS]
    result = OverloadResult(model, concurrency, seconds)
    draw = random.Random(seed)
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
        while time.monotonic() < stop_at:
            started = time.monotonic()
            status = ""
            try:
                await client.infer(
                    model, window, outputs=outputs, priority=level, client_timeout=60
                )
            except InferenceServerException as exc:
                status = str(exc.status())
            latency = (time.monotonic() - started) * 1000.0
            result.outcomes.append(Outcome(level or 2, not status, latency, status))

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
    args = parser.parse_args(argv)
    result = run_overload(args.url, args.model, args.concurrency, args.seconds, args.priority_share)
    print(json.dumps(result.summary(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
