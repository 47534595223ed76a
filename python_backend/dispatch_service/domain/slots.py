"""Riders as capacity slots: a capacitated assignment as a unit-capacity matching.

Rider r offers ``c_r = min(spare_r, deg_r)`` interchangeable slot columns (``deg_r``: the
edges naming r; it can never take more orders than that), numbered rider by rider in
ascending rider order, and every (order, rider) edge becomes one edge to each slot of its
rider. A matching of this graph is an assignment that respects every rider's spare
capacity, and back. A slot's rank (0 for a rider's first) lets a solve price the k-th new
order of a rider differently from the first (`pipeline.stacking`). The resolver's exact
solve and the encoder's coverage both match over it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dispatch_service.domain import window_kernels

__all__ = ["SlotEdges", "slot_counts", "slot_edges"]


@dataclass(frozen=True, eq=False)
class SlotEdges:
    """The slot graph of a list of (order, rider) edges (one compiled pass writes it)."""

    edge: NDArray[np.int64]  # [E'] the input edge each slot edge copies, in input order
    column: NDArray[np.int64]  # [E'] its slot column
    rank: NDArray[np.int64]  # [E'] that column's place among its rider's slots, from 0
    slot_rider: NDArray[np.int64]  # [S] the rider of each slot column

    @property
    def num_slots(self) -> int:
        return int(self.slot_rider.size)


def slot_counts(edge_rider: NDArray[np.int64], spare: NDArray[np.int64]) -> NDArray[np.int64]:
    """``c_r = min(spare_r, deg_r)`` [R], the slot columns each rider offers; the degree is
    counted over every rider row (a rider no edge names offers none) in one pass."""
    return np.minimum(spare, np.bincount(edge_rider, minlength=spare.size))


def slot_edges(edge_rider: NDArray[np.int64], spare: NDArray[np.int64]) -> SlotEdges:
    """Expand edges whose riders are ``edge_rider`` (rider rows) to every slot of their
    rider; ``spare`` [R] is each rider's spare capacity. An edge to a rider with no slot
    gets no copy. Copies of one edge come out in ascending column order."""
    edge_rider = edge_rider.astype(np.int64, copy=False)
    slots = slot_counts(edge_rider, spare).astype(np.int64, copy=False)
    first_slot = np.cumsum(slots) - slots
    copies = int(slots[edge_rider].sum())
    edge, column, rank = (np.empty(copies, dtype=np.int64) for _ in range(3))
    window_kernels.slot_copies(edge_rider, (slots, first_slot), (edge, column, rank))
    return SlotEdges(edge, column, rank, np.repeat(np.arange(spare.size), slots))
