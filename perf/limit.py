"""The in-process limit: `FusedDispatch.run`, what `dispatch_fused` runs for a window (the
encoder, ONNX Runtime and the resolver, a one-order window on the straight path), called
directly, no serving, on the same windows and the same model configuration as the server,
and as a stub runs it: BLAS on the calling thread only (`stub_setup.single_threaded_blas`;
OpenBLAS's own threads would otherwise spin beside it, CPU no served window pays).

- single thread: per-window latency p50/p99 and windows (orders) per second;
- N worker processes (default 2, one per core): aggregate throughput, each process with its
  own pipeline, started together behind a barrier.

Each run stops after `max_windows` windows or `max_seconds`, whichever comes first.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from numpy.typing import NDArray

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.pipeline.fused import FusedDispatch
from dispatch_service.serving.stub_setup import single_threaded_blas
from perf.stats import LimitStats, level_stats
from perf.window_answers import fused_dispatch
from perf.windows import SIZES, simulated_windows

__all__ = [
    "measure",
    "multi_process_rates",
    "run_windows",
]


def run_windows(
    pipeline: FusedDispatch,
    windows: Sequence[Mapping[str, NDArray[Any]]],
    max_windows: int,
    max_seconds: float,
) -> tuple[list[float], float]:
    """Run windows round-robin; per-window latencies (s) and the elapsed time (s)."""
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + max_seconds
    while len(latencies) < max_windows and time.perf_counter() < deadline:
        sent = time.perf_counter()
        pipeline.run(windows[len(latencies) % len(windows)])
        latencies.append(time.perf_counter() - sent)
    return latencies, time.perf_counter() - start


def _worker(
    size_names: Sequence[str],
    repository: Path,
    max_windows: int,
    max_seconds: float,
    *,
    barrier: Any,
    results: Any,
) -> None:
    """One worker process: its own pipeline; per size, start with the others, then run."""
    single_threaded_blas()
    pipeline = fused_dispatch(repository)
    prepared = {name: simulated_windows(SIZES[name]) for name in size_names}
    for name in size_names:
        windows = prepared[name]
        pipeline.run(windows[0])  # warm-up, not measured
        barrier.wait(timeout=300)
        started = time.time()
        latencies, _ = run_windows(pipeline, windows, max_windows, max_seconds)
        results.put((name, len(latencies), started, time.time()))


def measure(
    size_names: Sequence[str],
    max_windows: int,
    max_seconds: float,
    processes: int = 2,
    repository: Path = MODEL_REPOSITORY,
) -> dict[str, LimitStats]:
    """The limit for each size: first 1 thread here, then `processes` spawned workers."""
    single_threaded_blas()
    pipeline = fused_dispatch(repository)
    singles = {}
    for name in size_names:
        windows = simulated_windows(SIZES[name])
        pipeline.run(windows[0])  # warm-up, not measured
        latencies, elapsed = run_windows(pipeline, windows, max_windows, max_seconds)
        singles[name] = level_stats(1, latencies, elapsed)
    rates = multi_process_rates(size_names, max_windows, max_seconds, processes, repository)
    return {
        name: LimitStats(name, SIZES[name].orders, singles[name], processes, rates[name])
        for name in size_names
    }


def multi_process_rates(
    size_names: Sequence[str],
    max_windows: int,
    max_seconds: float,
    processes: int = 2,
    repository: Path = MODEL_REPOSITORY,
) -> dict[str, float]:
    """Windows/s of `processes` spawned workers together, per size (each with its own
    pipeline, started behind a barrier): the in-process limit's throughput."""
    context = multiprocessing.get_context("spawn")  # no fork of a process holding ORT threads
    barrier = context.Barrier(processes)
    results = context.Queue()
    args = (list(size_names), repository, max_windows, max_seconds)
    kwargs = {"barrier": barrier, "results": results}
    workers = [context.Process(target=_worker, args=args, kwargs=kwargs) for _ in range(processes)]
    for worker in workers:
        worker.start()
    outcomes: dict[str, list[tuple[int, float, float]]] = {name: [] for name in size_names}
    try:
        for _ in range(processes * len(size_names)):
            name, count, started, ended = results.get(timeout=max_seconds + 300)
            outcomes[name].append((count, started, ended))
    finally:
        for worker in workers:
            worker.join(timeout=30)
            if worker.is_alive():
                worker.terminate()
    rates = {}
    for name in size_names:
        runs = outcomes[name]
        span = max(end for _, _, end in runs) - min(start for _, start, _ in runs)
        rates[name] = sum(count for count, _, _ in runs) / span
    return rates
