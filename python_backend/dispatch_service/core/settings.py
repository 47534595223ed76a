"""Model settings come from `config.pbtxt` `parameters`, parsed once into typed objects.

A key that no settings class of the model knows is an error at load time, so a typo in a
config fails loudly instead of silently running on defaults.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, TypeVar, get_type_hints

__all__ = [
    "BACKEND_PARAMETERS",
    "RELOAD_MARK_PARAMETER",
    "STUB_NICE_PARAMETER",
    "SettingsError",
    "load_settings",
    "parameters_from_model_config",
    "reject_unknown",
]

T = TypeVar("T")

# Parameters read by Triton's Python backend itself, not by our settings classes.
BACKEND_PARAMETERS = frozenset({"FORCE_CPU_ONLY_INPUT_TENSORS", "EXECUTION_ENV_PATH"})
# Set by the launcher's supervisor when it reloads a model whose stub died: a config that
# differs makes Triton build every instance anew while the old ones answer (one that does not
# differ keeps the dead stub's instance), without unloading the model and the ensembles that
# use it. No model reads it.
RELOAD_MARK_PARAMETER = "reload_mark"
# Every stub's CPU niceness (`serving.stub_setup`), read before the model's own settings.
STUB_NICE_PARAMETER = "stub_nice"
_NOT_SETTINGS = BACKEND_PARAMETERS | {RELOAD_MARK_PARAMETER, STUB_NICE_PARAMETER}


class SettingsError(ValueError):
    """A config parameter is unknown or cannot be read as its declared type."""


def parameters_from_model_config(model_config: str | Mapping[str, Any]) -> dict[str, str]:
    """The `parameters` map of a Triton model config (JSON text or parsed) as plain strings."""
    config = json.loads(model_config) if isinstance(model_config, str) else model_config
    raw = config.get("parameters") or {}
    return {key: str(value.get("string_value", "")) for key, value in raw.items()}


def _convert(key: str, text: str, kind: Any) -> Any:
    try:
        if kind is bool:
            lowered = text.strip().lower()
            if lowered in {"1", "true", "yes", "on"}:
                return True
            if lowered in {"0", "false", "no", "off"}:
                return False
            raise ValueError(text)
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        if kind is str:
            return text
    except ValueError:
        raise SettingsError(f"parameter {key!r}: {text!r} is not a valid {kind.__name__}") from None
    raise SettingsError(f"parameter {key!r}: unsupported settings type {kind!r}")


def load_settings(cls: type[T], parameters: Mapping[str, str]) -> T:
    """Build dataclass `cls` from the parameters named like its fields; others are ignored."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    hints = get_type_hints(cls)
    values = {
        field.name: _convert(field.name, parameters[field.name], hints[field.name])
        for field in dataclasses.fields(cls)
        if field.name in parameters
    }
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{cls.__name__}: {exc}") from exc


def reject_unknown(parameters: Mapping[str, str], *classes: type[Any]) -> None:
    """Fail when a parameter matches no field of the model's settings classes."""
    known = {field.name for cls in classes for field in dataclasses.fields(cls)}
    unknown = sorted(set(parameters) - known - _NOT_SETTINGS)
    if unknown:
        raise SettingsError(
            f"unknown config parameter(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
