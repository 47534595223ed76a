"""The resolver's contract: ranking, Top-K, the stable hash and optimal assignment."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS, DISPATCH_OUTPUTS
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.assignment import assign
from dispatch_service.domain.hashing import fnv1a_64
from dispatch_service.domain.resolver import (
    Resolution,
    ResolverWindow,
    WindowTensors,
    _resolve_stacked,
    _row_sums,
    checked_together,
    resolve,
    resolve_many,
)
from dispatch_service.domain.scoring import ResolverSettings, score_pairs

WEIGHTS = np.asarray(DEFAULT_OBJECTIVE_WEIGHTS, dtype=np.float64)
Args = dict[str, Any]


def rider_ids(count: int) -> NDArray[np.object_]:
    return np.array([f"rider-{i:04d}".encode() for i in range(count)], dtype=object)


def random_window(
    rng: np.random.Generator,
    orders: int,
    candidates: int,
    riders: int,
    missing: float = 0.2,
) -> Args:
    """Random but valid resolver inputs; missing candidates carry garbage objectives."""
    index = np.stack([rng.permutation(riders)[:candidates] for _ in range(orders)]).astype(np.int32)
    index[rng.random(index.shape) < missing] = -1
    objectives = np.column_stack(
        [
            rng.uniform(3, 90, orders * candidates),
            rng.uniform(-0.1, 1.1, orders * candidates),
            rng.uniform(2, 40, orders * candidates),
        ]
    ).astype(np.float32)
    objectives[index.reshape(-1) < 0] = np.nan  # garbage that must be ignored
    capacity = rng.integers(0, 4, riders).astype(np.int32)
    return {
        "objectives": objectives,
        "candidate_rider_index": index,
        "rider_ids": rider_ids(riders),
        "rider_load": rng.integers(0, 5, riders).astype(np.int32),
        "rider_capacity": capacity,
        "weights": WEIGHTS,
    }


def one_order(objectives: list[tuple[float, float, float]], **extra: Any) -> Args:
    """A single order whose j-th candidate is rider j."""
    count = len(objectives)
    args: Args = {
        "objectives": np.asarray(objectives, dtype=np.float32),
        "candidate_rider_index": np.arange(count, dtype=np.int32)[None, :],
        "rider_ids": rider_ids(count),
        "rider_load": np.zeros(count, dtype=np.int32),
        "rider_capacity": np.ones(count, dtype=np.int32),
        "weights": WEIGHTS,
    }
    args.update(extra)
    return args


def dominates(a: NDArray[np.float32], b: NDArray[np.float32]) -> bool:
    better_or_equal = a[0] <= b[0] and a[1] >= b[1] and a[2] <= b[2]
    return bool(better_or_equal and (a[0] < b[0] or a[1] > b[1] or a[2] < b[2]))


# ---- scoring -------------------------------------------------------------------------


def test_score_of_a_pair_ignores_the_rest_of_the_window() -> None:
    rng = np.random.default_rng(2)
    args = random_window(rng, orders=6, candidates=5, riders=12)
    first = resolve(**args)
    changed = args["objectives"].copy()
    changed[5:] = rng.uniform(0, 100, changed[5:].shape).astype(np.float32)
    changed[5:, 1] = rng.uniform(0, 1, changed.shape[0] - 5)
    second = resolve(**{**args, "objectives": changed})
    np.testing.assert_array_equal(first.topk_rider_index[0], second.topk_rider_index[0])
    np.testing.assert_array_equal(first.topk_score[0], second.topk_score[0])


@pytest.mark.parametrize("weights", [WEIGHTS, (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)])
def test_dominating_pairs_rank_above_dominated_ones(weights: Any) -> None:
    rng = np.random.default_rng(3)
    for _ in range(40):
        candidates = 10
        # Coarse values make ties and dominance frequent.
        objectives = np.column_stack(
            [
                rng.integers(1, 5, candidates) * 10.0,
                rng.integers(0, 4, candidates) / 3.0,
                rng.integers(1, 4, candidates) * 5.0,
            ]
        ).astype(np.float32)
        args = one_order(
            [tuple(row) for row in objectives.tolist()],
            weights=np.asarray(weights, dtype=np.float64),
        )
        ranked = resolve(**args, settings=ResolverSettings(top_k=candidates))
        position = {int(r): p for p, r in enumerate(ranked.topk_rider_index[0])}
        for a, b in itertools.permutations(range(candidates), 2):
            if dominates(objectives[a], objectives[b]):
                assert position[a] < position[b], (objectives[a], objectives[b])


def test_weights_move_the_ranking_the_expected_way() -> None:
    fast_and_dear = (10.0, 0.9, 40.0)
    slow_and_cheap = (50.0, 0.9, 2.0)
    args = one_order([fast_and_dear, slow_and_cheap])
    latency_first = resolve(**{**args, "weights": np.array([0.8, 0.1, 0.1])})
    cost_first = resolve(**{**args, "weights": np.array([0.1, 0.1, 0.8])})
    assert latency_first.topk_rider_index[0].tolist() == [0, 1]
    assert cost_first.topk_rider_index[0].tolist() == [1, 0]

    sure_but_slow = (40.0, 0.99, 5.0)
    quick_but_risky = (15.0, 0.40, 5.0)
    args = one_order([quick_but_risky, sure_but_slow])
    assert resolve(**{**args, "weights": np.array([0.0, 1.0, 0.0])}).topk_rider_index[
        0
    ].tolist() == [1, 0]
    assert resolve(**{**args, "weights": np.array([1.0, 0.0, 0.0])}).topk_rider_index[
        0
    ].tolist() == [0, 1]


def test_zero_weight_objective_still_breaks_ties() -> None:
    # Only latency counts, but among equal ETAs the better on-time, then cheaper, wins.
    args = one_order(
        [(20.0, 0.5, 9.0), (20.0, 0.5, 3.0), (20.0, 0.9, 9.0), (25.0, 1.0, 1.0)],
        weights=np.array([1.0, 0.0, 0.0]),
    )
    ranked = resolve(**args, settings=ResolverSettings(top_k=4))
    assert ranked.topk_rider_index[0].tolist() == [2, 1, 0, 3]


def test_exact_ties_fall_to_the_id_hash_then_the_id() -> None:
    ids = np.array([b"delta", b"alpha", b"charlie", b"bravo", b"echo"], dtype=object)
    args = one_order([(20.0, 0.8, 6.0)] * 5, rider_ids=ids)
    ranked = resolve(**args)
    expected = np.argsort(fnv1a_64(ids.tolist()), kind="stable")
    assert ranked.topk_rider_index[0].tolist() == expected.tolist()
    assert ranked.topk_rider_ids[0].tolist() == ids[expected].tolist()

    # Same id on two rows (not a valid window): equal ids keep their rows' order.
    twins = np.array([b"same", b"same", b"other"], dtype=object)
    args = one_order([(20.0, 0.8, 6.0)] * 3, rider_ids=twins)
    args["candidate_rider_index"] = np.array([[1, 2, 0]], dtype=np.int32)
    order = resolve(**args).topk_rider_index[0].tolist()
    assert order.index(0) == order.index(1) - 1


def test_a_hash_collision_falls_to_the_id_not_the_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every hash equal (a collision on every pair): the ids in byte order decide, wherever
    the riders are listed."""
    from dispatch_service.domain import resolver as resolver_module

    monkeypatch.setattr(
        resolver_module, "rider_id_hashes", lambda ids: np.zeros(len(ids), dtype=np.uint64)
    )
    ids = np.array([b"delta", b"alpha", b"charlie", b"bravo", b"echo"], dtype=object)
    for rows in ([0, 1, 2, 3, 4], [4, 2, 0, 3, 1]):
        args = one_order([(20.0, 0.8, 6.0)] * 5, rider_ids=ids[rows])
        ranked = resolve(**args)
        assert ranked.topk_rider_ids[0].tolist() == sorted(ids.tolist())


def relisted(args: Args, orders: NDArray[np.int64], riders: NDArray[np.int64]) -> Args:
    """The same resolver inputs with the orders and the riders listed in another order."""
    width = args["candidate_rider_index"].shape[1]
    new_row = np.empty(riders.size + 1, dtype=np.int32)
    new_row[riders] = np.arange(riders.size)
    new_row[-1] = -1
    pairs = (orders[:, None] * width + np.arange(width)).reshape(-1)
    out = dict(args)
    out["candidate_rider_index"] = new_row[args["candidate_rider_index"][orders]]
    out["objectives"] = args["objectives"][pairs]
    out["order_ids"] = args["order_ids"][orders]
    for name in ("rider_ids", "rider_load", "rider_capacity"):
        out[name] = args[name][riders]
    return out


def read_by_ids(resolution: Resolution, order_ids: NDArray[np.object_]) -> dict[bytes, Any]:
    """Per order id: its Top-K rider ids, scores and its assigned rider id."""
    return {
        order: (
            tuple(resolution.topk_rider_ids[b].tolist()),
            resolution.topk_score[b].tobytes(),
            resolution.assigned_rider_ids[b],
            resolution.assigned_score[b].tobytes(),
        )
        for b, order in enumerate(order_ids.tolist())
    }


@pytest.mark.parametrize("seed", range(6))
def test_tied_optima_are_chosen_by_ids_however_the_window_is_listed(seed: int) -> None:
    """Scarce windows whose pairs score from a handful of values, so that many assignments
    are optimal: the one chosen, and every Top-K list, is the same for every listing."""
    rng = np.random.default_rng(seed)
    orders, riders = 24, 14
    args = random_window(rng, orders, 6, riders, missing=0.1)
    levels = np.array([[10.0, 0.9, 5.0], [20.0, 0.5, 8.0], [30.0, 0.7, 3.0]], dtype=np.float32)
    args["objectives"] = levels[rng.integers(0, 3, orders * 6)]
    args["rider_load"] = np.zeros(riders, dtype=np.int32)
    args["rider_capacity"] = rng.integers(1, 3, riders).astype(np.int32)
    args["order_ids"] = np.array([f"order-{rng.integers(1e9)}-{b}".encode() for b in range(orders)])
    expected = read_by_ids(resolve(**args), args["order_ids"])
    for _ in range(4):
        listed = relisted(args, rng.permutation(orders), rng.permutation(riders))
        assert read_by_ids(resolve(**listed), listed["order_ids"]) == expected


def test_order_ids_must_be_one_bytes_id_per_order() -> None:
    args = random_window(np.random.default_rng(0), 3, 2, 4)
    for bad, rule in ((np.array([b"a", b"b"], dtype=object), "shape"), (np.arange(3), "dtype")):
        with pytest.raises(DispatchInputError) as caught:
            resolve(**args, order_ids=bad)
        assert (caught.value.tensor, caught.value.code) == ("ORDER_IDS", rule)


# ---- Top-K ---------------------------------------------------------------------------


@pytest.mark.parametrize("top_k", [1, 3, 5, 20])
def test_topk_is_sorted_distinct_and_padded(top_k: int) -> None:
    rng = np.random.default_rng(top_k)
    for _ in range(20):
        orders, candidates, riders = 8, 7, 15
        args = random_window(rng, orders, candidates, riders, missing=0.5)
        ranked = resolve(**args, settings=ResolverSettings(top_k=top_k))
        k = min(top_k, candidates)
        index = args["candidate_rider_index"]
        objectives = args["objectives"].reshape(orders, candidates, 3)
        assert ranked.topk_rider_index.shape == (orders, k)
        for b in range(orders):
            row = ranked.topk_rider_index[b]
            listed = row[row >= 0]
            filled = min(k, int((index[b] >= 0).sum()))
            assert listed.size == filled
            assert (row[filled:] == -1).all()
            assert len(set(listed.tolist())) == filled
            assert set(listed.tolist()) <= set(index[b].tolist())
            scores = ranked.topk_score[b]
            assert (np.diff(scores[:filled]) <= 0).all()
            assert (scores[filled:] == 0).all()
            assert ranked.topk_rider_ids[b, :filled].tolist() == args["rider_ids"][listed].tolist()
            assert ranked.topk_rider_ids[b, filled:].tolist() == [b""] * (k - filled)
            for slot, rider in enumerate(listed.tolist()):
                j = int(np.flatnonzero(index[b] == rider)[0])
                eta, ontime, cost = objectives[b, j]
                assert ranked.topk_eta_minutes[b, slot] == eta
                assert ranked.topk_ontime_probability[b, slot] == ontime
                assert ranked.topk_cost[b, slot] == cost
            for field in (ranked.topk_eta_minutes, ranked.topk_ontime_probability):
                assert (field[b, filled:] == 0).all()
            # Nothing left out ranks above the last one kept.
            if filled == k and filled < int((index[b] >= 0).sum()):
                all_scores = score_pairs(objectives[b][index[b] >= 0].astype(np.float64), WEIGHTS)
                assert np.sort(all_scores)[::-1][k - 1] == pytest.approx(float(scores[k - 1]))


def test_empty_and_candidate_free_windows() -> None:
    empty = resolve(
        np.zeros((0, 3), np.float32),
        np.zeros((0, 4), np.int32),
        rider_ids=rider_ids(2),
        rider_load=np.zeros(2, np.int32),
        rider_capacity=np.ones(2, np.int32),
        weights=WEIGHTS,
    )
    assert empty.topk_rider_index.shape == (0, 4)
    assert empty.assigned_rider_index.shape == (0,)

    no_columns = resolve(
        np.zeros((0, 3), np.float32),
        np.zeros((2, 0), np.int32),
        rider_ids=rider_ids(1),
        rider_load=np.zeros(1, np.int32),
        rider_capacity=np.ones(1, np.int32),
        weights=WEIGHTS,
    )
    assert no_columns.topk_rider_index.shape == (2, 0)
    assert no_columns.assigned_rider_index.tolist() == [-1, -1]
    assert assign(np.zeros((3, 0), np.int32), np.zeros((3, 0)), [0], [1]).tolist() == [-1] * 3

    none = resolve(
        np.full((6, 3), np.nan, np.float32),
        np.full((2, 3), -1, np.int32),
        rider_ids=np.zeros(0, dtype=object),
        rider_load=np.zeros(0, np.int32),
        rider_capacity=np.zeros(0, np.int32),
        weights=WEIGHTS,
    )
    assert (none.topk_rider_index == -1).all()
    assert none.topk_rider_ids.tolist() == [[b""] * 3] * 2
    assert none.assigned_rider_index.tolist() == [-1, -1]
    assert none.assigned_rider_ids.tolist() == [b"", b""]
    assert none.assigned_score.tolist() == [0.0, 0.0]


def test_as_tensors_follows_the_contract() -> None:
    rng = np.random.default_rng(4)
    tensors = resolve(**random_window(rng, 5, 6, 10)).as_tensors()
    assert list(tensors) == [spec.name for spec in DISPATCH_OUTPUTS]
    for spec in DISPATCH_OUTPUTS:
        assert tensors[spec.name].dtype == spec.numpy_dtype
        assert tensors[spec.name].ndim == len(spec.dims)
        if spec.triton_dtype == "BYTES":
            assert all(isinstance(item, bytes) for item in tensors[spec.name].reshape(-1))


def test_resolve_is_deterministic() -> None:
    args = random_window(np.random.default_rng(5), 30, 8, 20)
    first, second = resolve(**args), resolve(**args)
    for name, value in first.as_tensors().items():
        np.testing.assert_array_equal(value, second.as_tensors()[name])


# ---- assignment ----------------------------------------------------------------------


def check_assignment(result: Resolution, args: Args) -> None:
    spare = np.maximum(args["rider_capacity"] - args["rider_load"], 0)
    assigned = result.assigned_rider_index
    used = np.bincount(assigned[assigned >= 0], minlength=spare.size)
    assert (used <= spare).all()
    for b, rider in enumerate(assigned.tolist()):
        if rider < 0:
            assert result.assigned_rider_ids[b] == b""
            assert result.assigned_score[b] == 0.0
            continue
        # The assigned rider is one of the order's candidates, perhaps outside its Top-K.
        candidates = np.asarray(args["candidate_rider_index"])[b].tolist()
        assert rider in candidates
        column = b * len(candidates) + candidates.index(rider)
        own = score_pairs(np.asarray(args["objectives"])[column], args["weights"])
        assert result.assigned_score[b] == np.float32(own)
        assert result.assigned_rider_ids[b] == args["rider_ids"][rider]
        slots = result.topk_rider_index[b].tolist()
        if rider in slots:
            assert result.assigned_score[b] == result.topk_score[b, slots.index(rider)]


def test_capacity_is_never_exceeded() -> None:
    rng = np.random.default_rng(6)
    for _ in range(100):
        riders = int(rng.integers(1, 12))
        args = random_window(rng, int(rng.integers(1, 40)), min(riders, 6), riders)
        check_assignment(resolve(**args, settings=ResolverSettings(top_k=3)), args)


def test_assigned_objectives_are_the_assigned_pair_s_even_off_the_list() -> None:
    """Each assigned order reports its own pair's objectives, read back by hand from the
    inputs; with top_k 1 in scarce windows many assigned riders are off the list."""
    rng = np.random.default_rng(8)
    off_list = 0
    for _ in range(60):
        args = random_window(rng, int(rng.integers(2, 30)), 5, 8)
        result = resolve(**args, settings=ResolverSettings(top_k=1))
        candidates = np.asarray(args["candidate_rider_index"])
        objectives = np.asarray(args["objectives"]).reshape(*candidates.shape, 3)
        for order, rider in enumerate(result.assigned_rider_index.tolist()):
            got = result.assigned_objectives[order]
            if rider < 0:
                assert got.tolist() == [0.0, 0.0, 0.0]
                continue
            (column,) = np.flatnonzero(candidates[order] == rider)
            assert got.tolist() == objectives[order, column].tolist()
            off_list += int(result.topk_rider_index[order, 0] != rider)
    assert off_list > 0


def test_full_riders_and_zero_capacity_get_nothing() -> None:
    args = one_order([(10.0, 0.9, 5.0), (20.0, 0.8, 6.0), (30.0, 0.7, 7.0)])
    args["rider_load"] = np.array([2, 0, 0], np.int32)
    args["rider_capacity"] = np.array([2, 0, 1], np.int32)
    result = resolve(**args)
    assert result.assigned_rider_index.tolist() == [2]
    args["rider_load"] = np.array([3, 5, 1], np.int32)
    assert resolve(**args).assigned_rider_index.tolist() == [-1]


def test_cardinality_beats_score() -> None:
    # Order 0 loves rider 0; order 1 can only use rider 0. Both served beats one happy order.
    args: Args = {
        "objectives": np.array(
            [[5, 1.0, 1], [60, 0.1, 40], [50, 0.2, 30], [0, 0, 0]], dtype=np.float32
        ),
        "candidate_rider_index": np.array([[0, 1], [0, -1]], np.int32),
        "rider_ids": rider_ids(2),
        "rider_load": np.zeros(2, np.int32),
        "rider_capacity": np.ones(2, np.int32),
        "weights": WEIGHTS,
    }
    assert resolve(**args).assigned_rider_index.tolist() == [1, 0]


def brute_force(
    index: NDArray[np.int64], score: NDArray[np.float64], spare: NDArray[np.int64]
) -> tuple[int, float]:
    options = [
        [-1, *[j for j in range(index.shape[1]) if index[b, j] >= 0]] for b in range(index.shape[0])
    ]
    best = (0, 0.0)
    for choice in itertools.product(*options):
        riders = [int(index[b, j]) for b, j in enumerate(choice) if j >= 0]
        if (np.bincount(riders, minlength=spare.size) > spare).any():
            continue
        total = sum(float(score[b, j]) for b, j in enumerate(choice) if j >= 0)
        count = len(riders)
        if count > best[0] or (count == best[0] and total > best[1]):
            best = (count, total)
    return best


@pytest.mark.parametrize("coarse", [False, True])
def test_assignment_matches_brute_force(coarse: bool) -> None:
    rng = np.random.default_rng(8 + coarse)
    for _ in range(300):
        orders, k, riders = (
            int(rng.integers(1, 6)),
            int(rng.integers(1, 4)),
            int(rng.integers(1, 5)),
        )
        index = np.full((orders, k), -1, dtype=np.int64)
        for b in range(orders):
            listed = rng.permutation(riders)[: int(rng.integers(0, min(k, riders) + 1))]
            index[b, : listed.size] = listed
        score = rng.integers(0, 5, index.shape) / 4.0 if coarse else rng.random(index.shape)
        capacity = rng.integers(0, 3, riders)
        load = rng.integers(0, 3, riders)
        spare = np.maximum(capacity - load, 0)
        assigned = assign(
            index.astype(np.int32), score, load.astype(np.int32), capacity.astype(np.int32)
        )
        assert assigned.shape == (orders,) and assigned.dtype == np.int32
        total = 0.0
        for b, rider in enumerate(assigned.tolist()):
            if rider >= 0:
                assert rider in index[b].tolist()
                total += float(score[b, index[b].tolist().index(rider)])
        assert (np.bincount(assigned[assigned >= 0], minlength=riders) <= spare).all()
        best_count, best_total = brute_force(index, score, spare)
        assert int((assigned >= 0).sum()) == best_count
        assert total == pytest.approx(best_total, abs=1e-9)


def test_resolve_assignment_is_optimal_on_small_windows() -> None:
    rng = np.random.default_rng(10)
    for _ in range(100):
        riders = int(rng.integers(2, 5))
        args = random_window(rng, int(rng.integers(1, 6)), riders, riders, missing=0.3)
        result = resolve(**args, settings=ResolverSettings(top_k=1))
        check_assignment(result, args)
        spare = np.maximum(args["rider_capacity"] - args["rider_load"], 0).astype(np.int64)
        # Optimal over every candidate, not only the (here one-long) Top-K lists.
        index = np.asarray(args["candidate_rider_index"], dtype=np.int64)
        scores = score_pairs(args["objectives"], args["weights"]).reshape(index.shape)
        best_count, best_total = brute_force(index, np.where(index >= 0, scores, 0.0), spare)
        assert int((result.assigned_rider_index >= 0).sum()) == best_count
        assert float(result.assigned_score.astype(np.float64).sum()) == pytest.approx(
            best_total, abs=1e-5
        )


# ---- validation ----------------------------------------------------------------------


def _set(name: str, value: Any) -> Callable[[Args], None]:
    def apply(args: Args) -> None:
        args[name] = value

    return apply


def _poke(name: str, where: Any, value: Any) -> Callable[[Args], None]:
    def apply(args: Args) -> None:
        array = args[name].copy()
        array[where] = value
        args[name] = array

    return apply


BAD_INPUTS: list[tuple[str, Callable[[Args], None], str]] = [
    ("too few pair rows", _set("objectives", np.zeros((5, 3), np.float32)), "PAIR_OBJECTIVES"),
    ("two columns", _set("objectives", np.zeros((12, 2), np.float32)), "PAIR_OBJECTIVES"),
    ("flat", _set("objectives", np.zeros(36, np.float32)), "PAIR_OBJECTIVES"),
    ("integer objectives", _set("objectives", np.zeros((12, 3), np.int32)), "PAIR_OBJECTIVES"),
    ("NaN on a valid pair", _poke("objectives", (0, 0), np.nan), "PAIR_OBJECTIVES"),
    ("inf on a valid pair", _poke("objectives", (1, 2), np.inf), "PAIR_OBJECTIVES"),
    ("negative ETA", _poke("objectives", (2, 0), -1.0), "PAIR_OBJECTIVES"),
    ("negative cost", _poke("objectives", (4, 2), -0.5), "PAIR_OBJECTIVES"),
    ("index below -1", _poke("candidate_rider_index", (0, 0), -2), "CANDIDATE_RIDER_INDEX"),
    ("index past R", _poke("candidate_rider_index", (1, 1), 6), "CANDIDATE_RIDER_INDEX"),
    ("duplicate rider", _poke("candidate_rider_index", (2, 1), 2), "CANDIDATE_RIDER_INDEX"),
    ("float index", _set("candidate_rider_index", np.zeros((3, 4))), "CANDIDATE_RIDER_INDEX"),
    ("1-D index", _set("candidate_rider_index", np.zeros(12, np.int32)), "CANDIDATE_RIDER_INDEX"),
    ("ids not bytes", _set("rider_ids", np.arange(6)), "RIDER_IDS"),
    ("id element not bytes", _poke("rider_ids", 2, 7), "RIDER_IDS"),
    ("ids 2-D", _set("rider_ids", rider_ids(6).reshape(2, 3)), "RIDER_IDS"),
    ("short load", _set("rider_load", np.zeros(5, np.int32)), "RIDER_LOAD"),
    ("negative load", _poke("rider_load", 1, -1), "RIDER_LOAD"),
    ("float capacity", _set("rider_capacity", np.ones(6)), "RIDER_CAPACITY"),
    ("negative capacity", _poke("rider_capacity", 0, -3), "RIDER_CAPACITY"),
    ("weights shape", _set("weights", np.ones(2)), "OBJECTIVE_WEIGHTS"),
    ("negative weight", _set("weights", np.array([1.0, -0.1, 0.1])), "OBJECTIVE_WEIGHTS"),
    ("zero weights", _set("weights", np.zeros(3)), "OBJECTIVE_WEIGHTS"),
    ("NaN weight", _set("weights", np.array([np.nan, 1.0, 1.0])), "OBJECTIVE_WEIGHTS"),
]


@pytest.mark.parametrize(("label", "mutate", "tensor"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_bad_tensors_are_named(label: str, mutate: Callable[[Args], None], tensor: str) -> None:
    args: Args = {
        "objectives": np.tile(np.array([[20.0, 0.8, 6.0]], np.float32), (12, 1)),
        "candidate_rider_index": np.array([[0, 1, 2, -1], [3, 4, 5, 0], [2, 3, -1, -1]], np.int32),
        "rider_ids": rider_ids(6),
        "rider_load": np.zeros(6, np.int32),
        "rider_capacity": np.ones(6, np.int32),
        "weights": WEIGHTS,
    }
    resolve(**args)  # the unbroken inputs are fine
    mutate(args)
    with pytest.raises(DispatchInputError) as caught:
        resolve(**args)
    assert caught.value.tensor == tensor
    assert str(caught.value).startswith(f"{tensor}: ")


@pytest.mark.parametrize("bad", [np.nan, -0.1, 1.5])
def test_assign_refuses_scores_outside_the_unit_interval(bad: float) -> None:
    with pytest.raises(DispatchInputError) as caught:
        assign([[0, 1]], [[0.5, bad]], [0, 0], [1, 1])
    assert caught.value.tensor == "TOPK_SCORE"


def test_garbage_on_missing_candidates_is_ignored() -> None:
    objectives = np.tile(np.array([[20.0, 0.8, 6.0]], np.float32), (4, 1))
    objectives[1] = (np.nan, -np.inf, -5.0)
    objectives[3] = (-1.0, 7.0, np.inf)
    result = resolve(
        objectives,
        np.array([[0, -1], [1, -1]], np.int32),
        rider_ids=rider_ids(2),
        rider_load=np.zeros(2, np.int32),
        rider_capacity=np.ones(2, np.int32),
        weights=WEIGHTS,
    )
    assert result.assigned_rider_index.tolist() == [0, 1]
    assert np.isfinite(result.topk_score).all()


def test_random_bad_data_raises_only_dispatch_input_error() -> None:
    """Whatever an upstream model emits, the resolver answers or names a tensor."""
    rng = np.random.default_rng(11)
    garbage = [np.nan, np.inf, -np.inf, -1.0, 0.0, 1e30, -1e30, 2.0]
    for _ in range(300):
        args = random_window(rng, int(rng.integers(1, 6)), 4, 6)
        args["objectives"] = args["objectives"].copy()
        rows = rng.integers(0, args["objectives"].shape[0], 3)
        args["objectives"][rows, rng.integers(0, 3, 3)] = rng.choice(garbage, 3)
        if rng.random() < 0.3:
            args["candidate_rider_index"] = rng.integers(-3, 9, args["candidate_rider_index"].shape)
        if rng.random() < 0.2:
            args["rider_load"] = rng.integers(-2, 4, 6).astype(np.int32)
        if rng.random() < 0.2:
            args["objectives"] = args["objectives"][: int(rng.integers(0, 20))]
        try:
            check_assignment(resolve(**args), args)
        except DispatchInputError as error:
            assert error.tensor in {
                "PAIR_OBJECTIVES",
                "CANDIDATE_RIDER_INDEX",
                "RIDER_LOAD",
            }


@pytest.mark.parametrize(
    "settings",
    [
        {"top_k": 0},
        {"top_k": 2.5},
        {"top_k": True},
        {"eta_scale_minutes": 0.0},
        {"cost_scale_cny": float("nan")},
    ],
)
def test_settings_are_checked(settings: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        ResolverSettings(**settings)


# ---- one window, several solves (pipeline.stacking) ----------------------------------------


@pytest.mark.parametrize("square", [False, True])
@pytest.mark.parametrize("coarse", [False, True])
def test_assignment_graph_is_optimal_with_and_without_dummies(coarse: bool, square: bool) -> None:
    """The graph leaves the dummies out when every order with a usable candidate can be
    served; either way, rectangular or square (the slots' "unused" rows), each solve is the
    lexicographic optimum, and the window's `assign` (the uncontested shortcut first, then
    the rectangular graph these sizes get) equals the rectangular `solve`. Scores by slot
    rank too (`solve_ranked`): the optimum over every ranking of each rider's orders."""
    from dispatch_service.domain.assignment import AssignmentGraph
    from dispatch_service.domain.resolver import ResolverWindow

    rng = np.random.default_rng(30 + coarse)
    paths = {True: 0, False: 0}
    for _ in range(300):
        orders, k, riders = (
            int(rng.integers(0, 6)),
            int(rng.integers(1, 4)),
            int(rng.integers(1, 5)),
        )
        index = np.full((orders, k), -1, dtype=np.int64)
        for b in range(orders):
            listed = rng.permutation(riders)[: int(rng.integers(0, min(k, riders) + 1))]
            index[b, rng.permutation(k)[: listed.size]] = listed
        spare = rng.integers(0, 3, riders).astype(np.int64)
        graph = AssignmentGraph.build(index, spare, square=square)
        window = ResolverWindow(
            np.arange(riders).astype(bytes), index, spare, np.ones(3), ResolverSettings()
        )
        paths[graph.may_leave_unassigned] += 1
        for _ in range(3):  # the same graph, solved for other scores
            score = rng.integers(0, 4, index.shape) / 4.0 if coarse else rng.random(index.shape)
            assigned = graph.solve(score)
            if not square:  # a square graph may break an exact tie the other way
                np.testing.assert_array_equal(window.assign(score.reshape(-1, 1)), assigned)
            assert (np.bincount(assigned[assigned >= 0], minlength=spare.size) <= spare).all()
            total = 0.0
            for b, rider in enumerate(assigned.tolist()):
                if rider >= 0:
                    total += float(score[b, index[b].tolist().index(rider)])
            best_count, best_total = brute_force(index, score, spare)
            assert int((assigned >= 0).sum()) == best_count
            assert total == pytest.approx(best_total, abs=1e-9)
            # By rank: each row non-increasing; rank k of a pair past the last column reads it.
            drops = (
                rng.integers(0, 3, (index.size, 3)) / 8.0
                if coarse
                else rng.random((index.size, 3)) / 3
            )
            ranked = np.clip(score.reshape(-1, 1) - np.cumsum(drops, axis=1) + drops[:, :1], 0, 1)
            assigned = graph.solve_ranked(ranked)
            if not square:
                np.testing.assert_array_equal(window.assign(ranked), assigned)
            assert (np.bincount(assigned[assigned >= 0], minlength=spare.size) <= spare).all()
            best_count, best_total = brute_force_ranked(index, ranked, spare)
            assert int((assigned >= 0).sum()) == best_count
            assert ranked_value(index, ranked, assigned) == pytest.approx(best_total, abs=1e-9)
    assert min(paths.values()) > 30  # both layouts really ran


def ranked_value(
    index: NDArray[np.int64], ranked: NDArray[np.float64], assigned: Sequence[int]
) -> float:
    """An assignment's total of rank scores, each rider's orders ranked at their best."""
    width, total = index.shape[1], 0.0
    for rider in set(assigned) - {-1}:
        mine = [b for b, r in enumerate(assigned) if r == rider]
        rows = [b * width + index[b].tolist().index(rider) for b in mine]
        total += max(
            sum(float(ranked[row, min(k, ranked.shape[1] - 1)]) for k, row in enumerate(order))
            for order in itertools.permutations(rows)
        )
    return total


def brute_force_ranked(
    index: NDArray[np.int64], ranked: NDArray[np.float64], spare: NDArray[np.int64]
) -> tuple[int, float]:
    """Most orders, then the best `ranked_value`, over every capacity-respecting choice."""
    options = [[-1, *[int(r) for r in index[b] if r >= 0]] for b in range(index.shape[0])]
    best = (0, 0.0)
    for choice in itertools.product(*options):
        taken = [r for r in choice if r >= 0]
        if (np.bincount(taken, minlength=spare.size) > spare).any():
            continue
        key = (len(taken), ranked_value(index, ranked, list(choice)))
        if key[0] > best[0] or (key[0] == best[0] and key[1] > best[1]):
            best = key
    return best


def test_resolver_window_pair_objectives_are_checked_like_resolve() -> None:
    from dispatch_service.domain.resolver import ResolverWindow

    rng = np.random.default_rng(31)
    args = random_window(rng, 12, 5, 20)
    window = ResolverWindow.checked(
        args["candidate_rider_index"],
        rider_ids=args["rider_ids"],
        rider_load=args["rider_load"],
        rider_capacity=args["rider_capacity"],
        weights=args["weights"],
    )
    objectives = window.objectives(args["objectives"])
    scores = window.scores(objectives)
    rows = np.flatnonzero(np.asarray(args["candidate_rider_index"]).reshape(-1) >= 0)[::3]
    changed = np.asarray(args["objectives"]).copy()
    changed[rows] = changed[rows] * np.float32(1.5)
    objectives.reshape(-1, 3)[rows] = window.pair_objectives(rows, changed[rows])
    fresh = window.objectives(changed)
    np.testing.assert_array_equal(objectives, fresh)
    np.testing.assert_array_equal(window.scores(objectives), window.scores(fresh))
    assert not np.array_equal(scores, window.scores(fresh))
    # Given the optimal assignment, the answer is resolve's.
    expected = resolve(**{**args, "objectives": changed}).as_tensors()
    optimal = expected["ASSIGNED_RIDER_INDEX"].astype(np.int64)
    for given in (None, optimal):
        got = window.resolution(objectives, given).as_tensors()
        for name, value in expected.items():
            np.testing.assert_array_equal(got[name], value)
    # A bad row is refused as resolve refuses it, naming the same row.
    bad = changed.copy()
    bad[rows[1], 0] = -1.0
    with pytest.raises(DispatchInputError) as direct:
        resolve(**{**args, "objectives": bad})
    with pytest.raises(DispatchInputError) as updated:
        window.pair_objectives(rows, bad[rows])
    assert str(updated.value) == str(direct.value)


# ---- resolve_many: several windows at once ----------------------------------------------


def _random_window(
    rng: np.random.Generator, orders: int, riders: int, width: int, tied: bool = False
) -> tuple[ResolverWindow, NDArray[np.float64]]:
    candidates = np.full((orders, width), -1, dtype=np.int64)
    for b in range(orders):
        listed = int(rng.integers(0, min(width, riders) + 1))
        candidates[b, :listed] = rng.choice(riders, size=listed, replace=False)
    ids = np.array([f"rider-{rng.integers(0, 1000)}-{r}" for r in range(riders)], dtype=object)
    capacity = rng.integers(0, 4, riders)
    window = ResolverWindow.checked(
        candidates,
        rider_ids=ids,
        rider_load=rng.integers(0, 3, riders),
        rider_capacity=capacity,
        weights=rng.random(3) + 0.01,
    )
    objectives = np.column_stack(
        (
            rng.uniform(5.0, 60.0, orders * width),
            rng.random(orders * width),
            rng.uniform(3.0, 30.0, orders * width),
        )
    ).astype(np.float32)
    if tied:  # every pair alike: every order's best rider is tied
        objectives[:] = objectives[0]
    return window, window.objectives(objectives)


def _same_resolution(got: Resolution, alone: Resolution) -> None:
    for name in Resolution.__dataclass_fields__:
        a, b = getattr(got, name), getattr(alone, name)
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if a.dtype == object:
            assert a.tolist() == b.tolist(), name
        else:
            assert a.tobytes() == b.tobytes(), name


@pytest.mark.parametrize("seed", range(40))
def test_many_windows_resolved_at_once_answer_byte_for_byte_like_each_alone(seed: int) -> None:
    # Windows of two widths, each with its own weights, riders and capacities, some with
    # every pair tied (so the shared assignment cannot be used and each is solved alone).
    rng = np.random.default_rng(seed)
    items = [
        _random_window(
            rng,
            int(rng.integers(1, 5)),
            int(rng.integers(1, 30)),
            int(rng.choice([3, 16])),
            tied=bool(rng.random() < 0.15),
        )
        for _ in range(int(rng.integers(1, 9)))
    ]
    together = resolve_many(items)
    assert len(together) == len(items)
    for (window, objectives), got in zip(items, together, strict=True):
        _same_resolution(got, window.resolution(objectives))


def test_uncontested_windows_share_one_pass_and_a_tie_falls_back_to_each_alone() -> None:
    rng = np.random.default_rng(3)
    plain = [_random_window(rng, 1, 20, 16) for _ in range(6)]
    assert _resolve_stacked(plain) is not None  # the shared path is the one taken
    tied = [*plain, _random_window(rng, 2, 20, 16, tied=True)]
    assert _resolve_stacked(tied) is None
    for (window, objectives), got in zip(tied, resolve_many(tied), strict=True):
        _same_resolution(got, window.resolution(objectives))


# ---- checked_together: several windows' checks at once ----------------------------------


def _window_tensors(rng: np.random.Generator, width: int, riders: int = 0) -> WindowTensors:
    riders = riders or int(rng.integers(width, 30))
    args = random_window(rng, int(rng.integers(1, 5)), width, riders)
    weights = (rng.random(3) + 0.01).astype(np.float64)
    return (
        args["candidate_rider_index"],
        args["rider_ids"],
        args["rider_load"],
        args["rider_capacity"],
        weights,
        args["objectives"],
    )


def _checked_alone(parts: WindowTensors) -> tuple[ResolverWindow, NDArray[np.float64]]:
    candidates, ids, load, capacity, weights, objectives = parts
    window = ResolverWindow.checked(
        candidates, rider_ids=ids, rider_load=load, rider_capacity=capacity, weights=weights
    )
    return window, window.objectives(objectives)


@pytest.mark.parametrize("seed", range(10))
def test_windows_checked_together_are_each_exactly_as_checked_alone(seed: int) -> None:
    rng = np.random.default_rng(seed)
    windows = [_window_tensors(rng, 6) for _ in range(int(rng.integers(1, 7)))]
    together = checked_together(windows, ResolverSettings())
    assert together is not None and len(together) == len(windows)
    for parts, (window, objectives) in zip(windows, together, strict=True):
        alone, alone_objectives = _checked_alone(parts)
        for name in ("rider_ids", "candidates", "spare", "weights"):
            got, want = getattr(window, name), getattr(alone, name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert got.tolist() == want.tolist(), name
        assert objectives.dtype == alone_objectives.dtype
        assert objectives.tobytes() == alone_objectives.tobytes()
        assert window.settings == alone.settings


def _broken(case: str, parts: WindowTensors) -> WindowTensors:
    candidates, ids, load, capacity, weights, objectives = (np.array(p, copy=True) for p in parts)
    if case == "rider_of_another_window":  # in range of the batch, not of its own window
        candidates[0, 0] = ids.shape[0]
        objectives[0] = (10.0, 0.5, 5.0)  # a pair that was missing carried NaN
    elif case == "repeated_candidate":
        candidates[0, 1] = candidates[0, 0] = 0
    elif case == "negative_load":
        load[0] = -1
    elif case == "negative_eta":
        objectives[:, 0] = -1.0  # on every pair; the missing ones are ignored
    elif case == "bad_weights":
        weights[:] = (-1.0, 1.0, 1.0)
    elif case == "float_capacity":
        capacity = capacity.astype(np.float32)
    return candidates, ids, load, capacity, weights, objectives


@pytest.mark.parametrize(
    "case",
    [
        "rider_of_another_window",
        "repeated_candidate",
        "negative_load",
        "negative_eta",
        "bad_weights",
        "float_capacity",
    ],
)
def test_a_window_that_breaks_a_rule_sends_every_window_to_be_checked_alone(case: str) -> None:
    rng = np.random.default_rng(7)
    # The others have more riders than the first: a row past its own stays in the batch's.
    windows = [_window_tensors(rng, 6, riders) for riders in (6, 20, 20)]
    bad = _broken(case, windows[0])
    with pytest.raises(DispatchInputError):
        _checked_alone(bad)  # the rule a window alone breaks
    assert checked_together([bad, *windows[1:]], ResolverSettings()) is None


def test_windows_of_different_widths_are_not_checked_together() -> None:
    rng = np.random.default_rng(2)
    windows = [_window_tensors(rng, 6), _window_tensors(rng, 4)]
    assert checked_together(windows, ResolverSettings()) is None
    assert checked_together([], ResolverSettings()) == []


@pytest.mark.parametrize(
    ("row", "column", "value", "rule"),
    [
        (4, 0, np.nan, "must be finite on valid pairs, got NaN or infinity (row 4)"),
        (3, 1, np.inf, "must be finite on valid pairs, got NaN or infinity (row 3)"),
        (2, 0, -1.0, "ETA minutes must be >= 0 on valid pairs (row 2)"),
        (5, 2, -0.5, "cost must be >= 0 on valid pairs (row 5)"),
    ],
)
def test_a_bad_objective_on_a_valid_pair_is_named_by_row(
    row: int, column: int, value: float, rule: str
) -> None:
    from dispatch_service.domain.resolver_inputs import checked_objectives

    objectives = np.full((6, 3), 1.0, dtype=np.float32)
    objectives[1] = [np.nan, -1.0, -1.0]  # a padded pair: never checked
    objectives[row, column] = value
    valid = np.array([[True, False, True], [True, True, True]])
    with pytest.raises(DispatchInputError) as caught:
        checked_objectives(objectives, valid)
    assert caught.value.rule == rule
    objectives[row, column] = 1.0
    assert checked_objectives(objectives, valid)[0, 1].tolist() == [0.0, 0.0, 0.0]


def test_the_assigned_values_are_the_sums_over_each_row_bit_for_bit() -> None:
    """`_row_sums` gathers what ``np.where(at, values, 0.0).sum(axis=1)`` adds up: the one
    marked cell plus 0.0 (a -0.0 reads 0.0, even on a row of one), 0.0 without one; for
    scores [B, N] and objectives [B, N, 3], rows of width 0 to 19."""
    rng = np.random.default_rng(0)
    for _ in range(1000):
        orders, width = int(rng.integers(0, 6)), int(rng.integers(0, 20))
        objectives = rng.choice([-0.0, 0.0, 1.5, -2.25, 1e-300, 3.0], size=(orders, width, 3))
        at = np.zeros((orders, width), dtype=np.bool_)
        for b in range(orders):
            if width and rng.random() < 0.7:
                at[b, rng.integers(0, width)] = True
        for values, marked in ((objectives[..., 0].copy(), at), (objectives, at[..., None])):
            expected = np.where(marked, values, 0.0).sum(axis=1)
            assert _row_sums(at, values).tobytes() == expected.tobytes()
