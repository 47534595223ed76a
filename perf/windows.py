"""The windows every entry point is measured with: simulator output, never random bytes.

Each size draws a handful of distinct windows from fixed seeds, so every run, every entry
point and both references (in-process limit, FastAPI) see exactly the same requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS, spec_by_name
from dispatch_service.core.model_config import CONFIG_NAME, read_model_config
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window

__all__ = [
    "FIRST_SEED",
    "NEUTRAL_OPTIONAL_INPUTS",
    "SIZES",
    "Tensors",
    "WindowSize",
    "neutral_inputs",
    "optional_inputs",
    "simulated_windows",
]

Tensors = dict[str, NDArray[Any]]

FIRST_SEED = 1000


@dataclass(frozen=True)
class WindowSize:
    name: str
    orders: int
    riders: int
    # Distinct windows cycled through; fewer for big windows to keep input files small.
    count: int

    @property
    def label(self) -> str:
        return f"{self.name} ({self.orders:,} x {self.riders:,})"


SIZES: dict[str, WindowSize] = {
    size.name: size
    for size in (
        WindowSize("small", 1, 20, 16),
        WindowSize("medium", 64, 200, 8),
        WindowSize("large", 1000, 5000, 3),
    )
}


# Values for the `dispatch` ensemble's optional inputs that change nothing: the contract's
# default weights, and the tag of the version the router sends everyone to by default.
NEUTRAL_OPTIONAL_INPUTS: dict[str, NDArray[Any]] = {
    "OBJECTIVE_WEIGHTS": np.asarray(DEFAULT_OBJECTIVE_WEIGHTS, dtype=np.float32),
    "MODEL_VERSION_TAG": np.asarray([b"stable"], dtype=object),
}


def optional_inputs(repository: Path = MODEL_REPOSITORY, model: str = "dispatch") -> list[str]:
    """Names of the inputs `model` declares in its config.pbtxt that a client may leave out:
    optional there and in the contract (an ensemble declares even the required ones optional,
    `declared_by_ensemble`)."""
    config = read_model_config(repository / model / CONFIG_NAME)
    return [t.name for t in config.input if t.optional and spec_by_name(t.name).optional]


def neutral_inputs(names: Sequence[str]) -> dict[str, NDArray[Any]]:
    """The neutral value of each named optional input; ValueError for one without."""
    unknown = [name for name in names if name not in NEUTRAL_OPTIONAL_INPUTS]
    if unknown:
        raise ValueError(
            f"no neutral benchmark value for optional input(s) {unknown}: add one to "
            "perf.windows.NEUTRAL_OPTIONAL_INPUTS"
        )
    return {name: NEUTRAL_OPTIONAL_INPUTS[name].copy() for name in names}


def simulated_windows(
    size: WindowSize,
    optional: Sequence[str] = ("OBJECTIVE_WEIGHTS",),
    first_seed: int = FIRST_SEED,
) -> list[Tensors]:
    """`size.count` request-tensor dicts from the city simulator, seeds first_seed, ...

    Every window also carries the named optional inputs with neutral values: perf_analyzer's
    shared-memory mode cannot leave an optional input out, and every entry point must send
    the same requests (pass `optional_inputs()` to cover all the ensemble declares).
    """
    extra = neutral_inputs(optional)
    windows = []
    for seed in range(first_seed, first_seed + size.count):
        tensors = window_to_wire(
            generate_window(np.random.default_rng(seed), size.orders, size.riders)
        )
        tensors.update({name: value.copy() for name, value in extra.items()})
        windows.append(tensors)
    return windows
