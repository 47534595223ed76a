"""The exact assignment's fast path and graph: the same answer as the full solve."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_service.domain.assignment import uncontested_best


def random_slots(
    rng: np.random.Generator, coarse: bool
) -> tuple[NDArray[np.int64], NDArray[np.float64], NDArray[np.int64]]:
    """A Top-K table as `_assign_slots` sees it: -1 pads anywhere, scores in [0, 1]."""
    orders, k, riders = int(rng.integers(0, 9)), int(rng.integers(1, 6)), int(rng.integers(1, 9))
    index = np.full((orders, k), -1, dtype=np.int64)
    for b in range(orders):
        listed = rng.permutation(riders)[: int(rng.integers(0, min(k, riders) + 1))]
        index[b, : listed.size] = listed
        index[b] = rng.permutation(index[b])
    score = rng.integers(0, 4, index.shape) / 4.0 if coarse else rng.random(index.shape)
    spare = rng.integers(0, 4, riders).astype(np.int64)
    return index, score, spare


@pytest.mark.parametrize("coarse", [False, True])
def test_uncontested_fast_path_equals_the_full_solve(coarse: bool) -> None:
    from dispatch_service.domain.assignment import _solve_slots

    rng = np.random.default_rng(20 + coarse)
    taken = 0
    for _ in range(3000):
        index, score, spare = random_slots(rng, coarse)
        quick = uncontested_best(index, score, spare)
        if quick is None:
            continue
        taken += 1
        np.testing.assert_array_equal(quick, _solve_slots(index, score, spare))
    assert taken > 500  # the fast path really ran, on both tie-free and coarse scores


def test_uncontested_declines_ties_and_over_asked_riders() -> None:
    spare = np.array([1, 1, 1], dtype=np.int64)
    # Two usable candidates at the same score: the solver's tie-break decides.
    assert uncontested_best(np.array([[0, 1]]), np.array([[0.5, 0.5]]), spare) is None
    # Scores that differ but give the same cost 2 - s are a tie for the solver too.
    close = np.array([[0.5, np.nextafter(0.5, 1.0)]])
    assert 2.0 - close[0, 0] == 2.0 - close[0, 1]
    assert uncontested_best(np.array([[0, 1]]), close, spare) is None
    # Both orders' best is rider 0, which has room for one.
    assert (
        uncontested_best(np.array([[0, 1], [0, 2]]), np.array([[0.9, 0.1], [0.8, 0.2]]), spare)
        is None
    )
    # A tie with a full rider is no tie; an order with nothing usable stays unassigned.
    spare = np.array([0, 1, 1], dtype=np.int64)
    got = uncontested_best(np.array([[0, 1], [0, -1]]), np.array([[0.5, 0.5], [0.9, 0.0]]), spare)
    assert got is not None and got.tolist() == [1, -1]
    assert uncontested_best(np.zeros((0, 3), np.int64), np.zeros((0, 3)), spare) is not None


def test_sparse_graph_is_the_canonical_coo_build() -> None:
    from scipy.sparse import csr_matrix

    from dispatch_service.domain import assignment

    seen: list[Any] = []
    solver = assignment.min_weight_full_bipartite_matching

    def spy(graph: Any) -> Any:
        seen.append(graph)
        return solver(graph)

    rng = np.random.default_rng(22)
    try:
        assignment.min_weight_full_bipartite_matching = spy  # type: ignore[assignment]
        for _ in range(300):
            index, score, spare = random_slots(rng, coarse=True)
            seen.clear()
            assignment._solve_slots(index, score, spare)
            if not seen:
                continue
            graph = seen[0].tocoo()
            shuffle = rng.permutation(graph.nnz)
            rebuilt = csr_matrix(
                (graph.data[shuffle], (graph.row[shuffle], graph.col[shuffle])), shape=graph.shape
            )
            for name in ("indptr", "indices", "data"):
                np.testing.assert_array_equal(getattr(seen[0], name), getattr(rebuilt, name))
    finally:
        assignment.min_weight_full_bipartite_matching = solver  # type: ignore[assignment]
