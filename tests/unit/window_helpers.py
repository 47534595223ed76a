"""Windows on the wire for the window tests: a generated window packed, and the same
window with some points sent as addresses."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window

Tensors = dict[str, NDArray[Any]]


def wire(seed: int = 0, orders: int = 5, riders: int = 9) -> Tensors:
    return dict(window_to_wire(generate_window(np.random.default_rng(seed), orders, riders)))


def assert_same_window(a: Any, b: Any) -> None:
    for field in dataclasses.fields(a):
        left, right = getattr(a, field.name), getattr(b, field.name)
        if isinstance(left, np.ndarray):
            assert left.dtype == right.dtype, field.name
            np.testing.assert_array_equal(left, right, err_msg=field.name)
        else:
            assert left == right, field.name


def with_addresses(tensors: Tensors, rows: list[int], end: str = "pickup") -> Tensors:
    """``tensors`` with the ``end`` point of ``rows`` sent as an address (coordinates NaN)."""
    out = {name: np.array(value, copy=True) for name, value in tensors.items()}
    count = len(out["ORDER_IDS"])
    text = np.full((count, 4), b"", dtype=object)
    text[:, 0] = out["ORDER_TEXT"][:, 0]
    column = 1 if end == "pickup" else 2
    lat = 0 if end == "pickup" else 2
    for row in rows:
        text[row, column] = "上海市徐汇区徐家汇".encode()
        text[row, 3] = "上海".encode()
        out["ORDER_FIELDS"][row, lat : lat + 2] = np.nan
    out["ORDER_TEXT"] = text
    return out
