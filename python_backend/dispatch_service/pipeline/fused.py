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
``<repository>/<scoring_model>/<version>/model.onnx``, not Triton-managed `dispatch_model`
versions. What it may score is the same as the router's: the versions the settings say the
scoring model serves (``scoring_versions``, written by the launcher, deploy and rollback into
both models' settings at once), so a tag naming any served version gets that version from
both entry points and a canary that is not served is out of routing in both
(`policy.route_window`). The sessions of the stable version, the canary and every other
served version load with the model (a version the settings do not name loads on its first
request). With trusted keys (verification configured) each version folder is verified
before its session is built from the verified bytes: a refused stable version fails the load, a
refused canary (or other version) is unavailable here, which takes it out of routing instead
of refusing the model. `router_control.apply_router_settings` reloads this model with the
router's settings (both or neither).
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
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.settings import load_settings, reject_unknown
from dispatch_service.core.signing import SigningError, TrustedKeys
from dispatch_service.pipeline.dispatch_pipeline import repository_steps
from dispatch_service.pipeline.onnx_runner import OnnxScorer, OrtSettings, version_scorer
from dispatch_service.pipeline.stacking import Rescorer
from dispatch_service.pipeline.steps import Arrays, FeatureEncoderStep, TopKResolverStep
from dispatch_service.routing.engine import ModelCallError, RoutedScores, route_and_score_now
from dispatch_service.routing.policy import ServedVersions, route_window
from dispatch_service.routing.settings import FusedSettings
from dispatch_service.routing.shadow import shadow_sampled

__all__ = [
    "FusedDispatch",
    "FusedResult",
]

_USER_IDS: Final = "ORDER_USER_IDS"
_REFUSED: Final = "refused by signature verification: "


@dataclass(frozen=True)
class FusedResult:
    """One answered window, with what the metrics need."""

    outputs: Arrays
    encoded: Arrays
    routed: RoutedScores
    encode_ms: float
    resolve_ms: float


VersionLoader = Callable[[int], OnnxScorer]


@dataclass
class FusedDispatch:
    encoder: FeatureEncoderStep
    resolver: TopKResolverStep
    settings: FusedSettings
    scorers: dict[int, OnnxScorer]
    # Versions that could not be loaded, with why: out of routing here, like unserved ones.
    unavailable: dict[int, str] = field(default_factory=dict)
    draw: Callable[[], float] = random.random  # uniform [0, 1): the shadow sample
    # Loads another version's session on first use (None: only the sessions given).
    loader: VersionLoader | None = None
    # Re-score stacked orders with their version and re-solve (pipeline.stacking). Off by
    # default so that `dispatch_fused` answers exactly as the `dispatch` ensemble.
    stack_aware: bool = False

    @classmethod
    def from_repository(
        cls,
        repository: Path,
        settings: FusedSettings,
        trusted: TrustedKeys | None = None,
        **kwargs: Any,
    ) -> FusedDispatch:
        """Steps configured from the sibling models' config.pbtxt (one source of settings).

        ``trusted``: verify every version folder before loading it (SigningError when the
        stable version is refused: the model must not load).
        """
        scoring = repository / settings.scoring_model
        ort_parameters = config_parameters(scoring / "config.pbtxt")
        reject_unknown(ort_parameters, OrtSettings)
        ort_settings = load_settings(OrtSettings, ort_parameters)

        def loader(version: int) -> OnnxScorer:
            return version_scorer(scoring / str(version), ort_settings, trusted)

        encoder, resolver = repository_steps(repository)
        dispatch = cls(
            encoder=encoder,
            resolver=resolver,
            settings=settings,
            scorers={},
            loader=loader,
            **kwargs,
        )
        for version in settings.served_versions():
            dispatch.scorer(version)
        stable = settings.routing.stable_version
        refused = dispatch.unavailable.get(stable, "")
        if trusted is not None and refused.startswith(_REFUSED):
            raise SigningError(f"stable version {stable}: {refused}")
        return dispatch

    def scorer(self, version: int) -> OnnxScorer | None:
        """The version's session, loaded on first use; None when it cannot be loaded."""
        found = self.scorers.get(version)
        if found is not None or version in self.unavailable:
            return found
        if self.loader is None:
            self.unavailable[version] = "not one of the versions this model reads"
            return None
        try:
            found = self.scorers[version] = self.loader(version)
        except SigningError as exc:
            self.unavailable[version] = f"{_REFUSED}{exc}"
        except Exception as exc:  # any unreadable artifact: the version is unavailable
            self.unavailable[version] = f"did not load: {type(exc).__name__}: {exc}"
        return found

    def servable(self, version: int) -> bool:
        """Whether routing may use ``version`` here: the settings say the scoring model serves
        it (as for the router) and its session loads (verified, where keys are configured)."""
        return self.settings.routing.serves(version) and self.scorer(version) is not None

    def score(self, version: int, features: NDArray[np.float32]) -> NDArray[Any]:
        """The routing `SyncScorer`: ONNX Runtime here; ModelCallError if unavailable."""
        scorer = self.scorer(version)
        if scorer is None:
            raise ModelCallError(f"version {version} unavailable: {self.unavailable[version]}")
        return scorer.infer(features)

    def _rescorer(self, routed: RoutedScores, width: int) -> Rescorer:
        """Stacked pairs re-scored by the version that scored their order; orders on the
        rule-based fallback (version 0) or whose version fails keep their objectives."""

        def rescore(rows: NDArray[np.int64], features: NDArray[np.float32]) -> NDArray[np.float32]:
            out = routed.objectives[rows].copy()
            versions = routed.model_version[rows // width]
            for version in np.unique(versions[versions > 0]).tolist():
                mask = versions == version
                try:
                    out[mask] = self.score(int(version), features[mask])
                except ModelCallError:
                    continue
            return out

        return rescore

    def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> FusedResult:
        """One window's tensors (`dispatch`'s inputs) -> `dispatch`'s outputs."""
        started = time.perf_counter()
        encoded = self.encoder.run(inputs)
        encoded_at = time.perf_counter()
        user_ids = inputs.get(_USER_IDS)
        if user_ids is None:  # the encoder has already rejected this; kept for the type
            raise DispatchInputError(_USER_IDS, "is required but missing", "missing")
        served = ServedVersions(self.servable)
        routing, versions = route_window(
            user_ids, inputs.get(MODEL_VERSION_TAG.name), self.settings.routing, served
        )
        routed = route_and_score_now(
            encoded[PAIR_FEATURES.name],
            encoded[CANDIDATE_RIDER_INDEX.name],
            versions,
            routing,
            self.score,
            shadow=shadow_sampled(self.draw(), routing),
            served=served,
        )
        scored_at = time.perf_counter()
        resolver_inputs = {**inputs, **encoded, PAIR_OBJECTIVES.name: routed.objectives}
        if self.stack_aware:
            width = encoded[CANDIDATE_RIDER_INDEX.name].shape[1]
            resolved = self.resolver.run_stack_aware(
                resolver_inputs, self._rescorer(routed, width)
            ).resolution.as_tensors()
        else:
            resolved = self.resolver.run(resolver_inputs)
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
