"""The one reader (and writer) of Triton `config.pbtxt` files.

Parsed with Triton's own protobuf schema (`tritonclient.grpc.model_config_pb2`), so a
config reads here exactly as the server reads it. The launcher, the in-process pipeline,
the operations tools and the benchmarks all go through these functions; the Python
backend itself gets its config as JSON from Triton (`core.settings.parameters_from_model_config`).
The protobuf modules are imported on first use: importing this module costs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from dispatch_service.core.settings import parameters_from_model_config

__all__ = [
    "CONFIG_NAME",
    "config_parameters",
    "profile_config_path",
    "read_config_dict",
    "read_model_config",
    "write_model_config",
]

CONFIG_NAME: Final = "config.pbtxt"


def profile_config_path(model_dir: Path, profile: str | None = None) -> Path:
    """The file Triton reads for ``--model-config-name=<profile>``: ``configs/<profile>.pbtxt``
    when present, else ``config.pbtxt``."""
    if profile is not None:
        chosen = model_dir / "configs" / f"{profile}.pbtxt"
        if chosen.is_file():
            return chosen
    return model_dir / CONFIG_NAME


def read_model_config(path: Path) -> Any:
    """The config file as a `model_config_pb2.ModelConfig` message (to inspect or edit)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(Path(path).read_text(), model_config_pb2.ModelConfig())


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
