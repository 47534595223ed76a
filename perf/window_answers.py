"""Recorded answers of the in-process library: a change to its speed must not change them.

`record` draws simulator windows of every bench size, every registered city and every
evaluation regime (`offline.simulator.REGIMES`, as many orders as the regime says and as a
bench small window), answers each with `FusedDispatch.run` and stores the request tensors
(so a later simulator still replays the same windows) with a digest of every answer tensor:
the outputs, the pair features and the scored objectives. `tests/unit/pipeline/
test_window_answers.py` answers the stored windows with the code of the day and compares
digests, byte for byte.

`python -m perf.window_answers tests/unit/pipeline/data/window_answers.npz` re-records (run it
with the code whose answers are the reference, before a change).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import PAIR_FEATURES
from dispatch_service.core.model_config import config_parameters, profile_config_path
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.domain.cities import default_registry
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import REGIMES, city_world, generate_regime_window
from dispatch_service.pipeline.fused import FusedDispatch, FusedResult
from dispatch_service.routing.settings import FUSED_MODEL_NAME, FusedSettings
from perf.windows import SIZES, Tensors, neutral_inputs

__all__ = [
    "answer_digests",
    "fused_dispatch",
    "load_windows",
    "main",
    "mismatches",
    "record",
    "windows",
]

OBJECTIVES = "PAIR_OBJECTIVES"


def windows(seed: int = 0) -> Iterator[tuple[str, Tensors]]:
    """(label, request tensors) of every case: per city and regime one window of the
    regime's size and two bench small ones; per city one bench medium window; one large."""
    registry = default_registry()
    rng = np.random.default_rng(seed)
    small, medium, large = SIZES["small"], SIZES["medium"], SIZES["large"]
    for city in registry.cities:
        world = city_world(city)
        for name, regime in REGIMES.items():
            bench_small = (small.orders, small.riders)
            shapes = [(regime.num_orders, regime.num_riders), bench_small, bench_small]
            for number, (orders, riders) in enumerate(shapes):
                sized = dataclasses.replace(regime, num_orders=orders, num_riders=riders)
                yield (
                    f"{city.id}/{name}/{orders}x{riders}/{number}",
                    _wire(generate_regime_window(rng, sized, world)),
                )
        default = dataclasses.replace(
            REGIMES["default"], num_orders=medium.orders, num_riders=medium.riders
        )
        yield f"{city.id}/medium", _wire(generate_regime_window(rng, default, world))
    first = registry.cities[0]
    default = dataclasses.replace(
        REGIMES["default"], num_orders=large.orders, num_riders=large.riders
    )
    yield f"{first.id}/large", _wire(generate_regime_window(rng, default, city_world(first)))


def _wire(window: Any) -> Tensors:
    tensors = window_to_wire(window)
    tensors.update(neutral_inputs(["OBJECTIVE_WEIGHTS"]))
    return tensors


def fused_dispatch(repository: Path = MODEL_REPOSITORY) -> FusedDispatch:
    """`dispatch_fused` as its config.pbtxt sets it up, with no shadow sampling drawn at
    random (the draw is fixed, so the answers are repeatable)."""
    settings = FusedSettings.from_parameters(
        config_parameters(profile_config_path(repository / FUSED_MODEL_NAME))
    )
    return FusedDispatch.from_repository(repository, settings, draw=lambda: 0.5)


def _digest(array: NDArray[Any]) -> str:
    hashed = hashlib.sha256(f"{array.dtype.str}{array.shape}".encode())
    if array.dtype == object:
        for item in array.reshape(-1):
            hashed.update(repr(item).encode())
    else:
        hashed.update(np.ascontiguousarray(array).tobytes())
    return hashed.hexdigest()


def answer_digests(result: FusedResult) -> dict[str, str]:
    """A digest of every tensor of an answer: its outputs, its pair features, its scores."""
    tensors = {
        **result.outputs,
        PAIR_FEATURES.name: result.encoded[PAIR_FEATURES.name],
        OBJECTIVES: result.routed.objectives,
    }
    return {name: _digest(np.asarray(tensors[name])) for name in sorted(tensors)}


def _to_stored(value: NDArray[Any]) -> NDArray[Any]:
    """Object (bytes) arrays as fixed-width bytes: the file loads without pickle."""
    return value.astype(np.bytes_) if value.dtype == object else value


def load_windows(path: Path) -> tuple[list[tuple[str, Tensors]], dict[str, dict[str, str]]]:
    """The stored windows (label, request tensors) and their recorded digests by label."""
    recorded = json.loads(path.with_suffix(".json").read_text())
    stored: dict[str, Tensors] = {}
    with np.load(path.with_suffix(".npz"), allow_pickle=False) as arrays:
        for key in arrays.files:
            label, name = key.rsplit(":", 1)
            value = arrays[key]
            stored.setdefault(label, {})[name] = (
                value.astype(object) if value.dtype.kind == "S" else value
            )
    return [(label, stored[label]) for label in recorded["order"]], recorded["digests"]


def record(path: Path, dispatch: FusedDispatch | None = None) -> int:
    """Write ``path``.npz (the windows) and ``path``.json (their answers' digests)."""
    dispatch = dispatch or fused_dispatch()
    arrays: dict[str, NDArray[Any]] = {}
    digests: dict[str, dict[str, str]] = {}
    order: list[str] = []
    for label, tensors in windows():
        order.append(label)
        digests[label] = answer_digests(dispatch.run(tensors))
        arrays.update({f"{label}:{name}": _to_stored(v) for name, v in tensors.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path.with_suffix(".npz"), **arrays)
    document = {"order": order, "digests": digests}
    path.with_suffix(".json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    return len(order)


def mismatches(
    dispatch: FusedDispatch,
    cases: Sequence[tuple[str, Tensors]],
    recorded: Mapping[str, Mapping[str, str]],
) -> list[str]:
    """'label: tensor' of every answer tensor whose digest differs from the recorded one."""
    found = []
    for label, tensors in cases:
        got = answer_digests(dispatch.run(tensors))
        found += [
            f"{label}: {name}" for name in recorded[label] if got.get(name) != recorded[label][name]
        ]
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "path", type=Path, help="the windows go to PATH.npz, their digests beside it (.json)"
    )
    args = parser.parse_args(argv)
    stored = args.path.with_suffix(".npz")
    print(f"{record(args.path)} windows recorded to {stored} and {stored.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
