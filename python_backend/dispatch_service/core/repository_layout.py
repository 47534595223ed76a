"""The one map of a Triton model repository: which file of a model lives where, and the names
of the models this service ships.

Every path into a repository is built here (the launcher, the pipeline, the adapters, the
operations tools, the benchmarks and the tests all ask this module), so the layout Triton
reads -- ``<model>/config.pbtxt``, ``<model>/configs/<profile>.pbtxt``, ``<model>/<version>/``
with ``model.onnx`` or ``model.py``, ``<model>/warmup/`` -- is written down once. What a
config says (an ensemble's step list, parameters) is read by `core.model_config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = [
    "CONFIG_FILE",
    "DISPATCH_ENSEMBLE",
    "DRIFT_REFERENCE_FILE",
    "ENCODER_MODEL",
    "FEATURES_ENSEMBLE",
    "FUSED_MODEL",
    "MODEL_NAMES",
    "ONNX_FILE",
    "PRIORITY_MODEL",
    "PROFILES_FOLDER",
    "PYTHON_MODEL_FILE",
    "RESOLVER_MODEL",
    "ROUTER_MODEL",
    "SCORING_MODEL",
    "WARMUP_FOLDER",
    "ModelLayout",
    "model_layout",
    "models_in",
]

# The models of this repository (the folder names under model_repository/).
ENCODER_MODEL: Final = "feature_encoder"  # window -> candidate pairs and their features
SCORING_MODEL: Final = "dispatch_model"  # the versioned ONNX scorer routing picks among
RESOLVER_MODEL: Final = "topk_resolver"  # scored pairs -> Top-K and the assignment
DISPATCH_ENSEMBLE: Final = "dispatch"  # encoder -> scorer -> resolver
FEATURES_ENSEMBLE: Final = "dispatch_features"  # the entry for precomputed pair features
FUSED_MODEL: Final = "dispatch_fused"  # the three steps in one Python model
PRIORITY_MODEL: Final = "dispatch_priority"  # dispatch_fused on its own stubs: the level-1 lane
ROUTER_MODEL: Final = "dispatch_router"  # per-city / canary routing over the scorer
MODEL_NAMES: Final = (
    ENCODER_MODEL,
    SCORING_MODEL,
    RESOLVER_MODEL,
    DISPATCH_ENSEMBLE,
    FEATURES_ENSEMBLE,
    FUSED_MODEL,
    PRIORITY_MODEL,
    ROUTER_MODEL,
)

CONFIG_FILE: Final = "config.pbtxt"
PROFILES_FOLDER: Final = "configs"  # <profile>.pbtxt, chosen by --model-config-name
ONNX_FILE: Final = "model.onnx"
# A scoring version's training reference for drift monitoring (`pipeline.drift`).
DRIFT_REFERENCE_FILE: Final = "drift_reference.json"
PYTHON_MODEL_FILE: Final = "model.py"
WARMUP_FOLDER: Final = "warmup"  # one raw file per input tensor (model_warmup)


@dataclass(frozen=True)
class ModelLayout:
    """The files of one model folder (``folder``: ``<repository>/<model>``)."""

    folder: Path

    @property
    def name(self) -> str:
        return self.folder.name

    @property
    def config(self) -> Path:
        return self.folder / CONFIG_FILE

    @property
    def profiles(self) -> Path:
        return self.folder / PROFILES_FOLDER

    def profile(self, profile: str) -> Path:
        """``configs/<profile>.pbtxt`` (present or not)."""
        return self.profiles / f"{profile}.pbtxt"

    def profile_config(self, profile: str | None = None) -> Path:
        """The file Triton reads for ``--model-config-name=<profile>``: the profile's file
        when present, else ``config.pbtxt``."""
        if profile is not None and self.profile(profile).is_file():
            return self.profile(profile)
        return self.config

    def version(self, version: int | str) -> Path:
        return self.folder / str(version)

    def onnx(self, version: int | str) -> Path:
        return self.version(version) / ONNX_FILE

    def python_model(self, version: int | str = 1) -> Path:
        return self.version(version) / PYTHON_MODEL_FILE

    @property
    def warmup(self) -> Path:
        return self.folder / WARMUP_FOLDER

    def versions(self) -> tuple[int, ...]:
        """The version folders present, ascending."""
        if not self.folder.is_dir():
            return ()
        return tuple(
            sorted(int(p.name) for p in self.folder.iterdir() if p.is_dir() and p.name.isdigit())
        )


def model_layout(repository: Path, model: str) -> ModelLayout:
    """The layout of ``model`` in ``repository``."""
    return ModelLayout(Path(repository) / model)


def models_in(repository: Path) -> list[ModelLayout]:
    """Every model folder of ``repository`` (one with a ``config.pbtxt``), by name."""
    return [
        ModelLayout(folder)
        for folder in sorted(Path(repository).iterdir())
        if (folder / CONFIG_FILE).is_file()
    ]
