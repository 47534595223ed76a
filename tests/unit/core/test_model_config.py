"""The one config.pbtxt reader: parameters, the profile's file, JSON form, write-back."""

from __future__ import annotations

from pathlib import Path

from dispatch_service.core.model_config import (
    config_parameters,
    profile_config_path,
    read_config_dict,
    read_model_config,
    write_model_config,
)
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import (
    RESOLVER_MODEL,
    SCORING_MODEL,
    ModelLayout,
    model_layout,
)


def test_config_parameters_reads_the_shipped_configs() -> None:
    resolver = config_parameters(model_layout(MODEL_REPOSITORY, RESOLVER_MODEL).config)
    assert resolver["top_k"] == "5"
    assert set(resolver) == {
        "stack_aware",
        "rescore_timeout_ms",
        "top_k",
        "eta_scale_minutes",
        "cost_scale_cny",
    }
    model = config_parameters(model_layout(MODEL_REPOSITORY, SCORING_MODEL).config)
    assert model["graph_optimization_level"] == "all"


def test_config_parameters_of_a_config_without_parameters(tmp_path: Path) -> None:
    config = ModelLayout(tmp_path).config
    config.write_text('name: "m"\nbackend: "python"\n')
    assert config_parameters(config) == {}


def test_an_empty_parameter_value_reads_as_the_empty_string(tmp_path: Path) -> None:
    config = ModelLayout(tmp_path).config
    config.write_text(
        'name: "m"\nbackend: "python"\n'
        'parameters { key: "a" value { string_value: "" } }\n'
        'parameters { key: "b" value { string_value: "x y" } }\n'
    )
    assert config_parameters(config) == {"a": "", "b": "x y"}


def test_profile_config_path_prefers_the_profile_file(tmp_path: Path) -> None:
    layout = ModelLayout(tmp_path)
    layout.config.write_text('name: "m"\n')
    assert profile_config_path(tmp_path, "gpu") == layout.config
    assert profile_config_path(tmp_path) == layout.config
    layout.profiles.mkdir()
    layout.profile("gpu").write_text('name: "m"\n')
    assert profile_config_path(tmp_path, "gpu") == layout.profile("gpu")
    assert profile_config_path(tmp_path, "cpu") == layout.config


def test_json_form_is_what_triton_hands_a_python_model(tmp_path: Path) -> None:
    path = ModelLayout(tmp_path).config
    path.write_text(
        'name: "m"\nbackend: "python"\nmax_batch_size: 8\n'
        "instance_group [{ count: 2, kind: KIND_CPU }]\n"
        'parameters { key: "k" value { string_value: "v" } }\n'
    )
    assert read_config_dict(path) == {
        "name": "m",
        "backend": "python",
        "max_batch_size": 8,
        "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
        "parameters": {"k": {"string_value": "v"}},
    }


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    config = read_model_config(model_layout(MODEL_REPOSITORY, SCORING_MODEL).config)
    config.parameters["intra_op_num_threads"].string_value = "3"
    out = ModelLayout(tmp_path).config
    write_model_config(out, config)
    again = read_model_config(out)
    assert again == config
    assert config_parameters(out)["intra_op_num_threads"] == "3"
