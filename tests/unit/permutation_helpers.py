"""A window listed in another order, and an answer read by ids (the answer must be a
function of the window as a set, not of how the caller lists its orders and riders)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import REGIMES, generate_regime_window

Tensors = dict[str, NDArray[Any]]

ORDER_ROWS = ("ORDER_IDS", "ORDER_TEXT", "ORDER_FIELDS")
RIDER_ROWS = ("RIDER_IDS", "RIDER_FIELDS")
RIDER_INDEX_OUTPUTS = ("TOPK_RIDER_INDEX", "ASSIGNED_RIDER_INDEX")
WINDOW_OUTPUTS = ("WINDOW_CITY",)  # one value per window, not a row per order


def regime_windows(seeds: int) -> Iterator[tuple[str, int, Tensors]]:
    """``seeds`` simulator windows of every regime (scarce ones included), as wire tensors."""
    for name, regime in REGIMES.items():
        for seed in range(seeds):
            window = generate_regime_window(np.random.default_rng(seed), regime)
            yield name, seed, dict(window_to_wire(window))


def permuted(
    tensors: Mapping[str, NDArray[Any]], rng: np.random.Generator
) -> tuple[Tensors, NDArray[np.int64]]:
    """The same window with its orders and its riders listed in a random order, and the
    order permutation (row i of the result is row ``orders[i]`` of ``tensors``)."""
    orders = rng.permutation(len(tensors["ORDER_IDS"]))
    riders = rng.permutation(len(tensors["RIDER_IDS"]))
    out = dict(tensors)
    for name in ORDER_ROWS:
        out[name] = tensors[name][orders]
    for name in RIDER_ROWS:
        out[name] = tensors[name][riders]
    return out, orders


def by_ids(
    outputs: Mapping[str, NDArray[Any]],
    tensors: Mapping[str, NDArray[Any]],
    orders: NDArray[np.int64] | None = None,
) -> dict[str, NDArray[Any]]:
    """The answer to ``tensors`` with rider rows read as rider ids (b'' = none) and, given the
    permutation ``orders`` that listed them, its order rows back in the unpermuted order."""
    ids = np.append(np.asarray(tensors["RIDER_IDS"], dtype=object), b"")
    back = np.arange(len(tensors["ORDER_IDS"])) if orders is None else np.argsort(orders)
    out = {}
    for name, value in outputs.items():
        value = np.asarray(value)
        if name in WINDOW_OUTPUTS:
            out[name] = value
        else:
            out[name] = ids[value][back] if name in RIDER_INDEX_OUTPUTS else value[back]
    return out


def assert_same_answer(
    got: Mapping[str, NDArray[Any]], expected: Mapping[str, NDArray[Any]]
) -> None:
    """Every output identical, byte for byte."""
    assert set(got) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
