"""Decision records from answered windows: one per order, field by field as the window
says (hand-computed from `outcome_helpers.answered_window`), for a batch of windows of
different sizes read together as for each window alone; a window whose arrays are not one
per order is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS
from dispatch_service.outcomes.records import batch_decision_records, decision_records
from dispatch_service.routing.policy import user_buckets

from .outcome_helpers import DECIDED_AT, answered_window

PER_ORDER = (
    "order_ids",
    "user_ids",
    "created_at",
    "promised_minutes",
    "model_version",
    "fallback_level",
    "topk_rider_index",
    "assigned_rider_index",
    "assigned_objectives",
)


def test_each_order_gives_one_record_with_its_own_figures() -> None:
    weighted = answered_window("w", orders=2)
    object.__setattr__(weighted, "weights", np.array([0.5, 0.25, 0.25], dtype=np.float32))
    no_level = answered_window("n", orders=1, version=2)
    object.__setattr__(no_level, "fallback_level", None)
    empty = answered_window("e", orders=1)  # made a window of no orders
    for name in PER_ORDER:
        object.__setattr__(empty, name, getattr(empty, name)[:0])
    windows = [answered_window("a", orders=3), empty, weighted, no_level]

    records = batch_decision_records(windows)

    assert [(r.request_id, r.order_id) for r in records] == [
        ("a", "o0"), ("a", "o1"), ("a", "o2"), ("w", "o0"), ("w", "o1"), ("n", "o0"),
    ]  # fmt: skip
    first, second, unassigned = records[:3]
    assert first.assigned_rider == "r0" and second.assigned_rider == "r1"
    assert (first.eta_minutes, first.cost) == (10.0, 6.0)
    assert (second.eta_minutes, second.cost) == (11.0, 7.0)
    assert first.ontime_probability == pytest.approx(0.9)
    assert unassigned.assigned_rider is None
    assert (unassigned.eta_minutes, unassigned.ontime_probability, unassigned.cost) == (
        None,
        None,
        None,
    )
    assert [r.topk_riders for r in records[:3]] == [("r0",), ("r1",), ("r2",)]
    assert all(r.decided_at == DECIDED_AT and r.created_at == DECIDED_AT - 120.0 for r in records)
    assert all(r.promised_minutes == 30.0 and r.city == "shanghai" for r in records)
    assert [r.weights for r in records[3:5]] == [(0.5, 0.25, 0.25)] * 2
    assert records[5].fallback_level == -1 and records[5].model_version == 2
    assert [r.fallback_level for r in records[:5]] == [0] * 5
    # the user's routing bucket, never the user id: as routing buckets "user-<i>"
    users = [b"user-0", b"user-1", b"user-2", b"user-0", b"user-1", b"user-0"]
    assert [r.routing_bucket for r in records] == user_buckets(users).tolist()
    # read together or one window at a time: the same records
    assert records == [r for window in windows for r in decision_records(window)]
    assert batch_decision_records([]) == []


@pytest.mark.parametrize("field", [f for f in PER_ORDER if f != "order_ids"])
def test_arrays_that_are_not_one_per_order_are_refused_by_name(field: str) -> None:
    bad = answered_window("bad", orders=2)
    object.__setattr__(bad, field, getattr(bad, field)[:1])
    with pytest.raises(ValueError, match=f"{field}: not one (value|row) per order"):
        batch_decision_records([answered_window("good", orders=2), bad])


def test_objectives_other_than_three_are_refused() -> None:
    bad = answered_window("bad", orders=2)
    object.__setattr__(bad, "assigned_objectives", bad.assigned_objectives[:, :2])
    with pytest.raises(ValueError, match="3 objectives"):
        decision_records(bad)


def test_each_order_names_riders_of_its_own_window() -> None:
    """Windows of a batch with riders of their own: an order's row indexes its window's
    riders, never another window's (the batch joins every window's riders end to end)."""
    first = answered_window("a", orders=2)  # riders r0..r3
    second = answered_window("b", orders=3)
    object.__setattr__(second, "rider_ids", np.array([b"x0", b"x1", "x2", b"x3"], dtype=object))
    object.__setattr__(second, "assigned_rider_index", np.array([2, -1, 0], dtype=np.int32))
    object.__setattr__(
        second, "topk_rider_index", np.array([[2, 3], [-1, -1], [0, 1]], dtype=np.int32)
    )
    object.__setattr__(second, "weights", np.array([1.0, 0.0, 2.0], dtype=np.float32))

    records = batch_decision_records([first, second])

    assert [(r.request_id, r.assigned_rider, r.topk_riders) for r in records] == [
        ("a", "r0", ("r0",)),
        ("a", None, ("r1",)),
        ("b", "x2", ("x2", "x3")),
        ("b", None, ()),
        ("b", "x0", ("x0", "x1")),
    ]
    default = tuple(DEFAULT_OBJECTIVE_WEIGHTS)
    assert [r.weights for r in records] == [default] * 2 + [(1.0, 0.0, 2.0)] * 3
    # the assigned pair's figures by the order's own row (the helper's: 10 + i minutes)
    assert [r.eta_minutes for r in records[2:]] == [10.0, None, 0.0]


@pytest.mark.parametrize("field", ["assigned_rider_index", "topk_rider_index"])
def test_a_rider_index_beyond_the_windows_riders_is_refused(field: str) -> None:
    bad = answered_window("bad", orders=2)  # 4 riders
    rows = getattr(bad, field).copy()
    rows[0] = 4
    object.__setattr__(bad, field, rows)
    with pytest.raises(ValueError, match="rider index beyond the window's riders"):
        batch_decision_records([answered_window("good", orders=2), bad])


def test_windows_of_different_topk_widths_are_read_together() -> None:
    """A window with fewer riders than K answers fewer Top-K columns: a batch mixing it
    with wider ones gives each order its own riders, no pad among them."""
    wide = answered_window("wide", orders=2)  # Top-K [2, 2]
    object.__setattr__(wide, "topk_rider_index", np.array([[0, 3], [1, -1]], dtype=np.int32))
    narrow = answered_window("narrow", orders=1)
    object.__setattr__(narrow, "topk_rider_index", np.array([[2]], dtype=np.int32))
    empty = answered_window("empty", orders=1)
    object.__setattr__(empty, "topk_rider_index", np.zeros((1, 0), dtype=np.int32))

    records = batch_decision_records([wide, narrow, empty])

    assert [(r.request_id, r.topk_riders) for r in records] == [
        ("wide", ("r0", "r3")),
        ("wide", ("r1",)),
        ("narrow", ("r2",)),
        ("empty", ()),
    ]
