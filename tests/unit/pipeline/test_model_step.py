"""Behaviour of dispatch_service.pipeline.model_step: the dispatch_model step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dispatch_contract import (
    OBJECTIVES,
)
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.settings import SettingsError
from dispatch_service.pipeline.onnx_runner import OrtSettings
from dispatch_service.pipeline.steps import (
    DispatchModelStep,
    FeatureEncoderStep,
)
from step_inputs import COMMITTED_MODEL, features, window_tensors

# ---- DispatchModelStep ---------------------------------------------------------------


def test_model_step_reads_pair_features() -> None:
    assert DispatchModelStep.input_names == ("PAIR_FEATURES",)


def test_model_step_rejects_unknown_parameters(contract_model: Path) -> None:
    with pytest.raises(SettingsError, match="threads"):
        DispatchModelStep.from_parameters(contract_model, {"threads": "2"})


def test_model_step_applies_ort_settings(contract_model: Path) -> None:
    step = DispatchModelStep.from_parameters(
        contract_model, {"intra_op_num_threads": "3", "graph_optimization_level": "basic"}
    )
    assert step.scorer.session.get_session_options().intra_op_num_threads == 3
    with pytest.raises(SettingsError, match="graph_optimization_level"):
        DispatchModelStep.from_parameters(contract_model, {"graph_optimization_level": "x"})


def test_model_step_scores_pairs(contract_model: Path) -> None:
    step = DispatchModelStep(contract_model, OrtSettings())
    outputs = step.run({"PAIR_FEATURES": features(7)})
    assert set(outputs) == {"PAIR_OBJECTIVES"}
    assert outputs["PAIR_OBJECTIVES"].shape == (7, len(OBJECTIVES))
    assert outputs["PAIR_OBJECTIVES"].dtype == np.float32


def test_model_step_reports_missing_features(contract_model: Path) -> None:
    with pytest.raises(DispatchInputError) as info:
        DispatchModelStep(contract_model).run({})
    assert info.value.tensor == "PAIR_FEATURES"
    assert info.value.rule == "is required but missing"


def test_model_step_checks_features(contract_model: Path) -> None:
    with pytest.raises(DispatchInputError, match="PAIR_FEATURES: must have shape"):
        DispatchModelStep(contract_model).run({"PAIR_FEATURES": features(2)[:, :5]})


@pytest.mark.parametrize("sizes", [(4,), (3, 1, 9), (0, 5, 0, 2)], ids=["one", "three", "empty"])
def test_run_batch_gives_each_request_its_own_rows(
    contract_model: Path, sizes: tuple[int, ...]
) -> None:
    step = DispatchModelStep(contract_model)
    batch = [features(n, seed=i) for i, n in enumerate(sizes)]
    scored = step.run_batch(batch)
    assert len(scored) == len(batch)
    for part, scores in zip(batch, scored, strict=True):
        assert scores.shape == (len(part), len(OBJECTIVES))
        np.testing.assert_array_equal(scores, step.run({"PAIR_FEATURES": part})["PAIR_OBJECTIVES"])


def test_committed_model_scores_encoder_output() -> None:
    encoded = FeatureEncoderStep().run(window_tensors())
    scored = DispatchModelStep(COMMITTED_MODEL).run(encoded)
    objectives = scored["PAIR_OBJECTIVES"]
    assert objectives.shape == (encoded["PAIR_FEATURES"].shape[0], len(OBJECTIVES))
    assert np.isfinite(objectives).all()
    assert (objectives[:, 0] > 0).all() and (objectives[:, 2] > 0).all()
    assert ((objectives[:, 1] >= 0) & (objectives[:, 1] <= 1)).all()
