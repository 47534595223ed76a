"""Resolver time in process, plain and stack-aware (the resolver's latency target).

Each `perf.windows` medium (64 x 200) and large (1,000 x 5,000) window is encoded and scored
once by `DispatchPipeline.from_repository()`; then only the resolver step is timed: the plain
``resolver.run`` and the stack-aware ``resolver.run_stack_aware`` re-scoring with the
pipeline's model (what `DispatchPipeline(stack_aware=True)` runs), windows cycled.

`python -m perf.resolver_time [--medium-runs 200] [--large-runs 20]` prints p50/p99 per size
for both, with how many pair rows the stack-aware resolution scored again per window.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import CANDIDATE_RIDER_INDEX
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from perf.windows import SIZES, Tensors, simulated_windows

__all__ = ["main", "timed_ms"]


def timed_ms(call: Callable[[Tensors], Any], windows: Sequence[Tensors], runs: int) -> list[float]:
    """Wall time of ``runs`` calls in ms, cycling through ``windows`` (one warm-up each)."""
    for window in windows:
        call(window)
    out = []
    for i in range(runs):
        window = windows[i % len(windows)]
        started = time.perf_counter()
        call(window)
        out.append((time.perf_counter() - started) * 1000.0)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--medium-runs", type=int, default=200)
    parser.add_argument("--large-runs", type=int, default=20)
    args = parser.parse_args(argv)
    pipeline = DispatchPipeline.from_repository()
    resolver, scorer = pipeline.resolver, pipeline.model.scorer

    def rescore(rows: NDArray[np.int64], features: NDArray[np.float32]) -> NDArray[np.float32]:
        return scorer.infer(features)

    def stack_aware(window: Tensors) -> Any:
        return resolver.run_stack_aware(window, rescore).resolution.as_wire_tensors()

    for name, runs in (("medium", args.medium_runs), ("large", args.large_runs)):
        windows = []
        for tensors in simulated_windows(SIZES[name]):
            encoded = pipeline.encoder.run(tensors)
            windows.append({**tensors, **encoded, **pipeline.model.run(encoded)})
        results = [resolver.run_stack_aware(window, rescore) for window in windows]
        rescored = np.mean([result.rescored for result in results])
        pairs = np.mean([(window[CANDIDATE_RIDER_INDEX.name] >= 0).sum() for window in windows])
        print(
            f"{SIZES[name].label}: {len(windows)} windows, stack-aware: {rescored:.0f} rows "
            f"scored again with extra load per window ({pairs:.0f} candidate pairs)"
        )
        for label, call in (("plain", resolver.run), ("stack-aware", stack_aware)):
            times = timed_ms(call, windows, runs)
            p50, p99 = np.percentile(times, [50, 99])
            print(f"  {label:<12} p50 {p50:8.2f} ms  p99 {p99:8.2f} ms  ({runs} runs)")


if __name__ == "__main__":
    main()
