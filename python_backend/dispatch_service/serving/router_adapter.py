"""The Triton bridge of `dispatch_router`: tensors in, BLS calls of dispatch_model, tensors out.

The routing decisions, fallback chain and shadow comparison are `routing`'s; this module only
reads the request tensors, calls a `dispatch_model` version through BLS
(``pb_utils.InferenceRequest(model_name="dispatch_model", model_version=N)``, awaited with
``async_exec`` so that the calls of different versions overlap; one call per version for all
the windows of an `execute`, `routing.route_and_score_many`), records the metrics and answers.
``pb_utils`` is passed in because it only exists inside the backend stub.

Settings are parsed once per load from config.pbtxt ``parameters`` (`RouterSettings`); a
config-override load (`router_control.apply_router_settings`) builds a new instance with the
new settings and logs them as one JSON line, while the old instance drains. A request's
answer never depends on anything but the settings and the request: no state between calls.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
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
)
from dispatch_service.core.batches import together
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.metrics import (
    VALIDATION_REJECTIONS,
    MetricsSink,
)
from dispatch_service.core.settings import parameters_from_model_config
from dispatch_service.domain.window import user_ids_from_wire
from dispatch_service.routing.engine import RoutedScores, RouteItem, route_and_score_many
from dispatch_service.routing.metrics import ROUTER_METRICS, routed_observations
from dispatch_service.routing.policy import ServedVersions, route_window
from dispatch_service.routing.settings import (
    ROUTER_MODEL_NAME,
    SCORING_MODEL_NAME,
    RouterSettings,
    settings_record,
)
from dispatch_service.routing.shadow import shadow_sampled
from dispatch_service.serving.triton_adapter import (
    TritonResponder,
    log_event,
    scored_objectives,
    scoring_request,
    triton_metrics,
)

__all__ = [
    "ROUTER_MODEL_NAME",
    "DispatchRouterAdapter",
    "log_failed_calls",
    "router_adapter_for",
    "router_metrics",
]

_INPUT_NAMES: Final = tuple(spec.name for spec in ROUTER_INPUTS)


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
    ) -> None:
        super().__init__(pb_utils, model_name, version=version, instance=instance, metrics=metrics)
        self.settings = settings
        self.draw = draw  # uniform [0, 1): the shadow sample
        self.target_model = target_model

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
    ) -> list[RoutedScores | Exception]:
        """Each window's routed scores, or the exception it alone raised."""
        items: list[RouteItem | Exception] = []
        for inputs in windows:
            try:
                items.append(self._item(inputs))
            except Exception as exc:  # this window's own error
                items.append(exc)
        ready = [item for item in items if not isinstance(item, Exception)]
        routed = await route_and_score_many(ready, self.score)
        return together(items, lambda _: routed)  # each failed window keeps its place

    # ---- one window -----------------------------------------------------------------------

    @staticmethod
    def _required(inputs: dict[str, NDArray[Any] | None], name: str) -> NDArray[Any]:
        value = inputs[name]
        if value is None:
            raise DispatchInputError(name, "is required but missing", "missing")
        return value

    def _item(self, inputs: dict[str, NDArray[Any] | None]) -> RouteItem:
        """The window's routing decision (versions per order, shadow drawn)."""
        served = ServedVersions(self.settings.serves)
        settings, versions = route_window(
            user_ids_from_wire(inputs), inputs[MODEL_VERSION_TAG.name], self.settings, served
        )
        return RouteItem(
            self._required(inputs, PAIR_FEATURES.name),
            self._required(inputs, CANDIDATE_RIDER_INDEX.name),
            versions,
            settings,
            shadow=shadow_sampled(self.draw(), settings),
            served=served,
        )

    def _answer(self, request: Any, routed: RoutedScores) -> Any:
        self._report(request, routed)
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

    def _report(self, request: Any, routed: RoutedScores) -> None:
        self.record(routed_observations(routed))
        log_failed_calls(self.pb, self.model_name, request, routed, self.target_model)


def log_failed_calls(
    pb_utils: Any, model_name: str, request: Any, routed: RoutedScores, target: str
) -> None:
    """One warning line per failed version call of a routed request (never its payload)."""
    for call in routed.calls:
        if call.error is not None:
            log_event(
                pb_utils,
                "warn",
                event="model_call_failed",
                model=model_name,
                request_id=request.request_id(),
                target=target,
                target_version=call.version,
                role=call.role,
                orders=call.orders,
                error=call.error,
            )


def router_metrics(pb_utils: Any, model_name: str, version: str) -> MetricsSink:
    """The router's custom metrics (per-process series, see `triton_adapter.triton_metrics`)."""
    return triton_metrics(pb_utils, model_name, version, (*ROUTER_METRICS, VALIDATION_REJECTIONS))


def router_adapter_for(pb_utils: Any, args: dict[str, str]) -> DispatchRouterAdapter:
    """Build the adapter from Triton's `initialize` args and log the settings it runs with.

    Bad settings raise (SettingsError / ValueError), which fails the load: Triton then keeps
    the previous router serving.
    """
    settings = RouterSettings.from_parameters(parameters_from_model_config(args["model_config"]))
    name = args["model_name"]
    version = str(args.get("model_version", ""))
    instance = str(args.get("model_instance_name", ""))
    adapter = DispatchRouterAdapter(
        pb_utils,
        name,
        settings,
        metrics=router_metrics(pb_utils, name, version),
        version=version,
        instance=instance,
    )
    adapter.loaded()
    log_event(
        pb_utils,
        "info",
        **settings_record(settings, model=name, version=version, instance=instance),
    )
    return adapter
