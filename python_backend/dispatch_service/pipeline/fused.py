"""The whole dispatch in one process: encode, score with the routed version, resolve.

Why it exists: every Python-backend model is its own process, and a request through the
`dispatch` ensemble crosses four of them (feature_encoder, dispatch_router, dispatch_model
through BLS, topk_resolver). On a small window those hops cost several times the work
itself (`make bench` measures both). `dispatch_fused` runs the same steps, configured from
the same config.pbtxt files, with the same per-order (and per-city) canary routing, shadow scoring
and fallback chain (`routing.route_and_score_many_sync`: the router's routing of a batch,
with the versions scored in process and no event loop), in one model instance: the same
answer as `dispatch` for the same window and settings, at the cost of one hop.

What it gives up: the scored versions are ONNX Runtime sessions inside this model, read from
``<repository>/<scoring_model>/<version>/model.onnx``, not Triton-managed `dispatch_model`
versions. What it may score is the same as the router's: the versions the settings say the
scoring model serves (``scoring_versions``: a fleet revision's versions, read by both models
from the launcher's live routing file), so a tag naming any served version gets that version from
both entry points and a canary that is not served is out of routing in both
(`policy.route_window`). The sessions of the stable version, the canary and every other
served version load with the model (a version the settings do not name loads on its first
request). With trusted keys (verification configured) each version folder is verified
before its session is built from the verified bytes: a refused stable version fails the load, a
refused canary (or other version) is unavailable here, which takes it out of routing instead
of refusing the model. `router_control.apply_router_settings` reloads this model with the
router's node settings (both or neither).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    CANDIDATE_RIDER_INDEX,
    MODEL_VERSION_TAG,
    ORDER_FALLBACK_LEVEL,
    ORDER_FIELDS,
    ORDER_LOCATION_SOURCE,
    ORDER_MODEL_VERSION,
    PAIR_FEATURES,
    PAIR_OBJECTIVES,
    WINDOW_CITY,
)
from dispatch_service.core.batches import batched_outcomes
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.repository_layout import model_layout
from dispatch_service.core.settings import load_settings, reject_unknown
from dispatch_service.core.signing import SigningError, TrustedKeys
from dispatch_service.domain.cities import City
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.domain.window_wire import user_ids_from_wire
from dispatch_service.pipeline.dispatch_pipeline import repository_steps
from dispatch_service.pipeline.encoder_step import FeatureEncoderStep
from dispatch_service.pipeline.onnx_runner import OnnxScorer, OrtSettings, version_scorer
from dispatch_service.pipeline.plain_routing import PlainWindow, routed_alone, routed_together
from dispatch_service.pipeline.resolver_step import TopKResolverStep
from dispatch_service.pipeline.small_window import resolved_one_order
from dispatch_service.pipeline.step_io import Arrays
from dispatch_service.routing.engine import (
    ModelCallError,
    RoutedScores,
    RouteItem,
    route_and_score_many_sync,
    route_and_score_sync,
)
from dispatch_service.routing.policy import ServedVersions, route_window
from dispatch_service.routing.settings import FusedSettings, RouterSettings
from dispatch_service.routing.shadow import shadow_sampled

__all__ = [
    "FusedDispatch",
    "FusedResult",
]

_REFUSED: Final = "refused by signature verification: "


@dataclass(frozen=True)
class FusedResult:
    """One answered window, with what the metrics need."""

    outputs: Arrays
    encoded: Arrays
    routed: RoutedScores
    encode_ms: float
    resolve_ms: float
    city: str | None = None  # the registry id of the city serving the window
    # What a decision record reads besides (`outcomes`): the validated window and the
    # request's objective weights (a copy; None: the defaults).
    window: DispatchWindow | None = None
    weights: NDArray[Any] | None = None


VersionLoader = Callable[[int], OnnxScorer]


@dataclass(frozen=True)
class _Prepared:
    """One window of a batch after encoding, with its routing decision, before scoring."""

    encoded: Arrays
    window: DispatchWindow  # validated by the encoder; the resolver reads its rider counts
    city: City  # the city serving the window: its routing settings
    routing: RouterSettings
    versions: NDArray[np.int32]
    served: ServedVersions
    encode_ms: float


# One-order windows share an execute's steps from this many on: below it the shared steps'
# fixed cost is more than `run`'s straight path saves (medium windows cost less shared from
# 2 on; the measurement is in the commit that set it).
_SHARED_FROM: Final = 5


def _one_order(inputs: Mapping[str, NDArray[Any] | None]) -> bool:
    """Whether a window's ORDER_FIELDS has one row (as sent; its checks come later)."""
    fields = inputs.get(ORDER_FIELDS.name)
    return fields is not None and fields.ndim == 2 and fields.shape[0] == 1


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
    # A one-order window's stages done directly where they apply (`small_window`: the
    # same answer in a fraction of the calls); off, every window takes the general steps.
    small_windows: bool = True

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
        scoring = model_layout(repository, settings.scoring_model)
        ort_parameters = config_parameters(scoring.config)
        reject_unknown(ort_parameters, OrtSettings)
        ort_settings = load_settings(OrtSettings, ort_parameters)

        def loader(version: int) -> OnnxScorer:
            return version_scorer(scoring.version(version), ort_settings, trusted)

        encoder, resolver = repository_steps(repository)
        settings.routing.check_cities(encoder.cities.ids)  # routes for registered cities only
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

    def check_routing(self, routing: RouterSettings) -> None:
        """ValueError when ``routing`` routes a city the encoder's registry does not hold."""
        routing.check_cities(self.encoder.cities.ids)

    def route_by(self, routing: RouterSettings) -> None:
        """Serve ``routing`` from now on (a live change, `routing.live`); the versions it
        names are loaded now, not by the first window that needs one."""
        if routing == self.settings.routing:
            return
        self.settings = replace(self.settings, routing=routing)
        for version in self.settings.served_versions():
            self.scorer(version)

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

    def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> FusedResult:
        """One window's tensors (`dispatch`'s inputs) -> `dispatch`'s outputs."""
        started = time.perf_counter()
        window, city, encoded = self.encoder.encode(inputs, small_windows=self.small_windows)
        encoded_at = time.perf_counter()
        served = ServedVersions(self.servable)
        routing, versions = route_window(
            user_ids_from_wire(inputs), inputs.get(MODEL_VERSION_TAG.name),
            self.settings.routing, served, city.id,
        )  # fmt: skip
        features, candidates = encoded[PAIR_FEATURES.name], encoded[CANDIDATE_RIDER_INDEX.name]
        shadow = shadow_sampled(self.draw(), routing)
        routed = (
            routed_alone(
                PlainWindow(features, candidates, versions, bool(routing.cpu_scoring), served),
                score=self.score,
                clock=time.perf_counter,
            )
            if self.small_windows and not shadow
            else None
        ) or route_and_score_sync(
            features, candidates, versions, routing, self.score, shadow=shadow, served=served
        )
        scored_at = time.perf_counter()
        resolved = (
            resolved_one_order(
                inputs, candidates, routed.objectives, window, self.resolver.settings
            )
            if self.small_windows
            else None
        ) or self.resolver.run(_resolver_inputs(inputs, encoded, routed), window, self.score)
        resolve_ms = (time.perf_counter() - scored_at) * 1000.0
        encode_ms = (encoded_at - started) * 1000.0
        return _result(
            encoded,
            routed,
            resolved,
            encode_ms=encode_ms,
            resolve_ms=resolve_ms,
            city=city.id,
            window=window,
            weights=inputs.get("OBJECTIVE_WEIGHTS"),
        )

    # ---- several windows of one execute ------------------------------------------------------

    def run_batch(
        self, batch: Sequence[Mapping[str, NDArray[Any] | None]]
    ) -> list[FusedResult | Exception]:
        """Several windows (one Triton `execute`) at once: the windows are validated, given
        their candidates and their pair features together (`FeatureEncoderStep.encode_batch`),
        each is routed by its own plan with the calls of one version made as one ONNX Runtime
        call over all the windows' rows (`route_and_score_many_sync`), and the windows are
        checked and, where nothing stacks, ranked and assigned together
        (`TopKResolverStep.run_batch`); a window whose riders can stack is resolved on its own.

        Returns per window, in order, its result or the exception it alone raised
        (DispatchInputError for bad input): one bad window never fails the others. Each
        answer is `run`'s for that window, byte for byte: ONNX Runtime scores every pair row
        on its own, and a joined call that fails is made again for each window alone.

        A batch of one, or of fewer than `_SHARED_FROM` one-order windows with the straight
        path on, is run window by window: sharing the steps costs more than it saves there.
        """
        if len(batch) == 1 or (
            self.small_windows and len(batch) < _SHARED_FROM and all(map(_one_order, batch))
        ):
            return [self._run_alone(inputs) for inputs in batch]
        started = time.perf_counter()
        encoded = self.encoder.encode_batch(batch)
        # The pair features were built for the whole batch: each window is charged its share.
        encode_ms = (time.perf_counter() - started) * 1000.0 / max(len(batch), 1)
        prepared: list[_Prepared | Exception] = []
        for inputs, outcome in zip(batch, encoded, strict=True):
            if isinstance(outcome, Exception):
                prepared.append(outcome)
                continue
            try:
                prepared.append(self._prepare(inputs, *outcome, encode_ms))
            except Exception as exc:  # this window's own error
                prepared.append(exc)
        routed = self._route_together(prepared)
        good = [
            (inputs, entry) for inputs, entry in zip(batch, routed, strict=True)
            if not isinstance(entry, Exception)
        ]  # fmt: skip
        started = time.perf_counter()
        resolved = iter(
            self.resolver.run_batch(
                [
                    (_resolver_inputs(inputs, ready.encoded, scores), ready.window, self.score)
                    for inputs, (ready, scores) in good
                ]
            )
        )
        # The windows where nothing stacks were resolved together: each is charged its share.
        resolve_ms = (time.perf_counter() - started) * 1000.0 / max(len(good), 1)
        results: list[FusedResult | Exception] = []
        for inputs, entry in zip(batch, routed, strict=True):
            if isinstance(entry, Exception):
                results.append(entry)
                continue
            ready, scores = entry
            answer = next(resolved)
            results.append(
                answer
                if isinstance(answer, Exception)
                else _result(
                    ready.encoded,
                    scores,
                    answer,
                    encode_ms=ready.encode_ms,
                    resolve_ms=resolve_ms,
                    city=ready.city.id,
                    window=ready.window,
                    weights=inputs.get("OBJECTIVE_WEIGHTS"),
                )
            )
        return results

    def _run_alone(self, inputs: Mapping[str, NDArray[Any] | None]) -> FusedResult | Exception:
        try:
            return self.run(inputs)
        except Exception as exc:  # this window's own error
            return exc

    def _prepare(
        self,
        inputs: Mapping[str, NDArray[Any] | None],
        window: DispatchWindow,
        city: City,
        encoded: Arrays,
        encode_ms: float,
    ) -> _Prepared:
        served = ServedVersions(self.servable)
        routing, versions = route_window(
            user_ids_from_wire(inputs), inputs.get(MODEL_VERSION_TAG.name),
            self.settings.routing, served, city.id,
        )  # fmt: skip
        return _Prepared(encoded, window, city, routing, versions, served, encode_ms)

    def _route_together(
        self, prepared: Sequence[_Prepared | Exception]
    ) -> list[tuple[_Prepared, RoutedScores] | Exception]:
        """The prepared windows' routing, the calls of one version made as one session call
        over all their rows (`route_and_score_many_sync`); each window's outcome in order."""

        def route(ready: list[_Prepared]) -> list[tuple[_Prepared, RoutedScores] | Exception]:
            shadows = [shadow_sampled(self.draw(), item.routing) for item in ready]
            plain = (
                routed_together(
                    [
                        PlainWindow(
                            item.encoded[PAIR_FEATURES.name],
                            item.encoded[CANDIDATE_RIDER_INDEX.name],
                            item.versions,
                            bool(item.routing.cpu_scoring),
                            item.served,
                        )
                        for item in ready
                    ],
                    score=self.score,
                    clock=time.perf_counter,
                )
                if self.small_windows and not any(shadows)
                else None
            )
            if plain is not None:
                return list(zip(ready, plain, strict=True))
            items = [
                RouteItem(
                    item.encoded[PAIR_FEATURES.name],
                    item.encoded[CANDIDATE_RIDER_INDEX.name],
                    item.versions,
                    item.routing,
                    shadow=shadow,
                    served=item.served,
                )
                for item, shadow in zip(ready, shadows, strict=True)
            ]
            routed = route_and_score_many_sync(items, self.score)
            return [
                outcome if isinstance(outcome, Exception) else (item, outcome)
                for item, outcome in zip(ready, routed, strict=True)
            ]

        return batched_outcomes(prepared, route)


def _result(
    encoded: Arrays,
    routed: RoutedScores,
    resolved: Arrays,
    *,
    encode_ms: float,
    resolve_ms: float,
    city: str,
    window: DispatchWindow,
    weights: NDArray[Any] | None,
) -> FusedResult:
    """`dispatch`'s outputs of one window: the resolver's answer, each order's version and
    fallback level, where its points came from and the city that served it."""
    return FusedResult(
        outputs={
            **resolved,
            ORDER_MODEL_VERSION.name: routed.model_version,
            ORDER_FALLBACK_LEVEL.name: routed.fallback_level,
            ORDER_LOCATION_SOURCE.name: encoded[ORDER_LOCATION_SOURCE.name],
            WINDOW_CITY.name: encoded[WINDOW_CITY.name],
        },
        encoded=encoded,
        routed=routed,
        encode_ms=encode_ms,
        resolve_ms=resolve_ms,
        city=city,
        window=window,
        weights=None if weights is None else np.array(weights, copy=True),
    )


def _resolver_inputs(
    inputs: Mapping[str, NDArray[Any] | None], encoded: Arrays, routed: RoutedScores
) -> dict[str, NDArray[Any] | None]:
    """What `topk_resolver` gets in the ensemble: the window, the encoder's pairs and the
    router's objectives and versions (stack-aware re-scoring reads the last two)."""
    return {
        **inputs,
        **encoded,
        PAIR_OBJECTIVES.name: routed.objectives,
        ORDER_MODEL_VERSION.name: routed.model_version,
    }
