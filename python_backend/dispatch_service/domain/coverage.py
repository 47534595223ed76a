"""Candidate lists that never cost an order: reach the exact optimum's number of assignments.

The resolver assigns exactly, but only over each order's N nearest feasible riders. Where
riders are scarce, orders crowd the same nearby riders and an order can go unassigned
although a farther rider, in nobody's list, could take it (issue 12: the peak + scarcity
regime lost orders in 14 of 24 windows against the exact optimum over every feasible pair).

`cover_maximum_assignment` closes that gap with the fewest changes it can find: if the
candidate graph cannot serve as many orders as the whole feasible graph, it extends a
maximum assignment of the candidate graph by augmenting paths over every feasible pair
(Kuhn's algorithm, rider r offering ``spare_r = capacity_r - load_r`` slots) and gives
each order whose rider in that assignment is outside its list that rider as its last
candidate, in place of its farthest one. The candidate graph then holds a maximum
assignment of the feasible graph, so the resolver's maximum-cardinality solve serves as
many orders as any assignment could; which riders it picks is still the model's call.

Most windows never get past `_greedy`: a few vectorised proposal rounds serve every order
where riders are not scarce, and then nothing else runs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

__all__ = ["cover_maximum_assignment"]

# rider rows order b may take, in the order they are tried
Neighbours = Callable[[int], NDArray[np.int64]]


def _greedy(candidates: NDArray[np.int32], spare: NDArray[np.int64]) -> NDArray[np.int64]:
    """int64 [B]: a first assignment over the lists, -1 = none; vectorised proposal rounds.

    In round k every order still without a rider proposes to its k-th candidate and each
    rider accepts the lowest-numbered proposers its remaining slots allow. Orders whose list
    has ended drop out. Not maximum in general, but in a window with riders to spare it
    serves every order within a few rounds, which settles the common case.
    """
    rider_of = np.full(candidates.shape[0], -1, dtype=np.int64)
    left = spare.copy()
    pending = np.arange(candidates.shape[0])
    for k in range(candidates.shape[1]):
        proposed = candidates[pending, k].astype(np.int64)
        pending = pending[proposed >= 0]
        proposed = proposed[proposed >= 0]
        if pending.size == 0:
            break
        if np.all(np.bincount(proposed, minlength=left.size) <= left):
            rider_of[pending] = proposed  # no rider over-asked: every proposal is accepted
            break
        by_rider = np.argsort(proposed, kind="stable")  # keeps proposers in row order
        riders = proposed[by_rider]
        rank = np.arange(riders.size) - np.searchsorted(riders, riders, side="left")
        accepted = rank < left[riders]
        rider_of[pending[by_rider[accepted]]] = riders[accepted]
        left -= np.bincount(riders[accepted], minlength=left.size)
        pending = pending[rider_of[pending] < 0]
    return rider_of


class _Matching:
    """A capacitated bipartite matching grown by breadth-first augmenting paths."""

    def __init__(self, rider_of: NDArray[np.int64], spare: NDArray[np.int64]) -> None:
        self.rider_of = rider_of
        self.spare = spare
        self.holders: list[list[int]] = [[] for _ in range(spare.size)]
        for order, rider in enumerate(rider_of.tolist()):
            if rider >= 0:
                self.holders[rider].append(order)

    def grow(self, roots: list[int], neighbours: Neighbours) -> None:
        """Augment from each unassigned root once; then no augmenting path is left.

        An order with no augmenting path keeps none after later augmentations (the
        lemma behind Kuhn's algorithm), so one pass suffices. Riders seen by a failed
        search lead only to saturated riders; they stay marked until the next
        augmentation, which bounds a pass of failures by one sweep of the graph.
        """
        seen = np.zeros(self.spare.size, dtype=np.bool_)
        for root in roots:
            if self.rider_of[root] >= 0:
                continue
            if self._augment(root, neighbours, seen):
                seen[:] = False

    def _augment(self, root: int, neighbours: Neighbours, seen: NDArray[np.bool_]) -> bool:
        reached_from: dict[int, int] = {}  # rider -> the order whose edge reached it
        queue = deque([root])
        while queue:
            order = queue.popleft()
            fresh = neighbours(order)
            fresh = fresh[~seen[fresh]]
            seen[fresh] = True
            for rider in fresh.tolist():
                reached_from[rider] = order
                if len(self.holders[rider]) < self.spare[rider]:
                    self._flip(rider, reached_from)
                    return True
                queue.extend(self.holders[rider])
        return False

    def _flip(self, free_rider: int, reached_from: dict[int, int]) -> None:
        """Shift every order on the path to the rider that reached it; the root gains one."""
        rider = free_rider
        while True:
            order = reached_from[rider]
            previous = int(self.rider_of[order])
            self.rider_of[order] = rider
            self.holders[rider].append(order)
            if previous < 0:
                return
            self.holders[previous].remove(order)
            rider = previous


def cover_maximum_assignment(
    candidates: NDArray[np.int32],
    feasible: Callable[[], NDArray[np.bool_]],
    spare: NDArray[np.int64],
) -> NDArray[np.int32]:
    """``candidates`` ([B, N], nearest first, -1 pads), amended so that they hold a
    maximum assignment of the whole feasible graph.

    ``feasible`` builds the [B, R] feasibility mask; it is called only in the rare window
    whose candidate graph falls short. Returns ``candidates`` itself when nothing changes.
    """
    if candidates.shape[0] == 0 or candidates.shape[1] == 0:
        return candidates
    first = _greedy(candidates, spare)
    listed = candidates[:, 0] >= 0  # lists are nearest first, pads last
    served = int(np.count_nonzero(first >= 0))
    if served == int(np.count_nonzero(listed)) or served == int(spare.sum()):
        return candidates  # every listed order, or every slot there is, already served
    lists = [row[row >= 0].astype(np.int64) for row in candidates]
    matching = _Matching(first, spare)
    matching.grow(np.flatnonzero(listed & (first < 0)).tolist(), lists.__getitem__)
    short = np.flatnonzero(listed & (matching.rider_of < 0)).tolist()
    if not short or int(np.count_nonzero(matching.rider_of >= 0)) == int(spare.sum()):
        return candidates
    mask = feasible()
    matching.grow(short, lambda b: np.flatnonzero(mask[b]).astype(np.int64))
    moved = [
        b
        for b, rider in enumerate(matching.rider_of.tolist())
        if rider >= 0 and not np.any(lists[b] == rider)
    ]
    if not moved:
        return candidates
    out = candidates.copy()
    # A list with a pad already holds every feasible rider of its order, so only full
    # lists get here: the new rider, farther than all of them, replaces the farthest.
    out[moved, -1] = matching.rider_of[moved]
    return out
