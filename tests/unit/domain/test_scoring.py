"""A pair's score: a weighted utility in [0, 1], monotone in each objective."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.scoring import ResolverSettings, score_pairs


def test_scores_are_strictly_monotone_in_each_objective() -> None:
    rng = np.random.default_rng(1)
    base = np.column_stack(
        [rng.uniform(0, 120, 300), rng.uniform(0, 1, 300), rng.uniform(0, 60, 300)]
    )
    weights = np.asarray([0.45, 0.35, 0.20])  # every term weighted (the default has no on-time)
    score = score_pairs(base, weights)
    assert ((score >= 0) & (score <= 1)).all()
    for column, sign in ((0, -1.0), (1, +1.0), (2, -1.0)):
        better = base.copy()
        step = rng.uniform(0.01, 5, 300) if column != 1 else rng.uniform(0.001, 0.05, 300)
        better[:, column] += sign * step
        # Beyond 1 the on-time utility saturates; below 0 ETA and cost are invalid.
        keep = better[:, 1] <= 1.0 if column == 1 else better[:, column] >= 0.0
        assert (score_pairs(better, weights)[keep] > score[keep]).all()


def test_a_utility_is_one_half_at_its_scale() -> None:
    settings = ResolverSettings(eta_scale_minutes=30.0, cost_scale_cny=10.0)
    latency_only = score_pairs(np.array([[30.0, 0.0, 0.0]]), [1.0, 0.0, 0.0], settings)
    cost_only = score_pairs(np.array([[0.0, 0.0, 10.0]]), [0.0, 0.0, 1.0], settings)
    assert latency_only.tolist() == [0.5] and cost_only.tolist() == [0.5]


def test_objectives_without_three_columns_name_the_tensor() -> None:
    with pytest.raises(DispatchInputError) as caught:
        score_pairs(np.ones((2, 2)), [1.0, 0.0, 0.0])
    assert caught.value.tensor == "PAIR_OBJECTIVES" and caught.value.code == "shape"
