"""Stacked orders: the extra-load rule and the re-loaded features, against hand-made cases
and against the encoder run on a window whose riders really carry that load."""

from __future__ import annotations

import dataclasses

import numpy as np

from dispatch_service.domain.cities import default_registry
from dispatch_service.domain.features import EncoderSettings, encode_pairs, select_candidates
from dispatch_service.domain.stacking import (
    joining_extra_load,
    stacked_extra_load,
    with_extra_load,
)
from dispatch_service.offline import simulator

SHANGHAI = default_registry().get("shanghai")


def test_extra_load_counts_earlier_orders_of_the_same_rider() -> None:
    created = np.array([30, 10, 20, 10, 5])
    assigned = np.array([2, 2, -1, 2, 7])
    # Rider 2 gets rows 1 and 3 (both at 10: row order) then row 0 (at 30).
    assert stacked_extra_load(created, assigned).tolist() == [2, 0, 0, 1, 0]


def test_reloaded_features_equal_the_encoder_on_a_loaded_window() -> None:
    window = simulator.generate_window(np.random.default_rng(4), 12, 40)
    candidates = select_candidates(window, 6)
    settings = EncoderSettings(candidates_per_order=6)
    features = encode_pairs(window, candidates, settings, SHANGHAI)
    extra_per_rider = np.random.default_rng(5).integers(0, 3, window.num_riders)
    loaded = dataclasses.replace(
        window, rider_load=(window.rider_load + extra_per_rider).astype(np.int32)
    )
    expected = encode_pairs(loaded, candidates, settings, SHANGHAI)
    flat = candidates.reshape(-1)
    rows = np.flatnonzero(flat >= 0)
    got = with_extra_load(features[rows], extra_per_rider[flat[rows]])
    np.testing.assert_array_equal(got, expected[rows])
    # the rows gathered by the call itself; the features handed in stay as they were
    before = features.copy()
    np.testing.assert_array_equal(
        with_extra_load(features, extra_per_rider[flat[rows]], rows), expected[rows]
    )
    np.testing.assert_array_equal(features, before)


def test_joining_extra_load_by_brute_force() -> None:
    rng = np.random.default_rng(7)
    created = rng.integers(0, 5, 30)
    assigned = rng.integers(-1, 6, 30)
    orders = rng.integers(0, 30, 200)
    riders = rng.integers(0, 6, 200)
    got = joining_extra_load(created, assigned, orders, riders)
    for b, r, extra in zip(orders.tolist(), riders.tolist(), got.tolist(), strict=True):
        # Move b to r, everything else stays: the rule for an assigned order then applies.
        moved = assigned.copy()
        moved[b] = r
        assert extra == stacked_extra_load(created, moved)[b]


def test_orders_created_together_stack_in_the_order_of_their_ids() -> None:
    """Equal creation times: ``tie`` (the orders' id ranks) decides who rides first, so the
    loads follow the orders, not their rows; without it, the row."""
    created = [100, 100, 100, 50]
    assigned = [7, 7, 7, 7]
    assert stacked_extra_load(created, assigned).tolist() == [1, 2, 3, 0]
    tie = [2, 0, 1, 3]  # row 1 has the smallest id among the three created at 100
    assert stacked_extra_load(created, assigned, tie).tolist() == [3, 1, 2, 0]
    pairs_orders = np.array([0, 1, 2], dtype=np.int64)
    pairs_riders = np.array([7, 7, 7], dtype=np.int64)
    joining = joining_extra_load(created, assigned, pairs_orders, pairs_riders, tie)
    assert joining.tolist() == [3, 1, 2]
