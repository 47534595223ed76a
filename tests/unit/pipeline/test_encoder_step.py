"""Behaviour of dispatch_service.pipeline.encoder_step: the feature_encoder step."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatch_contract import (
    ENCODER_INPUTS,
    NUM_PAIR_FEATURES,
)
from dispatch_contract.keys import KeyFileError
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import ENCODER_MODEL, model_layout
from dispatch_service.core.settings import SettingsError
from dispatch_service.domain import features as features_module
from dispatch_service.domain import geo
from dispatch_service.domain.cities import DEFAULT_REGISTRY, default_registry
from dispatch_service.domain.features import EncoderSettings
from dispatch_service.domain.window_wire import window_from_wire, window_to_wire
from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer
from dispatch_service.offline import gazetteer_build
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline import encoder_step
from dispatch_service.pipeline.steps import (
    FeatureEncoderStep,
    geocoder_settings,
)
from step_inputs import window_tensors

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
    parameters = config_parameters(model_layout(MODEL_REPOSITORY, ENCODER_MODEL).config)
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
    assert float(np.median(errors_m)) < 300.0  # the target for road matches
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

    def together(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug in one window")

    def alone(window: Any, *args: Any, **kwargs: Any) -> Any:
        if window.num_riders == 7:
            raise RuntimeError("a bug in one window")
        return real(window, *args, **kwargs)

    monkeypatch.setattr(encoder_step, "windows_candidates", together)
    monkeypatch.setattr(encoder_step, "window_candidates", alone)
    got = step.encode_batch(batch)
    assert isinstance(got[1], RuntimeError)
    for at in (0, 2):
        outcome = got[at]
        assert not isinstance(outcome, Exception)
        for name, value in expected[at].items():
            np.testing.assert_array_equal(outcome[2][name], value, err_msg=name)
