"""Scarce windows list more candidates (`coverage.list_width`): the served decision is then
the exact optimum over every order's 32 nearest riders, judged against scipy's
linear_sum_assignment over every feasible pair and a brute-force nearest ranking."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from numpy.typing import NDArray
from scipy.optimize import linear_sum_assignment

from dispatch_service.domain import features
from dispatch_service.domain.coverage import SCARCE_CANDIDATES, is_scarce, list_width
from dispatch_service.domain.feasibility import spare_slots
from dispatch_service.domain.features import EncoderSettings, feasible_mask
from dispatch_service.domain.resolver import resolve
from dispatch_service.domain.scoring import score_pairs
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.offline.simulator import REGIMES, generate_regime_window

EARTH_KM = 6371.0088


def test_a_window_is_scarce_below_five_spare_slots_per_four_orders() -> None:
    # 64 orders: 80 slots is 1.25 per order, not scarce; 79 is.
    assert is_scarce(79, 64) and not is_scarce(80, 64)
    assert list_width(16, 79, 64) == SCARCE_CANDIDATES == 32
    assert list_width(16, 80, 64) == 16
    assert is_scarce(0, 1) and not is_scarce(0, 0)  # no order: nothing to be short of


def haversine_km(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
    """[len(a), len(b)] great-circle km between [lat, lon] rows (the textbook formula)."""
    lat1, lon1 = np.radians(a[:, None, 0]), np.radians(a[:, None, 1])
    lat2, lon2 = np.radians(b[None, :, 0]), np.radians(b[None, :, 1])
    h = (
        np.sin((lat2 - lat1) / 2) ** 2
        + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2) ** 2
    )
    return np.asarray(2 * EARTH_KM * np.arcsin(np.sqrt(h)))


def nearest_feasible(window: DispatchWindow, n: int) -> NDArray[np.int64]:
    """[B, n]: per order its n nearest feasible riders by a sort of every distance."""
    dist = np.where(
        feasible_mask(window), haversine_km(window.pickup, window.rider_position), np.inf
    )
    ranked = np.argsort(dist, axis=1, kind="stable")[:, :n]
    return np.where(np.take_along_axis(dist, ranked, axis=1) < np.inf, ranked, -1)


def scarce_window(seed: int, orders: int, riders: int) -> DispatchWindow:
    regime = dataclasses.replace(REGIMES["scarcity"], num_orders=orders, num_riders=riders)
    return generate_regime_window(np.random.default_rng(seed), regime)


@pytest.mark.parametrize("seed", range(6))
def test_a_scarce_window_lists_its_32_nearest_riders(seed: int) -> None:
    window = scarce_window(seed, 64, 400)
    spare = spare_slots(window.rider_load, window.rider_capacity)
    assert spare.sum() < 1.25 * window.num_orders and window.num_riders > 40
    got = features.window_candidates(window, EncoderSettings(), widen_scarce=True)
    assert got.shape == (window.num_orders, 32)
    # The coverage may put a farther rider in an order's last column, never elsewhere.
    np.testing.assert_array_equal(got[:, :31], nearest_feasible(window, 31))
    # Without widen_scarce (training's windows) the lists keep the configured N.
    assert features.window_candidates(window, EncoderSettings()).shape[1] == 16


@pytest.mark.parametrize("regime", ["default", "peak", "night", "long_distance"])
def test_windows_with_riders_to_spare_keep_their_lists(regime: str) -> None:
    rng = np.random.default_rng(3)
    for _ in range(4):
        window = generate_regime_window(rng, REGIMES[regime])
        spare = spare_slots(window.rider_load, window.rider_capacity)
        assert spare.sum() >= 1.25 * window.num_orders
        wide = features.window_candidates(window, EncoderSettings(), widen_scarce=True)
        assert wide.tobytes() == features.window_candidates(window, EncoderSettings()).tobytes()


def best_assignment(score: NDArray[np.float64], spare: NDArray[np.int64]) -> tuple[int, float]:
    """(orders served, score sum) of the best assignment over every pair with a finite
    ``score`` [B, R]: most orders, then the largest sum (linear_sum_assignment over orders x
    rider slots, one private "unassigned" column per order)."""
    num_orders = score.shape[0]
    slot_rider = np.repeat(np.arange(spare.size), spare)
    big = 10.0 * (num_orders + 1)  # one more order served outweighs any score sum
    cost = np.full((num_orders, slot_rider.size + num_orders), 1e9)
    pair = score[:, slot_rider]
    cost[:, : slot_rider.size] = np.where(np.isfinite(pair), -(big + pair), 1e9)
    cost[np.arange(num_orders), slot_rider.size + np.arange(num_orders)] = 0.0
    rows, cols = linear_sum_assignment(cost)
    served = cols < slot_rider.size
    return int(served.sum()), float(score[rows[served], slot_rider[cols[served]]].sum())


@pytest.mark.parametrize("seed", range(30))
def test_the_served_decision_in_a_small_scarce_window_is_the_exact_optimum(seed: int) -> None:
    # Up to 32 riders: a scarce window's lists hold every feasible rider, so the resolver's
    # answer must be the optimum over the whole feasible graph. Three candidates per order
    # (as configured here) fall short of it in some windows.
    rng = np.random.default_rng(seed)
    window = scarce_window(seed, int(rng.integers(6, 14)), 60)
    assert window.num_riders <= 32
    spare = spare_slots(window.rider_load, window.rider_capacity)
    objectives = np.column_stack(
        (
            rng.uniform(5.0, 90.0, window.num_orders * window.num_riders),
            rng.uniform(0.0, 1.0, window.num_orders * window.num_riders),
            rng.uniform(5.0, 40.0, window.num_orders * window.num_riders),
        )
    ).reshape(window.num_orders, window.num_riders, 3)
    weights = np.array([0.8, 0.0, 0.2])
    score = np.where(feasible_mask(window), score_pairs(objectives, weights), -np.inf)
    optimum = best_assignment(score, spare)

    def served(settings: EncoderSettings, widen: bool) -> tuple[int, float]:
        candidates = features.window_candidates(window, settings, widen_scarce=widen)
        rows = np.repeat(np.arange(window.num_orders), candidates.shape[1])
        pairs = objectives[rows, np.maximum(candidates.reshape(-1), 0)]
        assigned = resolve(
            pairs.astype(np.float32),
            candidates,
            rider_ids=window.rider_ids,
            rider_load=window.rider_load,
            rider_capacity=window.rider_capacity,
            weights=weights,
            order_ids=window.order_ids,
        ).assigned_rider_index
        rows = np.flatnonzero(assigned >= 0)
        return int(rows.size), float(score[rows, assigned[rows]].sum())

    count, total = served(EncoderSettings(candidates_per_order=3), widen=True)
    assert count == optimum[0]
    # float32 objectives, float64 scores: the sums agree to rounding
    assert total == pytest.approx(optimum[1], abs=1e-5)


def test_three_candidates_alone_fall_short_of_the_optimum_somewhere() -> None:
    # The gap the wider lists close: the same windows with three candidates per order and
    # no widening score less than the optimum in some of them.
    short = 0
    for seed in range(30):
        rng = np.random.default_rng(seed)
        window = scarce_window(seed, int(rng.integers(6, 14)), 60)
        narrow = features.window_candidates(window, EncoderSettings(candidates_per_order=3))
        listed = np.zeros((window.num_orders, window.num_riders), dtype=np.bool_)
        for b, row in enumerate(narrow):
            listed[b, row[row >= 0]] = True
        score = np.where(feasible_mask(window), rng.uniform(0.2, 1.0, listed.shape), -np.inf)
        spare = spare_slots(window.rider_load, window.rider_capacity)
        over_lists = best_assignment(np.where(listed, score, -np.inf), spare)
        short += over_lists < best_assignment(score, spare)
    assert short > 0


def test_batched_windows_list_as_each_alone() -> None:
    # dispatch_fused and feature_encoder select an execute's windows together: scarce and
    # not, ranked with the batch (few riders, one kind of order) or alone.
    rng = np.random.default_rng(8)
    windows = [scarce_window(seed, orders, riders) for seed, orders, riders in
               ((1, 20, 60), (2, 12, 60), (3, 64, 400), (4, 1, 20), (5, 3, 40))]  # fmt: skip
    small = dataclasses.replace(REGIMES["default"], num_orders=4, num_riders=24)
    windows += [generate_regime_window(rng, small), generate_regime_window(rng, REGIMES["peak"])]
    windows = [
        dataclasses.replace(w, constraints=np.zeros_like(w.constraints)) if i != 2 else w
        for i, w in enumerate(windows)
    ]
    settings = EncoderSettings()
    alone = [features.window_candidates(w, settings, widen_scarce=True) for w in windows]
    # the first window's 17 or more riders all listed (the batch ranks them), the peak
    # window's 16 nearest
    assert alone[0].shape[1] == windows[0].num_riders > 16 and alone[-1].shape[1] == 16
    for order in (list(range(len(windows))), list(reversed(range(len(windows))))):
        together = features.windows_candidates(
            [windows[i] for i in order], settings, widen_scarce=True
        )
        for i, got in zip(order, together, strict=True):
            assert got.shape == alone[i].shape and got.tobytes() == alone[i].tobytes(), i


@pytest.mark.parametrize("seed", range(4))
def test_the_wider_lists_do_not_depend_on_how_the_window_is_listed(seed: int) -> None:
    window = scarce_window(seed, 64, 400)
    rng = np.random.default_rng(seed)
    orders, riders = rng.permutation(window.num_orders), rng.permutation(window.num_riders)
    fields = {
        name: getattr(window, name)[orders]
        for name in ("order_ids", "order_user_ids", "pickup", "dropoff", "created_at",
                     "promised_minutes", "constraints")
    } | {
        name: getattr(window, name)[riders]
        for name in ("rider_ids", "rider_position", "rider_load", "rider_capacity",
                     "rider_vehicle", "rider_equipment")
    }  # fmt: skip
    relisted = dataclasses.replace(window, **fields)

    def by_ids(w: DispatchWindow) -> dict[bytes, list[bytes | None]]:
        got = features.window_candidates(w, EncoderSettings(), widen_scarce=True)
        names = np.append(w.rider_ids, np.array([None], dtype=object))  # -1 pads: None
        return dict(zip(w.order_ids.tolist(), (names[row].tolist() for row in got), strict=True))

    assert by_ids(relisted) == by_ids(window)
