"""dispatch_service.domain.window_kernels against the rules in plain Python and numpy.

Each kernel is compared with the code it replaced, written here independently of numba:
the candidates' ranking with `geo.haversine_km` and Python's sort; the pre-selection by dot
product (over `candidates`' grid of riders) with numpy's products and a full sort; the
coverage's proposal
rounds with the rule played round by round; the one-order answer
with the resolver's keys and `uncontested_best`'s rule on Python floats (Python's sorted
over key tuples, rounded to float32 by numpy); the value checks with numpy comparisons
over the packed matrices.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_service.domain import geo
from dispatch_service.domain.candidates import _rider_grid
from dispatch_service.domain.window_kernels import (
    ANSWERED,
    NOT_USABLE,
    TIED,
    largest_dots,
    nearest_first,
    one_order_answer,
    proposal_rounds,
    usual_values,
)

_SCALES = (30.0, 20.0)  # ETA minutes, cost


def _reference(
    rows: list[int],
    values: list[list[float]],
    hashes: list[int],
    load: list[int],
    capacity: list[int],
    weights: tuple[float, float, float],
    top_k: int,
) -> tuple[int, Any]:
    """The answer as Python computes it: (outcome, (top rows, top values, assigned row,
    assigned score, assigned values)) with the float64 values before rounding."""
    values = [[0.0] * 3 if row < 0 else list(v) for row, v in zip(rows, values, strict=True)]
    if not all(
        0 <= e < math.inf and 0 <= c < math.inf and -math.inf < p < math.inf for e, p, c in values
    ):
        return NOT_USABLE, None
    w_eta, w_ontime, w_cost = weights
    total = w_eta + w_ontime + w_cost
    scores = [
        (w_eta * (1.0 / (1.0 + e / _SCALES[0])) + w_ontime * min(max(p, 0.0), 1.0)
         + w_cost * (1.0 / (1.0 + c / _SCALES[1]))) / total
        if row >= 0 else 0.0
        for row, (e, p, c) in zip(rows, values, strict=True)
    ]  # fmt: skip
    keys = [
        (row < 0, -s, e, -p, c, h if row >= 0 else 0, row if row >= 0 else len(load))
        for row, s, (e, p, c), h in zip(rows, scores, values, hashes, strict=True)
    ]
    order = sorted(range(len(rows)), key=keys.__getitem__)
    usable = [j for j in order if rows[j] >= 0 and capacity[rows[j]] > load[rows[j]]]
    best = -1
    if usable:
        costs = [2.0 - scores[j] for j in usable]
        if costs.count(min(costs)) > 1:
            return TIED, None
        best = usable[costs.index(min(costs))]
    zero = 0.0 if len(rows) > 1 else -0.0
    top = order[:top_k]
    return ANSWERED, (
        [rows[j] for j in top],
        [[scores[j], *values[j]] for j in top],
        rows[best] if best >= 0 else -1,
        scores[best] + zero if best >= 0 else 0.0,
        [v + zero for v in (values[best] if best >= 0 else [0.0] * 3)],
    )


def _kernel(
    rows: list[int],
    objectives: NDArray[np.float32],
    hashes: list[int],
    load: list[int],
    capacity: list[int],
    weights: tuple[float, float, float],
    top_k: int,
) -> tuple[int, Any]:
    k = min(top_k, len(rows))
    out = (
        np.empty((1, k), np.int32),
        np.empty((1, k, 4), np.float32),
        np.empty(1, np.int32),
        np.empty(1, np.float32),
        np.empty((1, 3), np.float32),
    )
    rider_hash = [h if r >= 0 else 0 for r, h in zip(rows, hashes, strict=True)]
    outcome = one_order_answer(
        (np.array(rows, np.int32), objectives, np.array(rider_hash, np.uint64)),
        (np.array(load, np.int32), np.array(capacity, np.int32)),
        (*weights, float(np.sum(weights)), *_SCALES),
        out,
    )
    return outcome, out


def _case(rng: np.random.Generator) -> tuple[Any, ...]:
    riders = int(rng.integers(1, 30))
    width = int(rng.integers(1, 17))
    rows = [int(r) for r in rng.permutation(riders)[:width]] + [-1] * max(0, width - riders)
    rows = [r for r in rows[:width]]
    pads = rng.random(width) < 0.2
    rows = [-1 if pad else r for r, pad in zip(rows, pads, strict=True)]
    objectives = np.stack(
        (rng.uniform(0, 90, width), rng.uniform(-0.2, 1.2, width), rng.uniform(0, 60, width)), 1
    ).astype(np.float32)
    if width > 1 and rng.random() < 0.4:  # a twin: every value the same as another position's
        objectives[1] = objectives[0]
    if rng.random() < 0.2:  # clamped on-time values tie
        objectives[:, 1] = np.clip(objectives[:, 1], 0, 1)
    if rng.random() < 0.1:
        objectives[int(rng.integers(width)), int(rng.integers(3))] = rng.choice(
            [np.nan, -1.0, np.inf, -0.0]
        )
    hashes = [int(h) for h in rng.integers(0, 2**63, width)]
    if width > 1 and rng.random() < 0.2:
        hashes[1] = hashes[0]  # equal hashes: the rows decide
    capacity = [int(c) for c in rng.integers(1, 4, riders)]
    load = [c if rng.random() < 0.3 else c - 1 for c in capacity]
    weights = tuple(float(w) for w in rng.choice([0.0, 0.5, 1.0, 2.0], 3))
    if sum(weights) == 0.0:
        weights = (1.0, 0.0, 0.0)
    return rows, objectives, hashes, load, capacity, weights, int(rng.integers(1, 8))


def test_one_order_answer_matches_the_python_rules_bit_for_bit() -> None:
    rng = np.random.default_rng(49)
    seen = {ANSWERED: 0, NOT_USABLE: 0, TIED: 0}
    for _ in range(3000):
        rows, objectives, hashes, load, capacity, weights, top_k = _case(rng)
        values = objectives.astype(np.float64).tolist()
        expected, answer = _reference(rows, values, hashes, load, capacity, weights, top_k)
        got, out = _kernel(rows, objectives, hashes, load, capacity, weights, top_k)
        assert got == expected
        seen[got] += 1
        if got != ANSWERED:
            continue
        top_rows, top_values, assigned, score, assigned_values = answer
        assert out[0].tolist() == [top_rows]
        np.testing.assert_array_equal(out[1], np.array([top_values], np.float32))
        assert int(out[2][0]) == assigned
        assert out[3].tobytes() == np.array([score], np.float32).tobytes()  # -0.0 kept
        assert out[4].tobytes() == np.array([assigned_values], np.float32).tobytes()
    assert min(seen.values()) > 30  # every outcome was exercised


def test_a_lone_candidate_keeps_a_negative_zero_and_a_full_rider_is_not_assigned() -> None:
    objectives = np.array([[-0.0, 0.5, 10.0]], np.float32)
    got, out = _kernel([0], objectives, [7], [0], [1], (1.0, 1.0, 1.0), 5)
    assert got == ANSWERED
    assert out[4].tobytes() == np.array([[-0.0, 0.5, 10.0]], np.float32).tobytes()
    got, out = _kernel([0], objectives, [7], [1], [1], (1.0, 1.0, 1.0), 5)
    assert got == ANSWERED and int(out[2][0]) == -1 and out[1].shape == (1, 1, 4)


# packed columns: (lat, lon, whole, whole) with bounds per column
_LOW = np.array([-90.0, -180.0, 0.0, 0.0])
_HIGH = np.array([90.0, 180.0, 1000.0, 7.0])
_WHOLE = np.array([2, 3], dtype=np.int64)


def _numpy_checks(orders: NDArray[np.float64], riders: NDArray[np.float64], cap: float) -> bool:
    """`window_wire._usual_window`'s former numpy expressions for the same bounds."""
    high = _HIGH.copy()
    high[2] = min(high[2], cap)
    return bool(
        ((orders >= _LOW) & (orders <= high)).all()
        and ((riders >= _LOW) & (riders <= _HIGH)).all()
        and (orders[:, _WHOLE] == np.floor(orders[:, _WHOLE])).all()
        and (riders[:, _WHOLE] == np.floor(riders[:, _WHOLE])).all()
        and not (orders[:, 3].astype(np.int32) & ~5).any()
    )


@pytest.mark.parametrize("seed", range(3))
def test_usual_values_judges_as_the_numpy_checks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    verdicts = set()
    for _ in range(1500):
        matrices = []
        for count in (int(rng.integers(1, 5)), int(rng.integers(1, 30))):
            m = np.stack(
                (
                    rng.uniform(-90, 90, count),
                    rng.uniform(-180, 180, count),
                    rng.integers(0, 1001, count).astype(np.float64),
                    rng.choice([0.0, 1.0, 4.0, 5.0], count),
                ),
                1,
            )
            if rng.random() < 0.5:
                m[int(rng.integers(count)), int(rng.integers(4))] = rng.choice(
                    [np.nan, np.inf, -np.inf, 0.5, 1000.5, -0.0, 2.0, 7.0, 8.0, 90.0, 180.5]
                )
            matrices.append(m)
        orders, riders = matrices
        cap = float(rng.choice([1000.0, 500.0, 999.5]))
        expected = _numpy_checks(orders, riders, cap)
        assert (
            usual_values(
                orders, (_LOW, _HIGH, _WHOLE), riders, (_LOW, _HIGH, _WHOLE), (2, cap, 3, 5)
            )
            is expected
        )
        verdicts.add(expected)
    assert verdicts == {True, False}


def test_nearest_first_ranks_by_haversine_and_declines_equal_distances() -> None:
    rng = np.random.default_rng(7)
    declined = 0
    for _ in range(500):
        count = int(rng.integers(1, 25))
        positions = np.stack(
            (rng.uniform(30.0, 30.2, count + 5), rng.uniform(120.0, 120.2, count + 5)), 1
        )
        if rng.random() < 0.3:  # a co-located twin
            positions[1] = positions[0]
        pickup = np.array([[30.1, 120.1]])
        rows = np.sort(rng.choice(count + 5, size=count, replace=False)).astype(np.int64)
        take = int(rng.integers(1, count + 1))
        km = geo.haversine_km(
            positions[rows, 0], positions[rows, 1], pickup[0, 0], pickup[0, 1]
        ).tolist()
        out = np.full(take, -1, dtype=np.int32)
        ranked = nearest_first((rows, positions), (pickup, 0), geo.EARTH_RADIUS_KM, out)
        if len(set(km)) < count:
            assert not ranked and (out == -1).all()
            declined += 1
            continue
        assert ranked
        assert (
            out.tolist() == [int(rows[i]) for i in sorted(range(count), key=km.__getitem__)][:take]
        )
    assert declined > 20


def _unit_vectors(lat: NDArray[np.float64], lon: NDArray[np.float64]) -> NDArray[np.float64]:
    lat, lon = np.radians(lat), np.radians(lon)
    return np.stack((np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)), 1)


@pytest.mark.parametrize("grid", [False, True])
def test_largest_dots_keeps_the_largest_and_names_the_best_left_out(grid: bool) -> None:
    rng = np.random.default_rng(5)
    gridded = 0
    for case in range(300):
        orders, riders = int(rng.integers(1, 12)), int(rng.integers(2, 400))
        keep = int(rng.integers(1, min(riders, 30)))
        span = (0.3, 40.0, 0.0)[case % 3]  # a city (the grid pays), far apart, one spot
        low_lat = 89.8 if case % 7 == 0 else 30.0  # at a pole the plane turns
        lat = rng.uniform(low_lat, low_lat + min(span, 0.2 if low_lat > 80 else span), riders)
        lon = rng.uniform(120.0, 120.0 + span, riders)
        if rng.random() < 0.3:  # co-located riders: equal dot products
            lat[1::2], lon[1::2] = lat[0], lon[0]
        fleet = _unit_vectors(lat, lon)
        pickups = _unit_vectors(
            rng.uniform(low_lat - 0.1, low_lat + 0.1 + min(span, 0.1), orders),
            rng.uniform(119.9, 120.1 + span, orders),
        )
        # the same products and sums in the same order, elementwise (IEEE: the same bits)
        dots = (
            pickups[:, None, 0] * fleet[None, :, 0] + pickups[:, None, 1] * fleet[None, :, 1]
        ) + pickups[:, None, 2] * fleet[None, :, 2]
        # as many orders again, or not: the grid pays from `candidates._GRID_FROM` pairs
        many = np.tile(pickups, (1 + (1 << 15) // riders if grid else 1, 1))
        bucketed, shape, plane = _rider_grid(fleet, many)
        gridded += shape[1] != (1, 1)
        best = np.empty((orders, keep), dtype=np.int64)
        cut = np.empty(orders)
        largest_dots((pickups, plane[:, :orders]), bucketed, shape, (best, cut))
        for b in range(orders):
            kept = dots[b, best[b]]
            left = np.delete(dots[b], best[b])
            assert len(set(best[b].tolist())) == keep
            assert sorted(kept.tolist()) == sorted(dots[b].tolist())[-keep:]
            assert cut[b] == left.max() <= kept.min()
    assert gridded > 150 if grid else gridded == 0


def test_largest_dots_over_riders_with_no_mean_direction() -> None:
    """Riders whose directions cancel out exactly (no plane to lean on): the grid still cuts
    a plane, and the kept riders are the largest dot products."""
    fleet = np.concatenate((np.eye(3), -np.eye(3)))
    assert not fleet.sum(axis=0).any()
    pickups = _unit_vectors(np.array([10.0, -40.0, 80.0]), np.array([20.0, 130.0, -70.0]))
    bucketed, shape, plane = _rider_grid(fleet, np.tile(pickups, (1 << 13, 1)))
    assert np.isfinite(plane).all()
    best, cut = np.empty((3, 3), dtype=np.int64), np.empty(3)
    largest_dots((pickups, plane[:, :3]), bucketed, shape, (best, cut))
    dots = (pickups[:, None, 0] * fleet[None, :, 0] + pickups[:, None, 1] * fleet[None, :, 1]) + (
        pickups[:, None, 2] * fleet[None, :, 2]
    )
    for b in range(3):
        assert sorted(dots[b, best[b]].tolist()) == sorted(dots[b].tolist())[-3:]
        assert cut[b] == np.delete(dots[b], best[b]).max()


def _rounds_by_hand(candidates: list[list[int]], spare: list[int]) -> list[int]:
    """Proposal rounds as the rule says them: each round's proposals grouped by rider, each
    rider taking its lowest-numbered proposers while the slots it had at the round's start
    last."""
    rider_of = [-1] * len(candidates)
    left = list(spare)
    pending = list(range(len(candidates)))
    for k in range(len(candidates[0]) if candidates else 0):
        pending = [b for b in pending if candidates[b][k] >= 0]
        asked: dict[int, list[int]] = {}
        for b in pending:
            asked.setdefault(candidates[b][k], []).append(b)
        for rider, proposers in asked.items():
            taken = sorted(proposers)[: max(left[rider], 0)]
            for b in taken:
                rider_of[b] = rider
            left[rider] -= len(taken)
        pending = [b for b in pending if rider_of[b] < 0]
    return rider_of


def test_proposal_rounds_accept_the_lowest_numbered_proposers_round_by_round() -> None:
    rng = np.random.default_rng(11)
    served = 0
    for _ in range(3000):
        orders, riders, width = (int(x) for x in rng.integers(1, [30, 20, 8]))
        candidates = rng.integers(-1, riders, size=(orders, width)).astype(np.int32)
        spare = rng.integers(0, 3, riders).astype(np.int64)
        rider_of = np.empty(orders, dtype=np.int64)
        proposal_rounds(candidates, spare, np.empty(riders, dtype=np.int64), rider_of)
        assert rider_of.tolist() == _rounds_by_hand(candidates.tolist(), spare.tolist())
        served += int((rider_of >= 0).sum())
    assert served > 1000
