"""The one reader (and writer) of Triton `config.pbtxt` files.

Parsed with Triton's own protobuf schema (`tritonclient.grpc.model_config_pb2`), so a
config reads here exactly as the server reads it. The launcher, the in-process pipeline,
the operations tools and the benchmarks all go through these functions; the Python
backend itself gets its config as JSON from Triton (`core.settings.parameters_from_model_config`).
The protobuf modules are imported on first use: importing this module costs nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from dispatch_service.core.repository_layout import CONFIG_FILE, ModelLayout
from dispatch_service.core.settings import parameters_from_model_config

__all__ = [
    "CONFIG_NAME",
    "ModelConfigError",
    "check_repository_configs",
    "config_from_dict",
    "config_parameters",
    "ensemble_steps",
    "profile_config_path",
    "read_config_dict",
    "read_model_config",
    "write_model_config",
]

CONFIG_NAME: Final = CONFIG_FILE


def profile_config_path(model_dir: Path, profile: str | None = None) -> Path:
    """The file Triton reads for ``--model-config-name=<profile>``
    (`repository_layout.ModelLayout.profile_config`)."""
    return ModelLayout(Path(model_dir)).profile_config(profile)


class ModelConfigError(ValueError):
    """A config file Triton could not read: one line naming the model, the file, the place
    and protobuf's reason (never a chained traceback)."""


def _model_name(path: Path) -> str:
    """The model a config file belongs to: its folder (``<model>/configs/<profile>.pbtxt``
    belongs to ``<model>``)."""
    folder = path.parent
    return folder.parent.name if folder.name == "configs" else folder.name


def read_model_config(path: Path) -> Any:
    """The config file as a `model_config_pb2.ModelConfig` message (to inspect or edit);
    `ModelConfigError` when protobuf cannot read it."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    path = Path(path)
    try:
        return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())
        place = re.match(r"(\d+):(\d+) : ", reason)  # ParseError's "LINE:COLUMN : reason"
        if place is not None:
            reason = f"line {place[1]}, column {place[2]}: {reason[place.end() :]}"
        raise ModelConfigError(
            f"model {_model_name(path)!r}: {path} is not a valid model config: {reason}"
        ) from None


def config_from_dict(config: Mapping[str, Any]) -> Any:
    """A config in Triton's JSON form (what `/v2/models/<m>/config` answers, what a load
    request overrides with) as a `model_config_pb2.ModelConfig` message; `ModelConfigError`
    when protobuf cannot read it (a field this schema does not know included)."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2

    try:
        return json_format.ParseDict(dict(config), model_config_pb2.ModelConfig())
    except json_format.ParseError as exc:
        name = config.get("name", "?")
        reason = " ".join(str(exc).split())
        raise ModelConfigError(f"model {name!r}: not a valid model config: {reason}") from None


def check_repository_configs(repository: Path, profile: str | None = None) -> None:
    """Read the config of every model folder of ``repository`` that Triton would read under
    ``--model-config-name=<profile>``; the first that does not parse raises
    `ModelConfigError` (before a server is started on it, which would log the reason among
    a hundred lines and fail on the ensembles that use the model)."""
    for folder in sorted(Path(repository).iterdir()):
        if folder.is_dir() and (folder / CONFIG_FILE).is_file():
            read_model_config(profile_config_path(folder, profile))


def write_model_config(path: Path, config: Any) -> None:
    """Write a `ModelConfig` message back as protobuf text."""
    from google.protobuf import text_format

    Path(path).write_text(text_format.MessageToString(config))


def read_config_dict(path: Path) -> dict[str, Any]:
    """The config file in Triton's JSON form (what the server hands a Python model)."""
    from google.protobuf import json_format

    config: dict[str, Any] = json_format.MessageToDict(
        read_model_config(path), preserving_proto_field_name=True
    )
    return config


def config_parameters(path: Path) -> dict[str, str]:
    """The `parameters` map of a config file as plain strings."""
    return parameters_from_model_config(read_config_dict(path))


def ensemble_steps(path: Path) -> list[str]:
    """The model names of an ensemble config's steps, in order (none for another model)."""
    config = read_model_config(path)
    return [str(step.model_name) for step in config.ensemble_scheduling.step]
