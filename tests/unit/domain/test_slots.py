"""Behaviour of dispatch_service.domain.slots, against hand-built slot graphs."""

from __future__ import annotations

import numpy as np

from dispatch_service.domain.slots import slot_counts, slot_edges


def test_each_edge_reaches_every_slot_of_its_rider_and_no_more_than_its_degree() -> None:
    # Edges: (o0, r2), (o0, r0), (o1, r2), (o2, r2); spare: r0 1, r1 5 (unlisted), r2 3.
    # r2 has degree 3 and spare 3 -> slots 1..3 (after r0's slot 0); r0 one slot.
    slots = slot_edges(np.array([2, 0, 2, 2]), np.array([1, 5, 3]))
    assert slots.slot_rider.tolist() == [0, 2, 2, 2]
    assert slots.num_slots == 4
    pairs = list(zip(slots.edge.tolist(), slots.column.tolist(), strict=True))
    assert pairs == [
        (0, 1), (0, 2), (0, 3),  # edge 0 (r2): every slot of r2, ascending
        (1, 0),  # edge 1 (r0)
        (2, 1), (2, 2), (2, 3),
        (3, 1), (3, 2), (3, 3),
    ]  # fmt: skip
    # r0's one slot is its first; r2's three slots rank 0, 1, 2 on every edge to it.
    assert slots.rank.tolist() == [0, 1, 2, 0, 0, 1, 2, 0, 1, 2]


def test_slots_are_capped_by_spare_and_a_full_rider_gets_none() -> None:
    # r0 named twice with spare 1: one slot; r1 full: its edge gets no copy.
    slots = slot_edges(np.array([0, 1, 0]), np.array([1, 0]))
    assert slots.slot_rider.tolist() == [0]
    assert slots.edge.tolist() == [0, 2]
    assert slots.column.tolist() == [0, 0]
    assert slots.rank.tolist() == [0, 0]


def test_no_edges_no_slots() -> None:
    slots = slot_edges(np.array([], dtype=np.int64), np.array([2, 2]))
    assert slots.num_slots == 0 and slots.edge.size == 0 and slots.column.size == 0


def test_slot_counts_are_the_columns_each_rider_gets() -> None:
    rng = np.random.default_rng(3)
    for _ in range(50):
        riders = int(rng.integers(1, 8))
        edge_rider = rng.integers(0, riders, size=int(rng.integers(0, 20))).astype(np.int64)
        spare = rng.integers(0, 4, size=riders).astype(np.int64)
        counts = slot_counts(edge_rider, spare)
        slots = slot_edges(edge_rider, spare)
        # by hand: min(spare, how many edges name the rider)
        expected = [min(int(spare[r]), int((edge_rider == r).sum())) for r in range(riders)]
        assert counts.tolist() == expected
        assert counts.tolist() == np.bincount(slots.slot_rider, minlength=riders).tolist()
