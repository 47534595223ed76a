"""Behaviour of dispatch_service.pipeline.steps: the three pipeline steps as plain objects."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_client.keys import KeyFileError
from dispatch_contract import (
    ENCODER_INPUTS,
    NUM_PAIR_FEATURES,
    OBJECTIVES,
    RESOLVER_INPUTS,
    RESOLVER_OUTPUTS,
)
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.settings import SettingsError
from dispatch_service.domain import features as features_module
from dispatch_service.domain import geo
from dispatch_service.domain.cities import DEFAULT_REGISTRY, default_registry
from dispatch_service.domain.features import EncoderSettings
from dispatch_service.domain.window import (
    parse_objective_weights,
    window_from_wire,
    window_to_wire,
)
from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer
from dispatch_service.offline import gazetteer_build
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline import steps
from dispatch_service.pipeline.onnx_runner import OrtSettings
from dispatch_service.pipeline.stacking import StackingSettings, Unstacked, resolve_stack_aware
from dispatch_service.pipeline.steps import (
    DispatchModelStep,
    FeatureEncoderStep,
    TopKResolverStep,
    geocoder_settings,
)

Tensors = dict[str, NDArray[Any] | None]

COMMITTED_MODEL = MODEL_REPOSITORY / "dispatch_model" / "1" / "model.onnx"


def window_tensors(orders: int = 5, riders: int = 12, seed: int = 0) -> Tensors:
    window = generate_window(np.random.default_rng(seed), orders, riders)
    return dict(window_to_wire(window))


def features(rows: int, seed: int = 0) -> NDArray[np.float32]:
    return np.random.default_rng(seed).normal(size=(rows, NUM_PAIR_FEATURES)).astype(np.float32)


def resolver_inputs() -> Tensors:
    """3 orders x 4 candidates over 6 riders; order 2 has a single candidate."""
    candidates = np.array([[0, 1, 2, 3], [2, 3, 4, -1], [5, -1, -1, -1]], dtype=np.int32)
    rng = np.random.default_rng(1)
    pairs = candidates.size
    objectives = np.stack(
        [rng.uniform(10, 50, pairs), rng.uniform(0.2, 0.95, pairs), rng.uniform(3, 15, pairs)],
        axis=1,
    ).astype(np.float32)
    return {
        "PAIR_OBJECTIVES": objectives,
        "CANDIDATE_RIDER_INDEX": candidates,
        "RIDER_IDS": np.array([f"r{i}".encode() for i in range(6)], dtype=object),
        # RIDER_FIELD_COLUMNS: lat, lon, load 0, capacity 2, vehicle, equipment
        "RIDER_FIELDS": np.tile([31.2, 121.4, 0.0, 2.0, 0.0, 0.0], (6, 1)),
    }


# ---- FeatureEncoderStep --------------------------------------------------------------


def test_encoder_reads_every_window_input() -> None:
    assert FeatureEncoderStep.input_names == tuple(spec.name for spec in ENCODER_INPUTS)


def test_encoder_defaults_are_the_documented_values() -> None:
    """Without parameters: the contract's limits (1024 orders, 8192 riders, 64-byte ids),
    16 candidates per order, geohash-7 zones, the shipped city registry."""
    step = FeatureEncoderStep.from_parameters({})
    limits, encoder = step.limits, step.encoder
    assert (limits.max_orders, limits.max_riders, limits.max_id_bytes) == (1024, 8192, 64)
    assert encoder.candidates_per_order == 16
    assert encoder.zone_precision == 7
    assert step.cities is default_registry()
    outputs = step.run(window_tensors(orders=2, riders=40))
    assert outputs["CANDIDATE_RIDER_INDEX"].shape == (2, 16)


def test_encoder_refuses_a_window_no_registered_city_serves() -> None:
    """Never a model answer for a place the registry does not cover: the window is refused
    naming its first point outside every city, and one in two cities likewise."""
    step = FeatureEncoderStep()
    outside = window_tensors(orders=3, riders=12)
    fields = outside["ORDER_FIELDS"].copy()
    fields[1, 2:4] = (40.7128, -74.0060)  # order 1's drop-off in New York
    with pytest.raises(DispatchInputError) as caught:
        step.run({**outside, "ORDER_FIELDS": fields})
    assert caught.value.code == "city"
    assert str(caught.value) == (
        "ORDER_FIELDS[dropoff_lat, dropoff_lon] row 1: lies outside every city's service area"
    )
    riders = outside["RIDER_FIELDS"].copy()
    riders[4, :2] = (39.9042, 116.4074)  # rider 4 in Beijing
    with pytest.raises(
        DispatchInputError, match=r"RIDER_FIELDS\[lat, lon\] row 4: lies in beijing"
    ):
        step.run({**outside, "RIDER_FIELDS": riders})


def test_encoder_rejects_unknown_parameters() -> None:
    with pytest.raises(SettingsError, match="unknown config parameter\\(s\\) candidates;"):
        FeatureEncoderStep.from_parameters({"candidates": "4"})


def test_encoder_applies_known_parameters() -> None:
    step = FeatureEncoderStep.from_parameters(
        {"candidates_per_order": "4", "max_orders": "3", "city_registry": str(DEFAULT_REGISTRY)}
    )
    assert step.encoder.candidates_per_order == 4
    assert step.cities.ids == default_registry().ids and step.cities is not default_registry()
    assert step.encoder.zone_precision == 7  # not given: the default stays
    assert (step.limits.max_orders, step.limits.max_riders) == (3, 8192)

    outputs = step.run(window_tensors(orders=3, riders=12))
    assert outputs["CANDIDATE_RIDER_INDEX"].shape == (3, 4)
    assert outputs["PAIR_FEATURES"].shape == (3 * 4, NUM_PAIR_FEATURES)

    with pytest.raises(DispatchInputError) as info:
        step.run(window_tensors(orders=4))
    assert info.value.tensor == "ORDER_IDS"
    assert "between 1 and 3" in info.value.rule


@pytest.mark.parametrize(
    ("parameters", "key"),
    [({"candidates_per_order": "0"}, "candidates_per_order"), ({"max_orders": "x"}, "max_orders")],
)
def test_encoder_rejects_bad_parameter_values(parameters: dict[str, str], key: str) -> None:
    with pytest.raises(SettingsError, match=key):
        FeatureEncoderStep.from_parameters(parameters)


def test_encoder_accepts_its_shipped_config_parameters() -> None:
    parameters = config_parameters(MODEL_REPOSITORY / "feature_encoder" / "config.pbtxt")
    step = FeatureEncoderStep.from_parameters(parameters)
    assert step.encoder.candidates_per_order == int(parameters["candidates_per_order"])


def test_encoder_outputs_follow_the_contract() -> None:
    outputs = FeatureEncoderStep().run(window_tensors(orders=5, riders=12))
    assert set(outputs) == {
        "PAIR_FEATURES", "CANDIDATE_RIDER_INDEX", "ORDER_LOCATION_SOURCE", "WINDOW_CITY",
    }  # fmt: skip
    assert outputs["WINDOW_CITY"].tolist() == [b"shanghai"]  # the city serving the window
    # every point came as coordinates: 0 for both ends of each order
    np.testing.assert_array_equal(outputs["ORDER_LOCATION_SOURCE"], np.zeros((5, 2), np.int32))
    assert outputs["PAIR_FEATURES"].dtype == np.float32
    assert outputs["CANDIDATE_RIDER_INDEX"].dtype == np.int32
    n = min(EncoderSettings().candidates_per_order, 12)
    assert outputs["CANDIDATE_RIDER_INDEX"].shape == (5, n)
    assert outputs["PAIR_FEATURES"].shape == (5 * n, NUM_PAIR_FEATURES)


def test_encoder_caps_candidates_at_the_rider_count() -> None:
    outputs = FeatureEncoderStep().run(window_tensors(orders=2, riders=3))
    assert outputs["CANDIDATE_RIDER_INDEX"].shape == (2, 3)


def test_encoder_rejects_a_bad_window_by_tensor() -> None:
    tensors = window_tensors()
    fields = np.array(tensors["ORDER_FIELDS"], copy=True)
    fields[1, 0] = np.nan  # pickup_lat
    tensors["ORDER_FIELDS"] = fields
    with pytest.raises(DispatchInputError) as info:
        FeatureEncoderStep().run(tensors)
    assert info.value.tensor == "ORDER_FIELDS[pickup_lat, pickup_lon]"


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
    assert names[-5:] == ("OBJECTIVE_WEIGHTS", *stacking, "ORDER_IDS")
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


def test_an_address_window_is_geocoded_before_encoding() -> None:
    """Pickups sent as typed addresses (no providers: the shipped gazetteer) land near the
    simulator's true points, their source says so, and the window encodes like the one
    with coordinates."""
    window = generate_window(np.random.default_rng(4), 16, 40)
    book = gazetteer_build.AddressBook(Gazetteer.load(), AdminRecogniser())
    sent = gazetteer_build.window_with_addresses(window, book, share=0.5)
    step = FeatureEncoderStep()
    try:
        outputs = step.run(window_to_wire(sent))
        located, _ = step.geocoder.locate(window_from_wire(window_to_wire(sent)))
    finally:
        step.close()
    assert outputs["ORDER_LOCATION_SOURCE"].tolist() == [[3, 3]] * 8 + [[0, 0]] * 8
    errors_m = 1000.0 * geo.haversine_km(
        located.pickup[:8, 0], located.pickup[:8, 1], window.pickup[:8, 0], window.pickup[:8, 1]
    )
    assert float(np.median(errors_m)) < 300.0  # issue 13's target for road matches
    expected = FeatureEncoderStep().run(window_to_wire(located))
    np.testing.assert_array_equal(outputs["PAIR_FEATURES"], expected["PAIR_FEATURES"])


def test_an_unknown_address_is_refused_naming_its_column_and_row() -> None:
    window = generate_window(np.random.default_rng(4), 3, 5)
    pickup = window.pickup.copy()
    pickup[2] = np.nan
    addresses = np.array([b"", b"", "火星基地一号".encode()], dtype=object)
    sent = dataclasses.replace(window, pickup=pickup, pickup_address=addresses)
    step = FeatureEncoderStep()
    try:
        with pytest.raises(DispatchInputError) as caught:
            step.run(window_to_wire(sent))
    finally:
        step.close()
    assert caught.value.tensor == "ORDER_TEXT[pickup_address]"
    assert caught.value.rule.startswith("row 2: address")
    assert caught.value.code == "unknown_value"


def test_geocoder_settings_come_from_the_encoder_parameters() -> None:
    parameters = {"geocoder_deadline_ms": "120", "geocoder_cache_entries": "10"}
    step = FeatureEncoderStep.from_parameters(parameters)
    try:
        assert step.geocoder.settings.geocoder_deadline_ms == 120.0
        assert step.geocoder.settings.geocoder_cache_entries == 10
    finally:
        step.close()
    with pytest.raises(SettingsError, match="geocoder_deadline_ms"):
        FeatureEncoderStep.from_parameters({"geocoder_deadline_ms": "soon"})


def test_provider_keys_are_read_from_their_key_files(tmp_path: Path) -> None:
    key_file = tmp_path / "geocoder.key"
    key_file.write_text("s3cret\n")
    key_file.chmod(0o600)
    parameters = {
        "geocoder_primary_url": "http://127.0.0.1:9",
        "geocoder_primary_key_file": str(key_file),
        "geocoder_secondary_url": "http://127.0.0.1:9",
        "geocoder_secondary_key": "inline",
    }
    settings = geocoder_settings(parameters)
    assert (settings.geocoder_primary_key, settings.geocoder_primary_key_file) == ("s3cret", "")
    assert settings.geocoder_secondary_key == "inline"
    key_file.chmod(0o644)  # others may read it: it locks nothing
    with pytest.raises(KeyFileError, match="open to others"):
        geocoder_settings(parameters)
    with pytest.raises(SettingsError, match="give one, not both"):
        geocoder_settings({**parameters, "geocoder_primary_key": "also"})
    with pytest.raises(KeyFileError, match="cannot read"):
        FeatureEncoderStep.from_parameters({"geocoder_primary_key_file": str(tmp_path / "none")})


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


def test_a_window_whose_candidates_fail_fails_alone_in_a_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Candidates are selected for the whole batch at once; if that raises, each window is
    selected alone, so only the window that fails gets the error."""
    batch = [
        window_to_wire(generate_window(np.random.default_rng(seed), 2, riders))
        for seed, riders in enumerate((6, 7, 8))
    ]
    step = FeatureEncoderStep()
    expected = [step.run(tensors) for tensors in batch]
    real = features_module.window_candidates

    def together(*args: Any) -> Any:
        raise RuntimeError("a bug in one window")

    def alone(window: Any, *args: Any) -> Any:
        if window.num_riders == 7:
            raise RuntimeError("a bug in one window")
        return real(window, *args)

    monkeypatch.setattr(steps, "windows_candidates", together)
    monkeypatch.setattr(steps, "window_candidates", alone)
    got = step.encode_batch(batch)
    assert isinstance(got[1], RuntimeError)
    for at in (0, 2):
        outcome = got[at]
        assert not isinstance(outcome, Exception)
        for name, value in expected[at].items():
            np.testing.assert_array_equal(outcome[2][name], value, err_msg=name)


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
    real_checked = steps.stage_checked

    def stacking(window: Any, *rest: Any) -> Any:
        stacked.append(int(window.candidates.shape[0]))
        return real_checked(window, *rest)

    monkeypatch.setattr(TopKResolverStep, "_stage", counting)
    monkeypatch.setattr(steps, "stage_checked", stacking)
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

    encoder, resolver = steps.FeatureEncoderStep(), TopKResolverStep()
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
