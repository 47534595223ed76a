"""The experiment analysis on the simulator's outcome streams, read after every batch: A/A
runs rarely declare a difference; a worse version is declared worse (the simulator's truth
realises every order; `experiment_study`)."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.experiments.analysis import DEFAULT_ALPHA
from dispatch_service.offline.evaluation_policies import model_policy
from dispatch_service.offline.experiment_study import (
    OutcomePool,
    aa_study,
    biased_eta,
    more_late,
    outcome_pool,
    power_study,
)


@pytest.fixture(scope="module")
def pool() -> OutcomePool:
    policy = model_policy(model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(1), MODEL_REPOSITORY)
    return outcome_pool(policy, windows=40, seed=1)


def test_the_pool_is_the_simulators_truth_per_order(pool: OutcomePool) -> None:
    assert pool.size == 40 * 64
    delivered = ~np.isnan(pool.delivery_minutes)
    assert np.array_equal(delivered, pool.unassigned == 0)
    assert set(np.unique(pool.late[delivered])) <= {0.0, 1.0}
    assert np.all(pool.realised_minutes[delivered] > 0)


def test_aa_experiments_read_after_every_batch_stay_within_alpha(pool: OutcomePool) -> None:
    result = aa_study(pool, experiments=200, batch=100, batches=40, seed=2)
    assert result.experiments == 200
    assert result.share <= DEFAULT_ALPHA


def test_eta_biased_by_30_percent_is_declared_worse_within_1000_outcomes(
    pool: OutcomePool,
) -> None:
    bias = biased_eta(1.3)
    result = power_study(pool, bias, "eta_abs_error", experiments=200, batches=10, seed=3)
    assert result.share >= 0.9


def test_five_more_points_late_is_declared_worse_within_6000_outcomes(pool: OutcomePool) -> None:
    result = power_study(pool, more_late(0.05), "late", experiments=100, batches=60, seed=4)
    assert result.share >= 0.9
