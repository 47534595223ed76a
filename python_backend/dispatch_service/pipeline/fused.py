"""The whole dispatch in one process: encode, score with the routed version, resolve.

Why it exists: every Python-backend model is its own process, and a request through the
`dispatch` ensemble crosses four of them (feature_encoder, dispatch_router, dispatch_model
through BLS, topk_resolver). On a small window those hops cost several times the work
itself (see perf/reports). `dispatch_fused` runs the same steps, configured from the same
config.pbtxt files, with the same per-order canary routing, shadow scoring and fallback chain
(`routing.route_and_score_now`: the router's routing, with the versions scored in process
and no event loop), in one model instance: the same answer as `dispatch` for the
same window and settings, at the cost of one hop.

What it gives up: the scored versions are ONNX Runtime sessions inside this model, read from
``<repository>/<scoring_model>/<version>/model.onnx`` when the model loads, not Triton-managed
`dispatch_model` versions. A version that is not there (or fails to load) is unavailable and
its orders take the fallback chain, as an unloaded version does for the router.
`router_control.apply_router_settings` reloads this model with the router's settings, so a
deploy or rollback moves both entry points; the launcher loads it only when the versions it
reads verified (`verified_load`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    CANDIDATE_RIDER_INDEX,
    MODEL_VERSION_TAG,
    ORDER_FALLBACK_LEVEL,
    ORDER_MODEL_VERSION,
    PAIR_FEATURES,
    PAIR_OBJECTIVES,
)
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.settings import load_settings, reject_unknown
from dispatch_service.pipeline.dispatch_pipeline import config_parameters, repository_steps
from dispatch_service.pipeline.onnx_runner import OnnxScorer, OrtSettings
from dispatch_service.pipeline.steps import Arrays, FeatureEncoderStep, TopKResolverStep
from dispatch_service.routing.engine import ModelCallError, RoutedScores, route_and_score_now
from dispatch_service.routing.policy import choose_versions, parse_version_tag
from dispatch_service.routing.settings import FusedSettings
from dispatch_service.routing.shadow import shadow_sampled

__all__ = [
    "FusedDispatch",
    "FusedResult",
]

_USER_IDS: Final = "ORDER_USER_IDS"


@dataclass(frozen=True)
class FusedResult:
    """One answered window, with what the metrics need."""

    outputs: Arrays
    encoded: Arrays
    routed: RoutedScores
    encode_ms: float
    resolve_ms: float


@dataclass
class FusedDispatch:
    encoder: FeatureEncoderStep
    resolver: TopKResolverStep
    settings: FusedSettings
    scorers: Mapping[int, OnnxScorer]
    # Versions that could not be loaded, with why: their calls fail into the fallback chain.
    unavailable: Mapping[int, str] = field(default_factory=dict)
    draw: Callable[[], float] = random.random  # uniform [0, 1): the shadow sample

    @classmethod
    def from_repository(
        cls, repository: Path, settings: FusedSettings, **kwargs: Any
    ) -> FusedDispatch:
        """Steps configured from the sibling models' config.pbtxt (one source of settings)."""
        scoring = repository / settings.scoring_model
        ort_parameters = config_parameters(scoring / "config.pbtxt")
        reject_unknown(ort_parameters, OrtSettings)
        ort_settings = load_settings(OrtSettings, ort_parameters)
        scorers: dict[int, OnnxScorer] = {}
        unavailable: dict[int, str] = {}
        for version in settings.served_versions():
            path = scoring / str(version) / "model.onnx"
            try:
                scorers[version] = OnnxScorer(path, ort_settings)
            except Exception as exc:  # any unreadable artifact: the version is unavailable
                unavailable[version] = f"{path} did not load: {type(exc).__name__}: {exc}"
        encoder, resolver = repository_steps(repository)
        return cls(
            encoder=encoder,
            resolver=resolver,
            settings=settings,
            scorers=scorers,
            unavailable=unavailable,
            **kwargs,
        )

    def score(self, version: int, features: NDArray[np.float32]) -> NDArray[Any]:
        """The routing `SyncScorer`: ONNX Runtime here; ModelCallError if unavailable."""
        scorer = self.scorers.get(version)
        if scorer is None:
            reason = self.unavailable.get(version, "not one of the versions this model reads")
            raise ModelCallError(f"version {version} unavailable: {reason}")
        return scorer.infer(features)

    def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> FusedResult:
        """One window's tensors (`dispatch`'s inputs) -> `dispatch`'s outputs."""
        started = time.perf_counter()
        encoded = self.encoder.run(inputs)
        encoded_at = time.perf_counter()
        user_ids = inputs.get(_USER_IDS)
        if user_ids is None:  # the encoder has already rejected this; kept for the type
            raise DispatchInputError(_USER_IDS, "is required but missing", "missing")
        routing = self.settings.routing
        routed = route_and_score_now(
            encoded[PAIR_FEATURES.name],
            encoded[CANDIDATE_RIDER_INDEX.name],
            choose_versions(
                user_ids, routing, parse_version_tag(inputs.get(MODEL_VERSION_TAG.name), routing)
            ),
            routing,
            self.score,
            shadow=shadow_sampled(self.draw(), routing),
        )
        scored_at = time.perf_counter()
        resolved = self.resolver.run({**inputs, **encoded, PAIR_OBJECTIVES.name: routed.objectives})
        done = time.perf_counter()
        return FusedResult(
            outputs={
                **resolved,
                ORDER_MODEL_VERSION.name: routed.model_version,
                ORDER_FALLBACK_LEVEL.name: routed.fallback_level,
            },
            encoded=encoded,
            routed=routed,
            encode_ms=(encoded_at - started) * 1000.0,
            resolve_ms=(done - scored_at) * 1000.0,
        )
