"""Where one window's CPU time goes in process, stage by stage: the stub's library path.

`dispatch_fused` runs `FusedDispatch.run` for a batch of one; the `dispatch` ensemble runs
the same encoder and resolver steps in separate stubs. Each stage below is timed on its own
with this thread's CPU clock (`time.thread_time_ns`, so other processes' load shows up only
as cache and frequency effects, not as waiting), over many calls cycling through the bench's
simulated windows (`perf.windows`), and reported as the median microseconds per window:

- ``fused``: `FusedDispatch.run`, the whole window (a one-order window takes the straight
  path, `pipeline.small_window`); ``fused_general``: the same with that path off
  (``small_windows=False``), every stage below being the general steps';
- ``encode``: `FeatureEncoderStep.encode`, of which ``unpack`` (`window_from_wire`),
  ``geocode``, ``city`` (`CityRegistry.locate`), ``candidates`` (`window_candidates`),
  ``features`` (`encode_pairs`) and, inside ``features``, ``map_columns`` (the barrier,
  detour and route-minute columns);
- ``route_score``: `route_window` + `route_and_score_sync` (ONNX Runtime), of which
  ``onnx`` (one session call);
- ``resolve``: `TopKResolverStep.run` given the encoder's window (dispatch_fused) and
  ``resolve_wire`` without it (the ensemble's topk_resolver unpacks the tensors again).

Every stage gets the same window in turn (stages interleaved), so a drift of the host's load
spreads over all of them. Work a stage hands to other threads (a large window's candidate
ranking on the encoder's ``selection_threads``) is not on this thread's clock. On a shared
host the figures still move with its load; compare commits in alternating runs, or count
instructions (valgrind's callgrind) where the load will not settle.

`python -m perf.window_cost [--sizes small,large] [--calls 2000,30]` prints a table and,
with ``--json PATH``, writes the figures. Another commit's library (a `perf.commits`
worktree) is measured with ``PYTHONPATH=<wt>/python_backend:<wt>/contract:<wt>/client:<wt>
python perf/window_cost.py``, without the stages it lacks (before the city registry: no
``city`` and ``map_columns``).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    CANDIDATE_RIDER_INDEX,
    MODEL_VERSION_TAG,
    ORDER_MODEL_VERSION,
    PAIR_FEATURES,
    PAIR_OBJECTIVES,
)
from dispatch_service.core.model_config import config_parameters, profile_config_path
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.domain import features as encoding
from dispatch_service.pipeline.fused import FusedDispatch
from dispatch_service.routing.policy import ServedVersions, route_window
from dispatch_service.routing.settings import FUSED_MODEL_NAME, FusedSettings
from perf.windows import SIZES, Tensors, WindowSize, simulated_windows

# Older libraries (a perf.commits worktree) named these elsewhere.
try:
    from dispatch_service.domain.window_wire import user_ids_from_wire, window_from_wire
except ImportError:  # before `window_wire`
    from dispatch_service.domain.window import (  # type: ignore[attr-defined,no-redef]
        user_ids_from_wire,
        window_from_wire,
    )
try:
    from dispatch_service.routing.engine import route_and_score_sync
except ImportError:  # before the rename
    from dispatch_service.routing.engine import (  # type: ignore[attr-defined,no-redef]
        route_and_score_now as route_and_score_sync,
    )

__all__ = ["STAGES", "format_table", "main", "stage_costs"]

# Reported in this order; a stage indented under another is part of it.
STAGES = (
    ("fused", 0),
    ("fused_general", 0),
    ("encode", 1),
    ("unpack", 2),
    ("geocode", 2),
    ("city", 2),
    ("candidates", 2),
    ("features", 2),
    ("map_columns", 3),
    ("route_score", 1),
    ("onnx", 2),
    ("resolve", 1),
    ("resolve_wire", 1),
)

Call = Callable[[], object]


def _map_call(window: Any, candidates: NDArray[np.int32], city: Any) -> Call | None:
    """One window's map columns as `encode_pairs` asks for them (every valid pair); None
    for a library from before the city registry. Since `domain.map_features` the points'
    plane conversion is shared with the zones' and not part of this call."""
    flat = candidates.reshape(-1).astype(np.int64)
    valid = np.flatnonzero(flat >= 0)
    pair_order = valid // max(candidates.shape[1], 1)
    order_window = np.zeros(window.num_orders, dtype=np.int64)
    position = window.rider_position[flat[valid]]
    vehicle = window.rider_vehicle[flat[valid]].astype(np.int64)
    try:
        from dispatch_service.domain import map_features
    except ImportError:  # older: `features._road_tables` converted the points itself
        old: Callable[..., object] | None = getattr(encoding, "_road_tables", None)
        if old is None or city is None:
            return None
        pickup, dropoff = window.pickup, window.dropoff
        return lambda: old([city], order_window, pair_order, pickup, dropoff, position, vehicle)
    plane = city.plane(np.concatenate((position, window.pickup, window.dropoff)))
    return lambda: map_features.road_tables([city], order_window, pair_order, plane, vehicle)


def _window_calls(dispatch: FusedDispatch, inputs: Tensors) -> dict[str, Call]:
    """Each stage of one window as a call of its own, on that stage's real inputs."""
    encoder, resolver = dispatch.encoder, dispatch.resolver
    threads = encoder.threads.selection_threads
    unpacked = window_from_wire(inputs, encoder.limits)
    located = encoder.geocoder.locate(unpacked)[0]
    registry = getattr(encoder, "cities", None)
    city = registry.locate(located) if registry is not None else None
    candidates = encoding.window_candidates(located, encoder.encoder, threads)
    encoded = encoder.encode(inputs)[-1]
    served = ServedVersions(dispatch.servable)
    with_city = "city" in inspect.signature(route_window).parameters

    def route() -> Any:
        where = (city.id,) if with_city and city is not None else ()
        routing, versions = route_window(
            user_ids_from_wire(inputs), inputs.get(MODEL_VERSION_TAG.name),
            dispatch.settings.routing, served, *where,
        )  # fmt: skip
        return route_and_score_sync(
            encoded[PAIR_FEATURES.name],
            encoded[CANDIDATE_RIDER_INDEX.name],
            versions,
            routing,
            dispatch.score,
            served=served,
        )

    routed = route()
    answer = {  # what `topk_resolver` gets: the window, the encoder's pairs, the router's
        **inputs,
        **encoded,
        PAIR_OBJECTIVES.name: routed.objectives,
        ORDER_MODEL_VERSION.name: routed.model_version,
    }
    version = dispatch.settings.routing.stable_version
    pairs = encoded[PAIR_FEATURES.name]
    by_city = () if city is None else (city,)
    calls: dict[str, Call] = {
        "fused": lambda: dispatch.run(inputs),
        "encode": lambda: encoder.encode(inputs),
        "unpack": lambda: window_from_wire(inputs, encoder.limits),
        "geocode": lambda: encoder.geocoder.locate(unpacked),
        "candidates": lambda: encoding.window_candidates(located, encoder.encoder, threads),
        "features": lambda: encoding.encode_pairs(located, candidates, encoder.encoder, *by_city),
        "route_score": route,
        "onnx": lambda: dispatch.score(version, pairs),
        "resolve": lambda: resolver.run(answer, located, dispatch.score),
        "resolve_wire": lambda: resolver.run(answer, score=dispatch.score),
    }
    if hasattr(dispatch, "small_windows"):  # before the straight path: one path only
        general = dataclasses.replace(dispatch, small_windows=False)
        calls["fused_general"] = lambda: general.run(inputs)
    if registry is not None:
        calls["city"] = lambda: registry.locate(located)
    if (mapped := _map_call(located, candidates, city)) is not None:
        calls["map_columns"] = mapped
    return calls


def stage_costs(
    size: WindowSize,
    calls: int,
    repository: Path = MODEL_REPOSITORY,
    windows: Sequence[Tensors] | None = None,
) -> dict[str, float]:
    """Median thread-CPU microseconds per window of each stage `STAGES` names (those the
    library has), over ``calls`` windows cycling through the size's simulated windows."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    # `profile_config_path`, not `repository_layout` (which older libraries lack): the same
    # config.pbtxt, read by a perf.commits worktree's library too.
    settings = FusedSettings.from_parameters(
        config_parameters(profile_config_path(repository / FUSED_MODEL_NAME))
    )
    dispatch = FusedDispatch.from_repository(repository, settings)
    prepared = [_window_calls(dispatch, inputs) for inputs in (windows or simulated_windows(size))]
    for stage_calls in prepared:  # warm-up: every stage of every window once
        for call in stage_calls.values():
            call()
    samples: dict[str, list[int]] = {name: [] for name in prepared[0]}
    for number in range(calls):
        for name, call in prepared[number % len(prepared)].items():
            started = time.thread_time_ns()
            call()
            samples[name].append(time.thread_time_ns() - started)
    return {
        name: statistics.median(samples[name]) / 1000.0 for name, _ in STAGES if name in samples
    }


def format_table(costs: Mapping[str, Mapping[str, float]]) -> str:
    """One column per label (a size, a commit), one row per stage, microseconds."""
    labels = list(costs)
    width = max(14, *(len(label) + 2 for label in labels))
    lines = ["stage (us/window, median)".ljust(30) + "".join(f"{x:>{width}}" for x in labels)]
    for name, depth in STAGES:
        if not any(name in costs[label] for label in labels):
            continue
        cells = "".join(
            f"{costs[label][name]:>{width}.1f}" if name in costs[label] else f"{'-':>{width}}"
            for label in labels
        )
        lines.append(("  " * depth + name).ljust(30) + cells)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", default="small,large", help="comma-separated perf.windows sizes")
    parser.add_argument("--calls", default="2000,30", help="windows timed per size, in order")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    sizes = [name.strip() for name in args.sizes.split(",") if name.strip()]
    counts = [int(part) for part in args.calls.split(",")]
    if len(counts) != len(sizes):
        parser.error("--calls needs one count per size")
    costs = {
        name: stage_costs(SIZES[name], count) for name, count in zip(sizes, counts, strict=True)
    }
    print(format_table(costs))
    if args.json is not None:
        args.json.write_text(json.dumps(costs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
