"""The whole ensemble in one process: encoder -> ONNX Runtime -> resolver.

The same step objects the Triton models run, configured from the same `config.pbtxt`
parameters; used for evaluation, as the benchmarks' no-serving limit, and by tests that
compare the server's answer with the library's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numpy.typing import NDArray

from dispatch_service.paths import MODEL_REPOSITORY
from dispatch_service.steps import (
    Arrays,
    DispatchModelStep,
    FeatureEncoderStep,
    TopKResolverStep,
)


def config_parameters(config_path: Path) -> dict[str, str]:
    """The `parameters` of a config.pbtxt, read with Triton's own protobuf schema."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
    return {key: value.string_value for key, value in config.parameters.items()}


@dataclass(frozen=True)
class DispatchPipeline:
    encoder: FeatureEncoderStep
    model: DispatchModelStep
    resolver: TopKResolverStep

    @classmethod
    def from_repository(
        cls, repository: Path = MODEL_REPOSITORY, model_version: int = 1
    ) -> DispatchPipeline:
        return cls(
            encoder=FeatureEncoderStep.from_parameters(
                config_parameters(repository / "feature_encoder" / "config.pbtxt")
            ),
            model=DispatchModelStep.from_parameters(
                repository / "dispatch_model" / str(model_version) / "model.onnx",
                config_parameters(repository / "dispatch_model" / "config.pbtxt"),
            ),
            resolver=TopKResolverStep.from_parameters(
                config_parameters(repository / "topk_resolver" / "config.pbtxt")
            ),
        )

    def run(self, tensors: Mapping[str, NDArray[Any] | None]) -> Arrays:
        encoded = self.encoder.run(tensors)
        scored = self.model.run(encoded)
        return self.resolver.run({**tensors, **encoded, **scored})
