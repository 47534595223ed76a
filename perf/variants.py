"""Model-configuration variants, applied to a copy of the model repository.

An override names a model, a setting and a value:

    dispatch_model.queue_delay_us=0          dynamic_batching.max_queue_delay_microseconds
    dispatch_fused.preferred_batch=32        dynamic_batching.preferred_batch_size (one size)
    feature_encoder.instances=1              instance_group counts (in all)
    dispatch_model.param.intra_op_num_threads=2   parameters { key: ... string_value: ... }

`patched_repository` copies the repository and rewrites the named config.pbtxt files with
Triton's own protobuf schema; the checked-in repository is never touched. `make bench`
serves such a copy (`--override`); `python -m perf.tuning` measures variants with it.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatch_service.core.model_config import CONFIG_NAME, read_model_config, write_model_config
from dispatch_service.core.paths import REPO_ROOT

__all__ = [
    "SETTINGS",
    "TUNING_LOG",
    "ConfigOverride",
    "apply_override",
    "config_digest",
    "parse_override",
    "patched_repository",
]

TUNING_LOG = REPO_ROOT / "perf" / "tuning_log.json"
SETTINGS = ("queue_delay_us", "preferred_batch", "instances", "param")


@dataclass(frozen=True)
class ConfigOverride:
    model: str
    setting: str  # one of SETTINGS
    value: str
    key: str = ""  # parameter name for setting "param"

    def __str__(self) -> str:
        key = f".{self.key}" if self.key else ""
        return f"{self.model}.{self.setting}{key}={self.value}"


def parse_override(text: str) -> ConfigOverride:
    target, sep, value = text.partition("=")
    parts = target.strip().split(".")
    if not sep or not value.strip() or len(parts) < 2:
        raise ValueError(f"override must look like MODEL.SETTING=VALUE, got {text!r}")
    model, setting, rest = parts[0], parts[1], parts[2:]
    value = value.strip()
    if setting == "param":
        if len(rest) != 1 or not rest[0]:
            raise ValueError(f"parameter override must be MODEL.param.KEY=VALUE, got {text!r}")
        return ConfigOverride(model, setting, value, rest[0])
    if setting not in SETTINGS or rest:
        raise ValueError(f"unknown setting {'.'.join(parts[1:])!r}; known: {', '.join(SETTINGS)}")
    if not value.isdigit():
        raise ValueError(f"{setting} needs a non-negative integer, got {value!r}")
    return ConfigOverride(model, setting, value)


def apply_override(config: Any, override: ConfigOverride) -> None:
    """Change one setting of a parsed `model_config_pb2.ModelConfig` in place."""
    if override.setting == "queue_delay_us":
        if not config.HasField("dynamic_batching"):
            raise ValueError(f"{override.model} has no dynamic_batching to tune")
        config.dynamic_batching.max_queue_delay_microseconds = int(override.value)
    elif override.setting == "preferred_batch":
        if not config.HasField("dynamic_batching"):
            raise ValueError(f"{override.model} has no dynamic_batching to tune")
        size = int(override.value)
        if not 1 <= size <= config.max_batch_size:
            raise ValueError(f"preferred_batch must be 1..{config.max_batch_size}, got {size}")
        config.dynamic_batching.preferred_batch_size[:] = [size]
    elif override.setting == "instances":
        if not config.instance_group:
            raise ValueError(f"{override.model} has no instance_group")
        _set_instances(config.instance_group, int(override.value))
    else:
        config.parameters[override.key].string_value = override.value


def _set_instances(groups: Any, total: int) -> None:
    """``total`` instances in all: the first (warm) group keeps its count, up to ``total``,
    the second takes the rest, and groups left without instances are dropped."""
    if total < 1:
        raise ValueError(f"instances must be >= 1, got {total}")
    if len(groups) == 1:
        groups[0].count = total
        return
    groups[0].count = min(groups[0].count or 1, total)
    rest = total - groups[0].count
    del groups[2 if rest else 1 :]
    if rest:
        groups[1].count = rest


def patched_repository(
    source: Path, destination: Path, overrides: Sequence[ConfigOverride]
) -> Path:
    """Copy `source` to `destination` and apply `overrides` there; returns `destination`."""
    shutil.copytree(source, destination, ignore=shutil.ignore_patterns("__pycache__"))
    for override in overrides:
        path = destination / override.model / CONFIG_NAME
        if not path.exists():
            raise ValueError(f"no model {override.model!r} in {source}")
        config = read_model_config(path)
        apply_override(config, override)
        write_model_config(path, config)
    return destination


def config_digest(repository: Path) -> dict[str, dict[str, str]]:
    """Per model, the settings a tuning run touches, as read from config.pbtxt."""
    digest: dict[str, dict[str, str]] = {}
    for path in sorted(repository.glob(f"*/{CONFIG_NAME}")):
        config = read_model_config(path)
        entry: dict[str, str] = {}
        if config.platform == "ensemble":
            entry["kind"] = "ensemble"
        else:
            entry["instances"] = str(sum(group.count or 1 for group in config.instance_group))
        if config.HasField("dynamic_batching"):
            delay = config.dynamic_batching.max_queue_delay_microseconds
            entry["queue_delay_us"] = str(delay)
            preferred = config.dynamic_batching.preferred_batch_size
            entry["preferred_batch"] = ",".join(str(size) for size in preferred)
        for key in ("intra_op_num_threads", "inter_op_num_threads"):
            if key in config.parameters:
                entry[key] = config.parameters[key].string_value
        digest[config.name or path.parent.name] = entry
    return digest


# ---- tuning runs -----------------------------------------------------------------------------
