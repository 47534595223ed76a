"""Behaviour of dispatch_service.pipeline.resolver_step: the topk_resolver step."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import (
    OBJECTIVES,
    RESOLVER_INPUTS,
    RESOLVER_OUTPUTS,
)
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.settings import SettingsError
from dispatch_service.domain.window import parse_objective_weights
from dispatch_service.pipeline import resolver_step
from dispatch_service.pipeline.stacking import StackingSettings, Unstacked, resolve_stack_aware
from dispatch_service.pipeline.steps import (
    DispatchModelStep,
    FeatureEncoderStep,
    TopKResolverStep,
)
from step_inputs import COMMITTED_MODEL, Tensors, resolver_inputs, window_tensors

# ---- TopKResolverStep ----------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_encode_gives_run_outputs_and_the_window_the_resolver_may_reuse(seed: int) -> None:
    tensors = window_tensors(orders=6, riders=14, seed=seed)
    tensors["RIDER_FIELDS"][:, 2] = np.arange(14) % 3  # some riders loaded
    step = FeatureEncoderStep()
    window, city, encoded = step.encode(tensors)
    assert city is step.cities.get("shanghai")
    expected = step.run(tensors)
    assert encoded.keys() == expected.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(encoded[name], value, err_msg=name)
    rng = np.random.default_rng(seed)
    objectives = rng.random((encoded["PAIR_FEATURES"].shape[0], len(OBJECTIVES)))
    inputs = {**tensors, **encoded, "PAIR_OBJECTIVES": objectives.astype(np.float32)}
    resolver = TopKResolverStep()
    alone = resolver.run(inputs)
    reused = resolver.run(inputs, window)
    for name, value in alone.items():
        assert reused[name].dtype == value.dtype
        np.testing.assert_array_equal(reused[name], value, err_msg=name)


def test_resolver_input_names_end_with_the_optional_ones() -> None:
    names = TopKResolverStep.input_names
    assert names[:2] == ("PAIR_OBJECTIVES", "CANDIDATE_RIDER_INDEX")
    stacking = ("PAIR_FEATURES", "ORDER_MODEL_VERSION", "ORDER_FIELDS")
    records = ("ORDER_TEXT", "WINDOW_CITY", "WINDOW_FIELDS", "ORDER_FALLBACK_LEVEL")
    assert names[-9:] == ("OBJECTIVE_WEIGHTS", *stacking, "ORDER_IDS", *records)
    assert set(names) >= {"RIDER_IDS", "RIDER_FIELDS"}


def test_resolver_rejects_unknown_parameters() -> None:
    with pytest.raises(SettingsError, match="unknown config parameter\\(s\\) topk;"):
        TopKResolverStep.from_parameters({"topk": "3"})


def test_resolver_rejects_a_bad_top_k() -> None:
    with pytest.raises(SettingsError, match="top_k"):
        TopKResolverStep.from_parameters({"top_k": "0"})


def test_resolver_applies_top_k() -> None:
    step = TopKResolverStep.from_parameters({"top_k": "3", "eta_scale_minutes": "20"})
    settings = step.settings
    assert (settings.top_k, settings.eta_scale_minutes, settings.cost_scale_cny) == (3, 20.0, 10.0)
    outputs = step.run(resolver_inputs())
    for spec in RESOLVER_OUTPUTS:
        expected = {
            "TOPK_RIDER_INDEX": (3, 3),
            "TOPK_OBJECTIVES": (3, 3, 4),
            "ASSIGNED_OBJECTIVES": (3, 3),
        }.get(spec.name, (3,))
        assert outputs[spec.name].shape == expected, spec.name
        assert outputs[spec.name].dtype == spec.numpy_dtype, spec.name


def test_resolver_k_is_at_most_the_candidate_count() -> None:
    outputs = TopKResolverStep.from_parameters({"top_k": "10"}).run(resolver_inputs())
    assert outputs["TOPK_RIDER_INDEX"].shape == (3, 4)
    assert outputs["TOPK_RIDER_INDEX"][2].tolist() == [5, -1, -1, -1]


def test_resolver_default_top_k_is_five() -> None:
    assert TopKResolverStep.from_parameters({}).settings.top_k == 5


@pytest.mark.parametrize("name", [spec.name for spec in RESOLVER_INPUTS if not spec.optional])
def test_resolver_reports_a_missing_input_by_name(name: str) -> None:
    inputs = resolver_inputs()
    inputs[name] = None
    with pytest.raises(DispatchInputError) as info:
        TopKResolverStep().run(inputs)
    assert info.value.tensor == name
    assert info.value.rule == "is required but missing"


def test_resolver_objective_weights_are_optional_and_steer_the_ranking() -> None:
    inputs = resolver_inputs()
    default = TopKResolverStep().run(inputs)
    assert set(default) == {spec.name for spec in RESOLVER_OUTPUTS}

    objectives = inputs["PAIR_OBJECTIVES"]
    assert objectives is not None
    cost = objectives[:, 2].reshape(3, 4)
    inputs["OBJECTIVE_WEIGHTS"] = np.array([0.0, 0.0, 1.0], dtype=np.float32)
    cost_only = TopKResolverStep().run(inputs)
    # Order 0 lists riders 0..3: with cost alone the cheapest rider ranks first.
    assert cost_only["TOPK_RIDER_INDEX"][0, 0] == int(np.argmin(cost[0]))
    top_cost = cost_only["TOPK_OBJECTIVES"][0, :, 3]  # TOPK_OBJECTIVE_COLUMNS: cost last
    np.testing.assert_array_equal(np.sort(top_cost), np.sort(cost[0]).astype(np.float32))
    assert list(top_cost) == sorted(top_cost)


def test_resolver_rejects_bad_weights_by_name() -> None:
    inputs = resolver_inputs()
    inputs["OBJECTIVE_WEIGHTS"] = np.array([0.5, 0.5], dtype=np.float32)
    with pytest.raises(DispatchInputError) as info:
        TopKResolverStep().run(inputs)
    assert info.value.tensor == "OBJECTIVE_WEIGHTS"


# ---- TopKResolverStep: the stack-aware resolution ----------------------------------------


def stacking_inputs(orders: int = 24, riders: int = 10, seed: int = 3) -> Tensors:
    """A scarce window (riders with room for several new orders) as the ensemble's resolver
    step receives it: window, encoder's pairs, model objectives, router's versions."""
    window = window_tensors(orders, riders, seed)
    encoded = FeatureEncoderStep().run(window)
    scored = DispatchModelStep(COMMITTED_MODEL).run(encoded)
    versions = np.ones(orders, dtype=np.int32)
    return {**window, **encoded, **scored, "ORDER_MODEL_VERSION": versions}


def model_score(version: int, pair_features: NDArray[np.float32]) -> NDArray[np.float32]:
    return DispatchModelStep(COMMITTED_MODEL).scorer.infer(pair_features)


def test_stack_aware_resolver_wiring_matches_resolve_stack_aware() -> None:
    """Wiring only (the resolution itself is tested against a MILP in test_stacking): with
    a scorer the step answers what `resolve_stack_aware` answers on the same tensors."""
    inputs = stacking_inputs()
    served = TopKResolverStep().run(inputs, score=model_score)
    fields = np.asarray(inputs["RIDER_FIELDS"])
    direct = resolve_stack_aware(
        objectives=np.asarray(inputs["PAIR_OBJECTIVES"]),
        features=np.asarray(inputs["PAIR_FEATURES"]),
        candidate_rider_index=np.asarray(inputs["CANDIDATE_RIDER_INDEX"]),
        created_at=np.asarray(inputs["ORDER_FIELDS"])[:, 4].astype(np.int64),
        rider_ids=np.asarray(inputs["RIDER_IDS"]),
        rider_load=fields[:, 2].astype(np.int32),
        rider_capacity=fields[:, 3].astype(np.int32),
        weights=parse_objective_weights(None),
        rescore=lambda rows, f: model_score(1, f),
    )
    assert direct.rescored > 0  # the window does stack
    for name, value in direct.resolution.as_wire_tensors().items():
        np.testing.assert_array_equal(served[name], value, err_msg=name)
    plain = TopKResolverStep().run(inputs)
    assert not all(np.array_equal(plain[n], served[n]) for n in served)


def test_stack_aware_needs_a_scorer_the_features_and_the_setting() -> None:
    inputs = stacking_inputs()
    plain = TopKResolverStep().run(inputs)
    off = TopKResolverStep(stacking=StackingSettings(stack_aware=False))
    assert TopKResolverStep.from_parameters({"stack_aware": "false"}) == off
    without_features = {**inputs, "PAIR_FEATURES": None}
    without_creation_times = {**inputs, "ORDER_FIELDS": None}  # dispatch_features may
    for answer in (
        off.run(inputs, score=model_score),
        TopKResolverStep().run(without_features, score=model_score),
        TopKResolverStep().run(without_creation_times, score=model_score),
    ):
        for name, value in plain.items():
            np.testing.assert_array_equal(answer[name], value, err_msg=name)


@pytest.mark.parametrize("timeout", ["0", "60001", "soon"])
def test_a_bad_rescore_timeout_fails_the_load(timeout: str) -> None:
    with pytest.raises(ValueError, match="rescore_timeout_ms"):
        TopKResolverStep.from_parameters({"rescore_timeout_ms": timeout})


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("ORDER_MODEL_VERSION", None, "is required but missing"),
        ("ORDER_MODEL_VERSION", np.ones(3, dtype=np.int32), "must have one row per order"),
        ("ORDER_MODEL_VERSION", np.ones(24, dtype=np.float32), "must be INT32"),
        ("ORDER_FIELDS", np.zeros((3, 7)), "must have one row per order"),
        ("PAIR_FEATURES", np.zeros((5, 34), dtype=np.float32), "must have B*N"),
        ("PAIR_FEATURES", np.zeros((384, 27), dtype=np.float32), "must be an FP32 [P, 34]"),
    ],
)
def test_stack_aware_inputs_are_checked_by_name(name: str, value: Any, rule: str) -> None:
    inputs = {**stacking_inputs(), name: value}
    with pytest.raises(DispatchInputError) as info:
        TopKResolverStep().run(inputs, score=model_score)
    assert info.value.tensor == name
    assert rule in str(info.value)


def resolver_batch(
    shapes: list[tuple[int, int]], fused: bool = True
) -> list[tuple[Tensors, Any, Any]]:
    """Resolver items as dispatch_fused hands them over (the window the encoder validated,
    its tensors with the encoder's pairs and the model's objectives, and the scorer), or
    as the ensemble's topk_resolver gets them (no window: the rider counts and creation
    times are read from RIDER_FIELDS and ORDER_FIELDS)."""
    items = []
    for seed, (orders, riders) in enumerate(shapes):
        tensors = window_tensors(orders, riders, seed)
        window, _, encoded = FeatureEncoderStep().encode(tensors)
        scored = DispatchModelStep(COMMITTED_MODEL).run(encoded)
        versions = np.ones(orders, dtype=np.int32)
        inputs = {**tensors, **encoded, **scored, "ORDER_MODEL_VERSION": versions}
        items.append((inputs, window if fused else None, model_score))
    return items


@pytest.mark.parametrize("fused", [True, False], ids=["dispatch_fused", "ensemble"])
def test_a_batch_is_checked_together_and_only_stacking_windows_are_staged_alone(
    monkeypatch: pytest.MonkeyPatch, fused: bool
) -> None:
    # One-order windows never stack; 24 orders over 10 riders do; 3 riders give a narrower
    # candidate list (another width).
    shapes = [(1, 20), (24, 10), (1, 20), (2, 3), (1, 15)]
    items = resolver_batch(shapes, fused)
    step = TopKResolverStep()
    alone = [step.run(*item) for item in items]
    stacking_alone = [
        orders
        for (orders, _), item in zip(shapes, items, strict=True)
        if not isinstance(step._stage(*item), Unstacked)
    ]
    staged_alone: list[int] = []
    real = TopKResolverStep._stage

    def counting(self: TopKResolverStep, inputs: Any, *rest: Any) -> Any:
        staged_alone.append(int(np.asarray(inputs["CANDIDATE_RIDER_INDEX"]).shape[0]))
        return real(self, inputs, *rest)

    stacked: list[int] = []
    real_checked = resolver_step.stage_checked

    def stacking(window: Any, *rest: Any, **named: Any) -> Any:
        stacked.append(int(window.candidates.shape[0]))
        return real_checked(window, *rest, **named)

    monkeypatch.setattr(TopKResolverStep, "_stage", counting)
    monkeypatch.setattr(resolver_step, "stage_checked", stacking)
    got = step.run_batch(items)
    assert staged_alone == []  # the stacking window reuses the batch's checks too
    # Only the windows that stack when staged alone are resolved stack-aware on their own.
    assert stacked == stacking_alone and 24 in stacked
    for outcome, expected in zip(got, alone, strict=True):
        assert not isinstance(outcome, Exception), outcome
        assert outcome.keys() == expected.keys()
        for name, value in expected.items():
            assert outcome[name].dtype == value.dtype and outcome[name].shape == value.shape
            assert outcome[name].tobytes() == value.tobytes(), name


@pytest.mark.parametrize("fused", [True, False], ids=["dispatch_fused", "ensemble"])
def test_a_window_with_a_bad_objective_fails_alone_and_the_others_are_answered(
    fused: bool,
) -> None:
    items = resolver_batch([(1, 20), (2, 12), (1, 20)], fused)
    inputs, window, score = items[1]
    objectives = np.array(inputs["PAIR_OBJECTIVES"], copy=True)
    objectives[:, 0] = -1.0  # a model that answers a negative ETA
    items[1] = ({**inputs, "PAIR_OBJECTIVES": objectives}, window, score)
    step = TopKResolverStep()
    got = step.run_batch(items)
    assert isinstance(got[1], DispatchInputError)
    assert got[1].tensor == "PAIR_OBJECTIVES" and got[1].code == "range"
    for at in (0, 2):
        outcome, expected = got[at], step.run(*items[at])
        assert not isinstance(outcome, Exception), outcome
        for name, value in expected.items():
            assert outcome[name].tobytes() == value.tobytes(), name


def test_an_ensemble_window_with_bad_rider_fields_fails_alone_in_a_batch() -> None:
    items = resolver_batch([(1, 20), (2, 12), (1, 20)], fused=False)
    inputs, window, score = items[1]
    fields = np.array(inputs["RIDER_FIELDS"], copy=True)
    fields[0, 3] = 1.5  # capacity must be whole
    items[1] = ({**inputs, "RIDER_FIELDS": fields}, window, score)
    step = TopKResolverStep()
    got = step.run_batch(items)
    assert isinstance(got[1], DispatchInputError)
    assert got[1].tensor == "RIDER_FIELDS[capacity]"
    for at in (0, 2):
        outcome, expected = got[at], step.run(*items[at])
        assert not isinstance(outcome, Exception), outcome
        for name, value in expected.items():
            assert outcome[name].tobytes() == value.tobytes(), name


# ---- the answer does not depend on how the window is listed ----------------


@pytest.mark.parametrize("fused", [True, False], ids=["dispatch_fused", "ensemble"])
def test_a_batch_answers_every_listing_of_a_window_alike(contract_model: Path, fused: bool) -> None:
    """The windows of one execute (checked together, staged alone where riders stack): a
    window and two relistings of it get the same answer read by ids, whether the resolver
    has the encoder's window (dispatch_fused) or only the wire tensors (the ensemble: its
    ORDER_IDS break the ties between orders)."""
    from permutation_helpers import assert_same_answer, by_ids, permuted, regime_windows

    encoder, resolver = FeatureEncoderStep(), TopKResolverStep()
    model = DispatchModelStep(contract_model)

    def score(version: int, pair_features: NDArray[np.float32]) -> NDArray[np.float32]:
        return model.scorer.infer(pair_features)

    def item(tensors: Mapping[str, NDArray[Any]]) -> tuple[Tensors, Any, Any]:
        done = encoder.encode(tensors)  # the validated window first, the tensors last
        window, encoded = done[0], done[-1]
        orders = encoded["CANDIDATE_RIDER_INDEX"].shape[0]
        versions = {"ORDER_MODEL_VERSION": np.ones(orders, dtype=np.int32)}
        inputs: Tensors = {**tensors, **encoded, **model.run(encoded), **versions}
        return inputs, window if fused else None, score

    rng = np.random.default_rng(7)
    for _, _, tensors in regime_windows(seeds=1):
        listings = [(tensors, None), *(permuted(tensors, rng) for _ in range(2))]
        answers = resolver.run_batch([item(listed) for listed, _ in listings])
        expected = by_ids(answers[0], tensors)  # type: ignore[arg-type]
        for (listed, orders), answer in zip(listings[1:], answers[1:], strict=True):
            assert_same_answer(by_ids(answer, listed, orders), expected)  # type: ignore[arg-type]


def test_order_ids_of_the_wrong_length_are_refused_by_name() -> None:
    inputs = resolver_inputs()
    inputs["ORDER_IDS"] = np.array([b"o1", b"o2"], dtype=object)  # 3 orders
    with pytest.raises(DispatchInputError) as caught:
        TopKResolverStep().run(inputs)
    assert caught.value.tensor == "ORDER_IDS"
    assert "one per order" in caught.value.rule
