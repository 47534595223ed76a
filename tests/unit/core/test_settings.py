"""Behaviour of dispatch_service.core.settings: config.pbtxt parameters -> typed settings."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from dispatch_service.core.settings import (
    BACKEND_PARAMETERS,
    RELOAD_MARK_PARAMETER,
    SettingsError,
    load_settings,
    parameters_from_model_config,
    reject_unknown,
)
from dispatch_service.pipeline.onnx_runner import OrtSettings


@dataclass(frozen=True)
class Knobs:
    count: int = 1
    ratio: float = 0.5
    enabled: bool = False
    label: str = "default"


@dataclass(frozen=True)
class Checked:
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")


@dataclass(frozen=True)
class Unsupported:
    pair: tuple[int, int] = (1, 2)


@dataclass(frozen=True)
class Other:
    depth: int = 3


# ---- parameters_from_model_config ----------------------------------------------------

MODEL_CONFIG = {
    "name": "topk_resolver",
    "backend": "python",
    "parameters": {
        "top_k": {"string_value": "3"},
        "cost_scale_cny": {"string_value": "12.5"},
        "FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "no"},
    },
}
EXPECTED_PARAMETERS = {"top_k": "3", "cost_scale_cny": "12.5", "FORCE_CPU_ONLY_INPUT_TENSORS": "no"}


def test_parameters_from_json_text() -> None:
    assert parameters_from_model_config(json.dumps(MODEL_CONFIG)) == EXPECTED_PARAMETERS


def test_parameters_from_a_parsed_config() -> None:
    assert parameters_from_model_config(MODEL_CONFIG) == EXPECTED_PARAMETERS


@pytest.mark.parametrize(
    "config",
    [{"name": "m"}, {"name": "m", "parameters": {}}, {"name": "m", "parameters": None}],
    ids=["absent", "empty", "null"],
)
def test_a_config_without_parameters_gives_none(config: dict[str, object]) -> None:
    assert parameters_from_model_config(config) == {}
    assert parameters_from_model_config(json.dumps(config)) == {}


def test_a_parameter_without_string_value_reads_as_empty() -> None:
    assert parameters_from_model_config({"parameters": {"x": {}}}) == {"x": ""}


# ---- load_settings -------------------------------------------------------------------


def test_defaults_when_no_parameter_is_given() -> None:
    assert load_settings(Knobs, {}) == Knobs()


def test_each_field_type_is_converted() -> None:
    knobs = load_settings(
        Knobs, {"count": "42", "ratio": "1e-3", "enabled": "true", "label": " spaced "}
    )
    assert knobs == Knobs(count=42, ratio=0.001, enabled=True, label=" spaced ")
    assert type(knobs.count) is int
    assert type(knobs.ratio) is float
    assert type(knobs.enabled) is bool


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", True),
        ("TRUE", True),
        ("yes", True),
        (" On ", True),
        ("0", False),
        ("false", False),
        ("No", False),
        ("off", False),
    ],
)
def test_bool_spellings(text: str, expected: bool) -> None:
    assert load_settings(Knobs, {"enabled": text}).enabled is expected


def test_parameters_named_like_no_field_are_ignored() -> None:
    assert load_settings(Knobs, {"count": "2", "unrelated": "x"}) == Knobs(count=2)


@pytest.mark.parametrize(
    ("key", "text", "kind"),
    [
        ("count", "many", "int"),
        ("count", "1.5", "int"),
        ("count", "", "int"),
        ("ratio", "half", "float"),
        ("enabled", "maybe", "bool"),
        ("enabled", "", "bool"),
    ],
)
def test_a_bad_value_names_the_key(key: str, text: str, kind: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(Knobs, {key: text})
    message = str(info.value)
    assert f"parameter {key!r}" in message
    assert f"{text!r} is not a valid {kind}" in message


def test_an_unsupported_field_type_is_a_settings_error() -> None:
    with pytest.raises(SettingsError, match=r"parameter 'pair': unsupported settings type"):
        load_settings(Unsupported, {"pair": "1,2"})


def test_post_init_value_error_surfaces_as_settings_error() -> None:
    with pytest.raises(SettingsError, match=r"^Checked: size must be >= 1, got 0$") as info:
        load_settings(Checked, {"size": "0"})
    assert isinstance(info.value.__cause__, ValueError)


def test_library_settings_validation_surfaces_as_settings_error() -> None:
    with pytest.raises(SettingsError, match=r"OrtSettings: graph_optimization_level must be"):
        load_settings(OrtSettings, {"graph_optimization_level": "max"})


def test_settings_error_is_a_value_error() -> None:
    assert issubclass(SettingsError, ValueError)


def test_load_settings_needs_a_dataclass() -> None:
    with pytest.raises(TypeError, match="is not a dataclass"):
        load_settings(dict, {})


# ---- reject_unknown ------------------------------------------------------------------


def test_known_keys_of_any_class_are_accepted() -> None:
    reject_unknown({"count": "1", "depth": "2"}, Knobs, Other)


def test_no_parameters_are_accepted() -> None:
    reject_unknown({}, Knobs)


@pytest.mark.parametrize("key", sorted(BACKEND_PARAMETERS))
def test_the_backends_own_keys_are_accepted(key: str) -> None:
    reject_unknown({key: "no", "count": "1"}, Knobs)


def test_the_supervisors_reload_mark_is_accepted_and_read_by_no_setting() -> None:
    reject_unknown({RELOAD_MARK_PARAMETER: "1733050000", "count": "1"}, Knobs)
    assert load_settings(Knobs, {RELOAD_MARK_PARAMETER: "x", "count": "3"}) == Knobs(count=3)


def test_force_cpu_only_input_tensors_is_a_backend_key() -> None:
    assert "FORCE_CPU_ONLY_INPUT_TENSORS" in BACKEND_PARAMETERS
    reject_unknown({"FORCE_CPU_ONLY_INPUT_TENSORS": "no"}, Knobs)


def test_unknown_keys_are_listed_sorted_with_the_known_ones() -> None:
    with pytest.raises(SettingsError) as info:
        reject_unknown({"zeta": "1", "count": "2", "alpha": "3"}, Knobs, Other)
    message = str(info.value)
    assert "unknown config parameter(s) alpha, zeta;" in message
    assert "known: count, depth, enabled, label, ratio" in message


def test_a_key_known_only_to_another_class_is_unknown() -> None:
    with pytest.raises(SettingsError, match="depth"):
        reject_unknown({"depth": "1"}, Knobs)


def test_keys_are_case_sensitive() -> None:
    with pytest.raises(SettingsError, match="unknown config parameter\\(s\\) Count;"):
        reject_unknown({"Count": "1"}, Knobs)
