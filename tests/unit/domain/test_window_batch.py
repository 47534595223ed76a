"""A batch of windows (one Triton execute): each window gets what it gets alone."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from window_helpers import assert_same_window, wire, with_addresses

from dispatch_contract import CoordSystem
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.window import LATEST_TIME
from dispatch_service.domain.window_batch import windows_from_wire
from dispatch_service.domain.window_wire import window_from_wire

Tensors = dict[str, NDArray[Any]]


def alone(tensors: Tensors) -> Any:
    try:
        return window_from_wire(tensors)
    except DispatchInputError as exc:
        return exc


def assert_same_outcome(got: Any, expected: Any) -> None:
    if isinstance(expected, DispatchInputError):
        assert isinstance(got, DispatchInputError), got
        assert (got.tensor, got.rule, got.code) == (expected.tensor, expected.rule, expected.code)
    else:
        assert not isinstance(got, Exception), got
        assert_same_window(got, expected)


def _set(name: str, at: tuple[int, ...], value: Any) -> Any:
    def change(tensors: Tensors) -> None:
        tensors[name][at] = value

    return change


def _created_in_2100(tensors: Tensors) -> None:
    # within the clock skew of a window stamped one second before 2100: the year 2100 is out
    tensors["WINDOW_FIELDS"][0] = LATEST_TIME - 1
    tensors["ORDER_FIELDS"][:, 4] = LATEST_TIME


def _text_ids(tensors: Tensors) -> None:  # str ids: accepted, encoded as UTF-8
    tensors["ORDER_IDS"] = np.array([i.decode() for i in tensors["ORDER_IDS"]], dtype=object)


def _one_text_row_short(tensors: Tensors) -> None:
    tensors["ORDER_TEXT"] = tensors["ORDER_TEXT"][:-1]


def _order_fields_fp32(tensors: Tensors) -> None:
    tensors["ORDER_FIELDS"] = tensors["ORDER_FIELDS"].astype(np.float32)


def _no_rider_fields(tensors: Tensors) -> None:
    del tensors["RIDER_FIELDS"]


# Each changes one window of a batch: a broken rule (the window's error must be its own,
# named as when it is sent alone) or a window of another kind (answered as when alone).
CHANGES = {
    "nothing": lambda tensors: None,
    "nan pickup without an address": _set("ORDER_FIELDS", (0, 0), np.nan),
    "fraction in a rider's load": _set("RIDER_FIELDS", (0, 2), 1.5),
    "rider capacity above the limit": _set("RIDER_FIELDS", (1, 3), 1001.0),
    "latitude out of range": _set("RIDER_FIELDS", (0, 0), 91.0),
    "promised minutes 0": _set("ORDER_FIELDS", (0, 5), 0.0),
    "unknown constraint bit": _set("ORDER_FIELDS", (0, 6), 1024.0),
    "created far after the window": _set("ORDER_FIELDS", (0, 4), 2_000_000_000.0),
    "created in the year 2100": _created_in_2100,
    "duplicate order id": _set("ORDER_IDS", (1,), b"order-0"),
    "duplicate rider id": _set("RIDER_IDS", (1,), b"rider-0"),
    "empty rider id": _set("RIDER_IDS", (0,), b""),
    "rider id not UTF-8": _set("RIDER_IDS", (0,), b"\xff"),
    "order ids as text": _text_ids,
    "unknown coordinate system": _set("WINDOW_FIELDS", (1,), 7.0),
    "dispatch time with a fraction": _set("WINDOW_FIELDS", (0,), 1.7e9 + 0.5),
    "order text one row short": _one_text_row_short,
    "order fields as FP32": _order_fields_fp32,
    "rider fields missing": _no_rider_fields,
    "addresses": lambda tensors: tensors.update(with_addresses(tensors, [1])),
}


def batch_of_windows(change: str) -> list[Tensors]:
    """Windows of mixed sizes and coordinate systems, the fourth one changed."""
    batch = []
    for seed, (orders, riders) in enumerate([(1, 20), (5, 9), (3, 2), (12, 30), (1, 1), (7, 11)]):
        tensors = wire(seed, orders, riders)
        tensors["ORDER_IDS"] = np.array([f"order-{i}".encode() for i in range(orders)], object)
        tensors["RIDER_IDS"] = np.array([f"rider-{i}".encode() for i in range(riders)], object)
        # the same numbers, read in another datum: windows of one batch may differ
        tensors["WINDOW_FIELDS"][1] = float(list(CoordSystem)[seed % len(CoordSystem)])
        batch.append(tensors)
    CHANGES[change](batch[3])
    return batch


@pytest.mark.parametrize("change", list(CHANGES))
def test_each_window_of_a_batch_gets_what_it_gets_alone(change: str) -> None:
    batch = batch_of_windows(change)
    expected = [alone(tensors) for tensors in batch]
    got = windows_from_wire(batch)
    assert len(got) == len(batch)
    for one, other in zip(got, expected, strict=True):
        assert_same_outcome(one, other)
    broken = isinstance(expected[3], DispatchInputError)
    assert broken != (change in ("nothing", "order ids as text", "addresses")), expected[3]
    assert not any(isinstance(e, Exception) for i, e in enumerate(expected) if i != 3)


def test_a_window_stamped_in_2100_is_refused_even_within_the_clock_skew() -> None:
    """The quick check let created_at == 2100-01-01 through when the window's own time was
    within 300 s of it; the rule by rule check refuses it."""
    tensors = wire()
    _created_in_2100(tensors)
    with pytest.raises(DispatchInputError) as caught:
        window_from_wire(tensors)
    assert caught.value.tensor == "ORDER_FIELDS[created_at]"
    assert caught.value.rule.startswith("must be a unix time in seconds within")


def test_a_batch_window_does_not_alias_its_request() -> None:
    batch = batch_of_windows("nothing")
    before = [{name: np.array(value, copy=True) for name, value in t.items()} for t in batch]
    for window in windows_from_wire(batch):
        assert not isinstance(window, Exception)
        window.pickup[:] = 0.0
        window.rider_load[:] = 0
    for tensors, kept in zip(batch, before, strict=True):
        for name, value in kept.items():
            np.testing.assert_array_equal(tensors[name], value, err_msg=name)
