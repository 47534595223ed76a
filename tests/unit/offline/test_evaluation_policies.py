"""The evaluation's policies decide as the served library does."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.offline import evaluation_policies, simulator

V1 = model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(1)


@pytest.mark.parametrize(
    ("seed", "weights"),
    [
        (3, DEFAULT_OBJECTIVE_WEIGHTS),
        (4, DEFAULT_OBJECTIVE_WEIGHTS),
        (5, DEFAULT_OBJECTIVE_WEIGHTS),
        (3, (1.0, 0.0, 0.0)),
    ],
)
def test_model_policy_wiring_is_the_served_decision(
    seed: int, weights: evaluation_policies.Weights
) -> None:
    """Wiring, not correctness: the evaluation's model policy assigns as the served library
    does (DispatchPipeline with the repository's configs, stack-aware by default), on
    windows scarce enough to stack, and reports the served figures of each assigned pair;
    with other weights, as a request that sends them as OBJECTIVE_WEIGHTS."""
    from dispatch_service.domain.window_wire import window_to_wire
    from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline

    window = simulator.generate_window(np.random.default_rng(seed), 48, 14)
    decision = evaluation_policies.model_policy(
        model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(1), weights=weights
    )(window, simulator.DEFAULT_CITY)
    wire = window_to_wire(window)
    if weights != DEFAULT_OBJECTIVE_WEIGHTS:  # the default: a request that sends none
        wire["OBJECTIVE_WEIGHTS"] = np.asarray(weights, dtype=np.float32)
    served = DispatchPipeline.from_repository().run(wire)
    np.testing.assert_array_equal(decision.assigned, served["ASSIGNED_RIDER_INDEX"])
    assert decision.predicted is not None
    # Every assigned order's figures, its rider on the Top-K list or not (0 = unassigned).
    np.testing.assert_allclose(decision.predicted, served["ASSIGNED_OBJECTIVES"], rtol=1e-6)
