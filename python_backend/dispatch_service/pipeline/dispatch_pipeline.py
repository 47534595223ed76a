"""The whole ensemble in one process: encoder -> ONNX Runtime -> resolver.

The same step objects the Triton models run, configured from the same `config.pbtxt`
parameters; used for evaluation, as the benchmarks' no-serving limit, and by tests that
compare the server's answer with the library's. Given a `metrics` sink it records the same
custom metrics the Triton models do (`dispatch_service.core.metrics`); by default none.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.metrics import (
    MetricsSink,
    NullMetrics,
    StepObserver,
    encoder_observations,
    rejection_observation,
    resolver_observations,
)
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.pipeline.steps import (
    Arrays,
    DispatchModelStep,
    FeatureEncoderStep,
    Step,
    TopKResolverStep,
)

__all__ = [
    "DispatchPipeline",
    "repository_steps",
]


@dataclass(frozen=True)
class _StackAwareResolver:
    """The resolver step with stack-aware re-scoring by the pipeline's model."""

    resolver: TopKResolverStep
    model: DispatchModelStep
    input_names: ClassVar[tuple[str, ...]] = TopKResolverStep.input_names

    def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> Arrays:
        def rescore(rows: NDArray[np.int64], features: NDArray[np.float32]) -> NDArray[np.float32]:
            return self.model.scorer.infer(features)

        return self.resolver.run_stack_aware(inputs, rescore).resolution.as_wire_tensors()


def repository_steps(repository: Path) -> tuple[FeatureEncoderStep, TopKResolverStep]:
    """The encoder and resolver steps as the repository's config.pbtxt files configure them."""
    return (
        FeatureEncoderStep.from_parameters(
            config_parameters(repository / "feature_encoder" / "config.pbtxt")
        ),
        TopKResolverStep.from_parameters(
            config_parameters(repository / "topk_resolver" / "config.pbtxt")
        ),
    )


@dataclass(frozen=True)
class DispatchPipeline:
    encoder: FeatureEncoderStep
    model: DispatchModelStep
    resolver: TopKResolverStep
    metrics: MetricsSink = field(default_factory=NullMetrics, compare=False)
    # Re-score stacked orders with the model and re-solve (pipeline.stacking). Off by
    # default: the `dispatch` ensemble this pipeline mirrors has no model in its resolver
    # step, and tests compare the two answers.
    stack_aware: bool = False

    @classmethod
    def from_repository(
        cls,
        repository: Path = MODEL_REPOSITORY,
        model_version: int = 1,
        metrics: MetricsSink | None = None,
        stack_aware: bool = False,
    ) -> DispatchPipeline:
        encoder, resolver = repository_steps(repository)
        return cls(
            encoder=encoder,
            model=DispatchModelStep.from_parameters(
                repository / "dispatch_model" / str(model_version) / "model.onnx",
                config_parameters(repository / "dispatch_model" / "config.pbtxt"),
            ),
            resolver=resolver,
            metrics=metrics if metrics is not None else NullMetrics(),
            stack_aware=stack_aware,
        )

    def run(self, tensors: Mapping[str, NDArray[Any] | None]) -> Arrays:
        encoded = self._observed(self.encoder, tensors, encoder_observations)
        scored = self._observed(self.model, encoded, None)
        # With stack_aware, stacked orders are re-scored with this model and the window
        # re-solved (pipeline.stacking); the step records the resolver's metrics as before.
        resolver: Step = (
            _StackAwareResolver(self.resolver, self.model) if self.stack_aware else self.resolver
        )
        return self._observed(
            resolver,
            {**tensors, **encoded, **scored},
            resolver_observations,
        )

    def _observed(
        self,
        step: Step,
        inputs: Mapping[str, NDArray[Any] | None],
        observer: StepObserver | None,
    ) -> Arrays:
        started = time.perf_counter()
        try:
            outputs = step.run(inputs)
        except DispatchInputError as exc:
            self.metrics.record([rejection_observation(exc)])
            raise
        if observer is not None:
            self.metrics.record(observer(outputs, (time.perf_counter() - started) * 1000.0))
        return outputs
