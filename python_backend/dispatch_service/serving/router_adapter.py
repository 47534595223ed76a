"""The Triton bridge of `dispatch_router`: tensors in, BLS calls of dispatch_model, tensors out.

The routing decisions, fallback chain and shadow comparison are `routing`'s; this module only
reads the request tensors, calls a `dispatch_model` version through BLS
(``pb_utils.InferenceRequest(model_name="dispatch_model", model_version=N)``, awaited with
``async_exec`` so that the calls of different versions overlap; one call per version for all
the windows of an `execute`, `routing.route_and_score_many`), records the metrics and answers.
``pb_utils`` is passed in because it only exists inside the backend stub.

The node's settings are parsed once per load from config.pbtxt ``parameters``
(`RouterSettings.from_parameters`, with the initial routing); a config-override load
(`router_control.apply_router_settings`) builds a new instance with new node settings and
logs them as one JSON line, while the old instance drains. The routing comes from the
launcher's file, read when it changes (`routing.live`). A request's
answer never depends on anything but the settings and the request: no state between calls.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
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
    ROUTER_INPUTS,
    WINDOW_CITY,
)
from dispatch_service.core.batches import batched_outcomes
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.log_text import without_values
from dispatch_service.core.metrics import (
    VALIDATION_REJECTIONS,
    MetricsSink,
)
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.repository_layout import ENCODER_MODEL, model_layout
from dispatch_service.core.settings import load_settings
from dispatch_service.domain.cities import CitySettings, default_registry
from dispatch_service.domain.window_wire import user_ids_from_wire
from dispatch_service.routing.engine import RoutedScores, RouteItem, route_and_score_many
from dispatch_service.routing.live import LiveRouting
from dispatch_service.routing.metrics import ROUTER_METRICS, routed_observations
from dispatch_service.routing.policy import ServedVersions, route_window
from dispatch_service.routing.settings import (
    ROUTER_MODEL_NAME,
    SCORING_MODEL_NAME,
    RouterSettings,
    settings_record,
)
from dispatch_service.routing.shadow import shadow_sampled
from dispatch_service.serving.backend_log import log_event
from dispatch_service.serving.bls import scored_objectives, scoring_request
from dispatch_service.serving.live_routing import follow_live_routing, live_routing_file
from dispatch_service.serving.probe import is_probe
from dispatch_service.serving.responder import TritonResponder
from dispatch_service.serving.stub_setup import prepare_stub
from dispatch_service.serving.triton_metrics import triton_metrics

__all__ = [
    "ROUTER_MODEL_NAME",
    "DispatchRouterAdapter",
    "log_failed_calls",
    "registered_cities",
    "router_adapter_for",
    "router_metrics",
]

_INPUT_NAMES: Final = tuple(spec.name for spec in ROUTER_INPUTS)
# A window's routed scores and the id of its city (None: it came without one).
Routed = tuple[RoutedScores, str | None]


class DispatchRouterAdapter(TritonResponder):
    """Answers dispatch_router requests; one instance per Triton model instance."""

    def __init__(
        self,
        pb_utils: Any,
        model_name: str,
        settings: RouterSettings,
        *,
        metrics: MetricsSink | None = None,
        draw: Callable[[], float] = random.random,
        target_model: str = SCORING_MODEL_NAME,
        version: str = "",
        instance: str = "",
        cities: Collection[str] | None = None,
        routing_file: str = "",
    ) -> None:
        super().__init__(pb_utils, model_name, version=version, instance=instance, metrics=metrics)
        self.draw = draw  # uniform [0, 1): the shadow sample
        self.target_model = target_model
        # The registry's city ids: the WINDOW_CITY values routed (and metrics labels).
        self.cities = frozenset(default_registry().ids if cities is None else cities)
        self.check_routing(settings)  # a route for no registered city: no load
        # The initial routing (``settings``) until the launcher's file says otherwise.
        self.live = LiveRouting(routing_file, settings, self.check_routing)

    @property
    def settings(self) -> RouterSettings:
        """The routing in force (the initial routing, or the launcher's file's: `routing.live`)."""
        return self.live.settings

    def check_routing(self, settings: RouterSettings) -> None:
        """ValueError when ``settings`` route a city this instance does not serve."""
        settings.check_cities(sorted(self.cities))

    # ---- Triton entry points ---------------------------------------------------------------

    async def execute(self, requests: Sequence[Any]) -> list[Any]:
        """The windows of one execute routed together: each by its own plan, the calls of
        one version made as one BLS call over all their rows (`route_and_score_many`); each
        request answered on its own."""
        read = self.read_batch(requests, _INPUT_NAMES)
        try:
            outcomes = await self.route_batch(read.windows)
        except Exception as exc:
            outcomes = [exc] * len(read.windows)
        return self.answer_outcomes(requests, read, outcomes, self._answer)

    async def route_batch(
        self, windows: Sequence[dict[str, NDArray[Any] | None]]
    ) -> list[Routed | Exception]:
        """Each window's routed scores and city, or the exception it alone raised."""
        settings = follow_live_routing(
            self.pb, self.live, model=self.model_name, instance=self.instance
        )
        items: list[tuple[RouteItem, str | None] | Exception] = []
        for inputs in windows:
            try:
                items.append(self._item(inputs, settings))
            except Exception as exc:  # this window's own error
                items.append(exc)
        ready = [item for item in items if not isinstance(item, Exception)]
        routed = await route_and_score_many([item for item, _ in ready], self.score)
        outcomes: list[Routed | Exception] = [
            scores if isinstance(scores, Exception) else (scores, city)
            for scores, (_, city) in zip(routed, ready, strict=True)
        ]
        return batched_outcomes(items, lambda _: outcomes)  # each failed window keeps its place

    # ---- one window -----------------------------------------------------------------------

    @staticmethod
    def _required(inputs: dict[str, NDArray[Any] | None], name: str) -> NDArray[Any]:
        value = inputs[name]
        if value is None:
            raise DispatchInputError(name, "is required but missing", "missing")
        return value

    def _item(
        self, inputs: dict[str, NDArray[Any] | None], routing: RouterSettings
    ) -> tuple[RouteItem, str | None]:
        """The window's routing decision (versions per order with its city's settings,
        shadow drawn) and its city."""
        served = ServedVersions(routing.serves)
        city = self._city(inputs[WINDOW_CITY.name])
        settings, versions = route_window(
            user_ids_from_wire(inputs), inputs[MODEL_VERSION_TAG.name], routing, served, city
        )
        item = RouteItem(
            self._required(inputs, PAIR_FEATURES.name),
            self._required(inputs, CANDIDATE_RIDER_INDEX.name),
            versions,
            settings,
            shadow=shadow_sampled(self.draw(), settings),
            served=served,
        )
        return item, city

    def _city(self, value: NDArray[Any] | None) -> str | None:
        """WINDOW_CITY's city id (absent or empty: None); one the registry does not hold is
        refused (DispatchInputError), so the `city` label stays bounded."""
        if value is None:
            return None
        items = np.asarray(value, dtype=object).reshape(-1)
        if items.size != 1:
            raise DispatchInputError(
                WINDOW_CITY.name, f"must have shape [1], got {items.size} values", "shape"
            )
        raw = items[0]
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
        if not text:
            return None
        if text not in self.cities:
            raise DispatchInputError(WINDOW_CITY.name, "names no registered city", "city")
        return text

    def _answer(self, request: Any, outcome: Routed) -> Any:
        routed, city = outcome
        self._report(request, routed, city)
        return self.response(
            {
                PAIR_OBJECTIVES.name: routed.objectives,
                ORDER_MODEL_VERSION.name: routed.model_version,
                ORDER_FALLBACK_LEVEL.name: routed.fallback_level,
            }
        )

    async def score(self, version: int, features: NDArray[np.float32]) -> NDArray[Any]:
        """One BLS call of `version`; an error response raises ModelCallError."""
        call = scoring_request(self.pb, self.target_model, version, features)
        return scored_objectives(self.pb, await call.async_exec())

    # ---- reporting ------------------------------------------------------------------------

    def _report(self, request: Any, routed: RoutedScores, city: str | None) -> None:
        if not is_probe(request):  # the launcher's deep check is no user traffic
            self.record(routed_observations(routed, city=city))
        log_failed_calls(self, request, routed, self.target_model)


def log_failed_calls(
    responder: TritonResponder, request: Any, routed: RoutedScores, target: str
) -> None:
    """One warning line per failed version call of a routed request (never its payload;
    rate-limited with the responder's other per-request lines)."""
    for call in routed.calls:
        if call.error is not None:
            responder.log_request(
                "warn",
                request,
                "model_call_failed",
                target=target,
                target_version=call.version,
                role=call.role,
                orders=call.orders,
                error=without_values(call.error),
            )


def registered_cities(repository: Path) -> tuple[str, ...]:
    """The ids of the city registry the repository's feature_encoder serves (its
    ``city_registry`` parameter; the shipped registry without one)."""
    encoder = model_layout(repository, ENCODER_MODEL).config
    parameters = config_parameters(encoder) if encoder.is_file() else {}
    return load_settings(CitySettings, parameters).registry().ids


def router_metrics(pb_utils: Any, model_name: str, version: str) -> MetricsSink:
    """The router's custom metrics (per-process series, see `triton_metrics.triton_metrics`)."""
    return triton_metrics(pb_utils, model_name, version, (*ROUTER_METRICS, VALIDATION_REJECTIONS))


def router_adapter_for(pb_utils: Any, args: dict[str, str]) -> DispatchRouterAdapter:
    """Build the adapter from Triton's `initialize` args and log the settings it runs with.

    Bad settings raise (SettingsError / ValueError), which fails the load: Triton then keeps
    the previous router serving.
    """
    settings = RouterSettings.from_parameters(prepare_stub(pb_utils, args))
    name = args["model_name"]
    version = str(args.get("model_version", ""))
    instance = str(args.get("model_instance_name", ""))
    repository = args.get("model_repository")
    adapter = DispatchRouterAdapter(
        pb_utils,
        name,
        settings,
        metrics=router_metrics(pb_utils, name, version),
        version=version,
        instance=instance,
        cities=registered_cities(Path(repository).parent) if repository else None,
        routing_file=live_routing_file(),
    )
    follow_live_routing(pb_utils, adapter.live, model=name, instance=instance)
    adapter.loaded()
    log_event(
        pb_utils,
        "info",
        **settings_record(settings, model=name, version=version, instance=instance),
    )
    return adapter
