"""The dispatch_model step: pair features in, objectives out, scored by ONNX Runtime."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    MODEL_INPUTS,
    PAIR_FEATURES,
    PAIR_OBJECTIVES,
)
from dispatch_service.core.batches import split_rows
from dispatch_service.core.settings import load_settings, reject_unknown
from dispatch_service.core.signing import TrustedKeys
from dispatch_service.pipeline.onnx_runner import (
    MODEL_FILE,
    OnnxScorer,
    OrtSettings,
    version_scorer,
)
from dispatch_service.pipeline.step_io import Arrays, required

__all__ = ["DispatchModelStep"]


class DispatchModelStep:
    """ONNX Runtime scoring; `run_batch` scores many requests' pairs in one session call."""

    input_names: ClassVar[tuple[str, ...]] = (MODEL_INPUTS[0].name,)

    def __init__(
        self,
        model_path: str | Path,
        settings: OrtSettings | None = None,
        trusted: TrustedKeys | None = None,
    ) -> None:
        """``trusted``: verify the version folder first and run the verified bytes."""
        path = Path(model_path)
        if trusted is None:
            self.scorer = OnnxScorer(path, settings)
            return
        if path.name != MODEL_FILE:
            raise ValueError(f"a verified load reads a version folder's {MODEL_FILE}, not {path}")
        self.scorer = version_scorer(path.parent, settings, trusted)

    @classmethod
    def from_parameters(
        cls,
        model_path: str | Path,
        parameters: Mapping[str, str],
        trusted: TrustedKeys | None = None,
    ) -> DispatchModelStep:
        reject_unknown(parameters, OrtSettings)
        return cls(model_path, load_settings(OrtSettings, parameters), trusted)

    def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> Arrays:
        return {PAIR_OBJECTIVES.name: self.scorer.score(required(inputs, PAIR_FEATURES.name))}

    def run_batch(self, batch: Sequence[NDArray[np.float32]]) -> list[NDArray[np.float32]]:
        """Concatenate checked requests' pair rows, score once, split back per request."""
        if len(batch) == 1:
            return [self.scorer.infer(batch[0])]
        scores = self.scorer.infer(np.concatenate(batch, axis=0))
        return split_rows(scores, [len(part) for part in batch])
