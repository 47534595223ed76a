"""Behaviour of dispatch_service.pipeline.dispatch_pipeline: the ensemble in one process."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import RESOLVER_OUTPUTS
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.metrics import (
    CANDIDATES_PER_ORDER,
    CAPACITY_CONFLICTS,
    ENCODER_LATENCY,
    RESOLVER_LATENCY,
    VALIDATION_REJECTIONS,
    InMemoryMetrics,
)
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import (
    ENCODER_MODEL,
    RESOLVER_MODEL,
    SCORING_MODEL,
    model_layout,
)
from dispatch_service.core.settings import SettingsError
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from dispatch_service.pipeline.step_metrics import candidates_per_order, capacity_conflicts

Tensors = dict[str, NDArray[Any] | None]
STEP_MODELS = ("feature_encoder", "dispatch_model", "topk_resolver")
COMMITTED_MODEL = model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(1)


def window_tensors(orders: int, riders: int, seed: int = 0) -> Tensors:
    window = generate_window(np.random.default_rng(seed), orders, riders)
    return dict(window_to_wire(window))


def make_repository(root: Path, model: Path) -> Path:
    """The shipped step configs with ``model`` as dispatch_model version 1."""
    for name in STEP_MODELS:
        (root / name).mkdir(parents=True)
        shutil.copy(model_layout(MODEL_REPOSITORY, name).config, model_layout(root, name).config)
    model_layout(root, SCORING_MODEL).version(1).mkdir()
    shutil.copy(model, model_layout(root, SCORING_MODEL).onnx(1))
    return root


def set_parameter(config: Path, key: str, value: str) -> None:
    text = config.read_text()
    old = f'key: "{key}", value: {{ string_value: "'
    start = text.index(old) + len(old)
    end = text.index('"', start)
    config.write_text(text[:start] + value + text[end:])


def assert_contract_outputs(outputs: dict[str, NDArray[Any]], orders: int, k: int) -> None:
    assert set(outputs) == {spec.name for spec in RESOLVER_OUTPUTS}
    shapes = {
        "TOPK_RIDER_INDEX": (orders, k),
        "TOPK_OBJECTIVES": (orders, k, 4),
        "ASSIGNED_OBJECTIVES": (orders, 3),
    }
    for spec in RESOLVER_OUTPUTS:
        value = outputs[spec.name]
        assert value.dtype == spec.numpy_dtype, spec.name
        assert value.shape == shapes.get(spec.name, (orders,)), spec.name


# ---- from_repository and run ---------------------------------------------------------


def test_pipeline_over_a_repository_follows_the_contract(
    tmp_path: Path, contract_model: Path
) -> None:
    pipeline = DispatchPipeline.from_repository(make_repository(tmp_path, contract_model))
    outputs = pipeline.run(window_tensors(orders=6, riders=20))
    assert_contract_outputs(outputs, orders=6, k=5)
    index = outputs["ASSIGNED_RIDER_INDEX"]
    assert ((index >= -1) & (index < 20)).all()


def test_pipeline_settings_come_from_the_configs(tmp_path: Path, contract_model: Path) -> None:
    repository = make_repository(tmp_path, contract_model)
    set_parameter(model_layout(repository, RESOLVER_MODEL).config, "top_k", "3")
    set_parameter(model_layout(repository, ENCODER_MODEL).config, "candidates_per_order", "4")
    pipeline = DispatchPipeline.from_repository(repository)
    assert pipeline.resolver.settings.top_k == 3
    assert pipeline.encoder.encoder.candidates_per_order == 4
    assert_contract_outputs(pipeline.run(window_tensors(orders=4, riders=20)), orders=4, k=3)


def test_pipeline_rejects_an_unknown_config_parameter(tmp_path: Path, contract_model: Path) -> None:
    repository = make_repository(tmp_path, contract_model)
    config = model_layout(repository, RESOLVER_MODEL).config
    config.write_text(config.read_text().replace('key: "top_k"', 'key: "topk"'))
    with pytest.raises(SettingsError, match="topk"):
        DispatchPipeline.from_repository(repository)


def test_pipeline_loads_the_requested_version(tmp_path: Path, contract_model: Path) -> None:
    repository = make_repository(tmp_path, contract_model)
    with pytest.raises(Exception, match=r"dispatch_model[/\\]2[/\\]model\.onnx"):
        DispatchPipeline.from_repository(repository, model_version=2)
    model_layout(repository, SCORING_MODEL).version(2).mkdir()
    shutil.copy(contract_model, model_layout(repository, SCORING_MODEL).onnx(2))
    assert DispatchPipeline.from_repository(repository, model_version=2).model is not None


def test_pipeline_rejects_a_bad_window(tmp_path: Path, contract_model: Path) -> None:
    pipeline = DispatchPipeline.from_repository(make_repository(tmp_path, contract_model))
    tensors = window_tensors(orders=3, riders=5)
    fields = np.array(tensors["RIDER_FIELDS"], copy=True)
    fields[:, 4] = [0, 1, 2, 3, 0]  # vehicle 3 does not exist
    tensors["RIDER_FIELDS"] = fields
    with pytest.raises(DispatchInputError) as info:
        pipeline.run(tensors)
    assert info.value.tensor == "RIDER_FIELDS[vehicle]"


def test_pipeline_passes_objective_weights_to_the_resolver(
    tmp_path: Path, contract_model: Path
) -> None:
    pipeline = DispatchPipeline.from_repository(make_repository(tmp_path, contract_model))
    tensors = window_tensors(orders=5, riders=20)
    tensors["OBJECTIVE_WEIGHTS"] = np.array([0.0, 0.0, 1.0], dtype=np.float32)
    cost_only = pipeline.run(tensors)
    costs = cost_only["TOPK_OBJECTIVES"][..., 3]
    valid = cost_only["TOPK_RIDER_INDEX"] >= 0
    for row, mask in zip(costs, valid, strict=True):
        assert list(row[mask]) == sorted(row[mask])
    tensors["OBJECTIVE_WEIGHTS"] = np.array([0.0, 0.0], dtype=np.float32)
    with pytest.raises(DispatchInputError, match="OBJECTIVE_WEIGHTS"):
        pipeline.run(tensors)


def test_committed_pipeline_answers_a_window_with_the_contract() -> None:
    outputs = DispatchPipeline.from_repository().run(window_tensors(orders=8, riders=40, seed=4))
    assert_contract_outputs(outputs, orders=8, k=5)
    valid = outputs["TOPK_RIDER_INDEX"] >= 0
    score = outputs["TOPK_OBJECTIVES"][..., 0]
    assert ((score[valid] > 0) & (score[valid] <= 1)).all()
    assert (score[~valid] == 0).all()
    assigned = outputs["ASSIGNED_RIDER_INDEX"]
    assert ((assigned >= -1) & (assigned < 40)).all()
    got = outputs["ASSIGNED_SCORE"]
    assert (got[assigned < 0] == 0).all() and (got[assigned >= 0] > 0).all()


def test_the_pipeline_records_the_same_custom_metrics_as_the_models() -> None:
    sink = InMemoryMetrics()
    pipeline = DispatchPipeline.from_repository(metrics=sink)
    window = window_tensors(30, 6, seed=2)
    out = pipeline.run(window)
    assert len(sink.observed(ENCODER_LATENCY)) == len(sink.observed(RESOLVER_LATENCY)) == 1
    candidates = pipeline.encoder.run(window)["CANDIDATE_RIDER_INDEX"]
    assert sink.observed(CANDIDATES_PER_ORDER) == [candidates_per_order(candidates)]
    conflicts = capacity_conflicts(
        out["TOPK_RIDER_INDEX"],
        out["TOPK_OBJECTIVES"][..., 0],
        out["ASSIGNED_RIDER_INDEX"],
        out["ASSIGNED_SCORE"],
    )
    assert sink.counter(CAPACITY_CONFLICTS) == conflicts > 0

    bad = dict(window)
    bad["RIDER_IDS"] = np.array([b"r"] * 6, dtype=object)
    with pytest.raises(DispatchInputError, match="RIDER_IDS: ids must be unique"):
        pipeline.run(bad)
    assert sink.counter(VALIDATION_REJECTIONS, tensor="RIDER_IDS", rule="unique") == 1
    assert len(sink.observed(ENCODER_LATENCY)) == 1  # a rejected window is no latency sample
    assert DispatchPipeline.from_repository().metrics.record([]) is None  # none by default


# ---- the answer does not depend on how the window is listed ----------------


def test_permuting_orders_and_riders_changes_no_answer(
    tmp_path: Path, contract_model: Path
) -> None:
    """Every regime, scarce ones included, several listings of each window: the same riders
    for the same orders (assignment and Top-K) and the same figures, byte for byte. The
    contract model's clamped outputs tie many pairs exactly, so the tie-breaks are in play."""
    from permutation_helpers import assert_same_answer, by_ids, permuted, regime_windows

    pipeline = DispatchPipeline.from_repository(make_repository(tmp_path, contract_model))
    rng = np.random.default_rng(31)
    for _, _, tensors in regime_windows(seeds=3):
        expected = by_ids(pipeline.run(tensors), tensors)
        for _ in range(2):
            listed, orders = permuted(tensors, rng)
            assert_same_answer(by_ids(pipeline.run(listed), listed, orders), expected)
