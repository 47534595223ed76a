"""Behaviour of dispatch_service.domain.coverage, judged by scipy's maximum flow."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_flow

from dispatch_service.domain.coverage import cover_maximum_assignment


def max_assignable(edges: NDArray[np.bool_], spare: NDArray[np.int64]) -> int:
    """Orders servable at once: maximum flow source -> orders -> riders (spare) -> sink."""
    num_orders, num_riders = edges.shape
    size = num_orders + num_riders + 2
    source, sink = 0, size - 1
    edges_out: list[tuple[int, int, int]] = [(source, 1 + b, 1) for b in range(num_orders)]
    for b, r in zip(*np.nonzero(edges), strict=True):
        edges_out.append((1 + int(b), 1 + num_orders + int(r), 1))
    for r in np.flatnonzero(spare > 0).tolist():
        edges_out.append((1 + num_orders + r, sink, int(spare[r])))
    rows, cols, caps = (list(column) for column in zip(*edges_out, strict=True))
    graph = csr_matrix((np.array(caps, dtype=np.int32), (rows, cols)), shape=(size, size))
    return int(maximum_flow(graph, source, sink).flow_value)


def nearest_lists(
    dist: NDArray[np.float64], feasible: NDArray[np.bool_], n: int
) -> NDArray[np.int32]:
    """[B, n]: per order the n nearest feasible riders, -1 pads (what the encoder hands over)."""
    ranked = np.argsort(np.where(feasible, dist, np.inf), axis=1, kind="stable")[:, :n]
    ok = np.take_along_axis(feasible, ranked, axis=1)
    return np.where(ok, ranked, -1).astype(np.int32)


def as_edges(candidates: NDArray[np.int32], num_riders: int) -> NDArray[np.bool_]:
    edges = np.zeros((candidates.shape[0], num_riders), dtype=np.bool_)
    for b, row in enumerate(candidates):
        edges[b, row[row >= 0]] = True
    return edges


def random_instance(
    seed: int,
) -> tuple[NDArray[np.float64], NDArray[np.bool_], NDArray[np.int64], int]:
    rng = np.random.default_rng(seed)
    num_orders = int(rng.integers(1, 40))
    num_riders = int(rng.integers(1, 40))
    # Orders crowd a few hotspots so the nearest lists overlap: where the gap shows.
    spots = rng.uniform(0, 10, size=(3, 2))
    orders = spots[rng.integers(0, 3, num_orders)] + rng.normal(0, 0.3, (num_orders, 2))
    riders = rng.uniform(0, 10, size=(num_riders, 2))
    dist = np.linalg.norm(orders[:, None, :] - riders[None, :, :], axis=2)
    spare = rng.choice([0, 1, 1, 2, 3], size=num_riders).astype(np.int64)
    feasible = (rng.random((num_orders, num_riders)) < rng.uniform(0.3, 1.0)) & (spare > 0)
    n = int(rng.integers(1, 6))
    return dist, feasible, spare, n


@pytest.mark.parametrize("seed", range(300))
def test_amended_lists_serve_as_many_orders_as_the_whole_feasible_graph(seed: int) -> None:
    dist, feasible, spare, n = random_instance(seed)
    candidates = nearest_lists(dist, feasible, n)
    amended = cover_maximum_assignment(candidates, lambda: feasible, spare)
    edges = as_edges(amended, feasible.shape[1])
    assert max_assignable(edges, spare) == max_assignable(feasible, spare)
    # Only feasible riders, no rider twice in a list, and only the last column changes.
    assert not (edges & ~feasible).any()
    for row in amended:
        listed = row[row >= 0]
        assert np.unique(listed).size == listed.size
    np.testing.assert_array_equal(amended[:, :-1], candidates[:, :-1])


def test_two_orders_crowding_one_near_rider_get_the_far_one_too() -> None:
    # Both orders sit at the near rider; the far rider is in no list of length 1.
    dist = np.array([[0.1, 5.0], [0.2, 6.0]])
    feasible = np.ones((2, 2), dtype=np.bool_)
    spare = np.array([1, 1], dtype=np.int64)
    candidates = nearest_lists(dist, feasible, 1)
    assert candidates.tolist() == [[0], [0]]
    amended = cover_maximum_assignment(candidates, lambda: feasible, spare)
    assert sorted(amended[:, 0].tolist()) == [0, 1]


def test_a_rider_with_two_slots_covers_two_orders_without_change() -> None:
    feasible = np.ones((2, 2), dtype=np.bool_)
    candidates = np.array([[0], [0]], dtype=np.int32)
    spare = np.array([2, 1], dtype=np.int64)
    assert cover_maximum_assignment(candidates, lambda: feasible, spare) is candidates


def test_more_orders_than_slots_changes_nothing_it_cannot_improve() -> None:
    candidates = np.zeros((3, 1), dtype=np.int32)
    spare = np.array([1], dtype=np.int64)

    def never() -> NDArray[np.bool_]:
        raise AssertionError("the whole graph is not needed when the lists already hold a maximum")

    assert cover_maximum_assignment(candidates, never, spare) is candidates


def test_a_window_whose_lists_already_suffice_is_returned_untouched() -> None:
    # Hall's condition by degree: every order lists 2 riders, each rider listed <= 2 x spare.
    candidates = np.array([[0, 1], [1, 2], [2, 0]], dtype=np.int32)
    spare = np.ones(3, dtype=np.int64)

    def never() -> NDArray[np.bool_]:
        raise AssertionError("the feasibility mask is built only when the lists fall short")

    assert cover_maximum_assignment(candidates, never, spare) is candidates


def test_empty_windows_pass_through() -> None:
    spare = np.ones(2, dtype=np.int64)
    for shape in ((0, 2), (3, 0)):
        candidates = np.full(shape, -1, dtype=np.int32)
        feasible = np.zeros((shape[0], 2), dtype=np.bool_)
        assert cover_maximum_assignment(candidates, feasible.copy, spare) is candidates


def amended_by_ids(seed: int, orders: NDArray[np.int64], riders: NDArray[np.int64]) -> list[Any]:
    """`random_instance` listed in the order ``orders`` / ``riders``, with ids: each order id's
    amended list as rider ids (None pads), in order-id order."""
    dist, feasible, spare, n = random_instance(seed)
    dist, feasible, spare = dist[orders][:, riders], feasible[orders][:, riders], spare[riders]
    order_ids = np.array([f"o{b}".encode() for b in orders], dtype=object)
    rider_ids = np.array([f"r{r}".encode() for r in riders], dtype=object)
    candidates = nearest_lists(dist, feasible, n)
    amended = cover_maximum_assignment(candidates, lambda: feasible, spare, order_ids, rider_ids)
    names = np.append(rider_ids, None)
    return sorted(zip(order_ids.tolist(), (names[row].tolist() for row in amended), strict=True))


@pytest.mark.parametrize("seed", range(0, 300, 3))
def test_the_amendment_does_not_depend_on_how_the_window_is_listed(seed: int) -> None:
    """Which order gets which far rider follows the ids: the same for every listing."""
    dist, _, _, _ = random_instance(seed)
    num_orders, num_riders = dist.shape
    expected = amended_by_ids(seed, np.arange(num_orders), np.arange(num_riders))
    rng = np.random.default_rng(seed)
    for _ in range(3):
        orders, riders = rng.permutation(num_orders), rng.permutation(num_riders)
        assert amended_by_ids(seed, orders, riders) == expected


@pytest.mark.parametrize(
    ("listed", "spare", "expected"),
    [
        ([[0, 1]], [0, 1, 1], [[0, 1]]),  # the second listed rider has room: kept
        ([[2, 0]], [0, 0, 1], [[2, 0]]),  # the first one has: kept
        ([[0, 1]], [0, 0, 0], [[0, 1]]),  # nobody has room: kept
        ([[-1, -1]], [1, 1, 1], [[-1, -1]]),  # nobody listed (none feasible): kept
    ],
)
def test_a_one_order_window_keeps_its_list_when_a_listed_rider_has_room_or_none_has(
    listed: list[list[int]], spare: list[int], expected: list[list[int]]
) -> None:
    candidates = np.array(listed, dtype=np.int32)
    feasible = np.ones((1, 3), dtype=bool)
    out = cover_maximum_assignment(candidates, lambda: feasible, np.array(spare, dtype=np.int64))
    assert out.tolist() == expected
