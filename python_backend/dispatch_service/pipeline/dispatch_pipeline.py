"""The whole ensemble in one process: encoder -> ONNX Runtime -> resolver.

The same step objects the Triton models run, configured from the same `config.pbtxt`
parameters; used for evaluation, as the benchmarks' no-serving limit, and by tests that
compare the server's answer with the library's. Given a `metrics` sink it records the same
custom metrics the Triton models do (`pipeline.step_metrics`); by default none.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import CANDIDATE_RIDER_INDEX, ORDER_MODEL_VERSION
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.metrics import (
    MetricsSink,
    NullMetrics,
    StepObserver,
    rejection_observation,
)
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import (
    ENCODER_MODEL,
    RESOLVER_MODEL,
    SCORING_MODEL,
    model_layout,
)
from dispatch_service.pipeline.encoder_step import FeatureEncoderStep
from dispatch_service.pipeline.model_step import DispatchModelStep
from dispatch_service.pipeline.resolver_step import TopKResolverStep
from dispatch_service.pipeline.step_io import Arrays, Step
from dispatch_service.pipeline.step_metrics import encoder_observations, resolver_observations
from dispatch_service.routing.engine import SyncScorer

__all__ = [
    "DispatchPipeline",
    "repository_steps",
]


@dataclass(frozen=True)
class _Resolver:
    """The resolver step with the pipeline's model to re-score stacked orders with."""

    resolver: TopKResolverStep
    score: SyncScorer
    input_names: ClassVar[tuple[str, ...]] = TopKResolverStep.input_names

    def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> Arrays:
        return self.resolver.run(inputs, score=self.score)


def repository_steps(repository: Path) -> tuple[FeatureEncoderStep, TopKResolverStep]:
    """The encoder and resolver steps as the repository's config.pbtxt files configure them."""
    return (
        FeatureEncoderStep.from_parameters(
            config_parameters(model_layout(repository, ENCODER_MODEL).config)
        ),
        TopKResolverStep.from_parameters(
            config_parameters(model_layout(repository, RESOLVER_MODEL).config)
        ),
    )


@dataclass(frozen=True)
class DispatchPipeline:
    encoder: FeatureEncoderStep
    model: DispatchModelStep
    resolver: TopKResolverStep
    metrics: MetricsSink = field(default_factory=NullMetrics, compare=False)
    # The one version scored here; ORDER_MODEL_VERSION of every order, as the router says.
    model_version: int = 1

    @classmethod
    def from_repository(
        cls,
        repository: Path = MODEL_REPOSITORY,
        model_version: int = 1,
        metrics: MetricsSink | None = None,
    ) -> DispatchPipeline:
        encoder, resolver = repository_steps(repository)
        scoring = model_layout(repository, SCORING_MODEL)
        return cls(
            encoder=encoder,
            model=DispatchModelStep.from_parameters(
                scoring.onnx(model_version), config_parameters(scoring.config)
            ),
            resolver=resolver,
            metrics=metrics if metrics is not None else NullMetrics(),
            model_version=model_version,
        )

    def run(self, tensors: Mapping[str, NDArray[Any] | None]) -> Arrays:
        encoded = self._observed(self.encoder, tensors, encoder_observations)
        scored = self._observed(self.model, encoded, None)
        orders = encoded[CANDIDATE_RIDER_INDEX.name].shape[0]
        versions = np.full(orders, self.model_version, dtype=np.int32)
        return self._observed(
            _Resolver(self.resolver, self._score),
            {**tensors, **encoded, **scored, ORDER_MODEL_VERSION.name: versions},
            resolver_observations,
        )

    def _score(self, version: int, features: NDArray[np.float32]) -> NDArray[Any]:
        """This pipeline's one model (the resolver re-scores stacked pairs with it)."""
        return self.model.scorer.infer(features)

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
