"""The Triton bridge of `dispatch_fused` and of its priority lane `dispatch_priority` (the same
model on stubs of its own): a window's tensors in, `dispatch`'s answer out.

The work is `fused.FusedDispatch`'s; this module reads the request tensors, records the
metrics the encoder, router and resolver record in the ensemble (same families, labelled
with this model's name; recorded off the request path, `metrics.BackgroundMetrics`) and
answers each request on its own: a bad window gets its own INVALID_ARG response and never
fails the other requests of the call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dispatch_contract import DISPATCH_ENSEMBLE_INPUTS
from dispatch_service.core.metrics import (
    CANDIDATES_PER_ORDER,
    CAPACITY_CONFLICTS,
    DECISION_RECORDS,
    ENCODER_LATENCY,
    RESOLVER_LATENCY,
    VALIDATION_REJECTIONS,
    MetricsSink,
    Observation,
)
from dispatch_service.core.repository_layout import PRIORITY_MODEL
from dispatch_service.geocoding.metrics import GEOCODING_METRICS
from dispatch_service.outcomes.writer import DecisionWriter
from dispatch_service.pipeline.drift import DRIFT_METRICS, DriftMonitor, drift_monitor
from dispatch_service.pipeline.fused import FusedDispatch, FusedResult
from dispatch_service.pipeline.step_metrics import encoder_observations, resolver_observations
from dispatch_service.routing.live import LiveRouting
from dispatch_service.routing.metrics import (
    FUSED_ROUTING_METRICS,
    FUSED_SCORING_LATENCY,
    routed_observations,
)
from dispatch_service.routing.settings import FusedSettings, settings_record
from dispatch_service.serving.backend_log import log_event
from dispatch_service.serving.decision_log import (
    decision_writer,
    fused_answered_window,
    log_decision,
)
from dispatch_service.serving.drain import DrainGate, draining_responses
from dispatch_service.serving.live_routing import follow_live_routing, live_routing_file
from dispatch_service.serving.probe import is_probe
from dispatch_service.serving.responder import TritonResponder
from dispatch_service.serving.router_adapter import log_failed_calls
from dispatch_service.serving.stub_setup import prepare_stub
from dispatch_service.serving.triton_metrics import triton_metrics
from dispatch_service.serving.trust import (
    PRIORITY_REFUSED,
    PriorityEntitlement,
    model_trust,
    priority_entitlement,
)

__all__ = [
    "FUSED_METRICS",
    "FusedDispatchAdapter",
    "fused_adapter_for",
    "fused_observations",
]

FUSED_METRICS = (
    ENCODER_LATENCY,
    CANDIDATES_PER_ORDER,
    RESOLVER_LATENCY,
    CAPACITY_CONFLICTS,
    *FUSED_ROUTING_METRICS,
    DECISION_RECORDS,
    VALIDATION_REJECTIONS,
    *GEOCODING_METRICS,
    *DRIFT_METRICS,
)


class FusedDispatchAdapter(TritonResponder):
    """Answers dispatch_fused requests; one instance per Triton model instance."""

    # An entry point: closed while the server drains (`serving.drain`).
    drain_gate: DrainGate = DrainGate.from_environ()

    def __init__(
        self,
        pb_utils: Any,
        model_name: str,
        dispatch: FusedDispatch,
        *,
        metrics: MetricsSink | None = None,
        version: str = "",
        instance: str = "",
        routing_file: str = "",
        drift: DriftMonitor | None = None,
    ) -> None:
        super().__init__(pb_utils, model_name, version=version, instance=instance, metrics=metrics)
        self.dispatch = dispatch
        # The priority lane's: only windows sent with the priority key (`serving.trust`).
        self.entitlement: PriorityEntitlement | None = None
        # Triton's warm-up executions, which carry no key, come first, before the instance
        # takes any client's window (`warmup_executions`).
        self.warmup_left = 0
        # Decision records, off the request path (`serving.decision_log`); None: off.
        self.decisions: DecisionWriter | None = None
        self.drift = drift  # counts scored pairs per reference bin (`pipeline.drift`)
        self.input_names = tuple(spec.name for spec in DISPATCH_ENSEMBLE_INPUTS)
        # The initial routing until the launcher's file says otherwise (`routing.live`).
        self.live = (
            LiveRouting(routing_file, dispatch.settings.routing, dispatch.check_routing)
            if routing_file
            else None
        )

    def follow_routing(self) -> None:
        """Route by the launcher's file where it changed (one ``stat`` per `execute`)."""
        if self.live is not None:
            self.dispatch.route_by(
                follow_live_routing(
                    self.pb, self.live, model=self.model_name, instance=self.instance
                )
            )

    def finalize(self) -> None:
        if self.decisions is not None:
            self.decisions.close()
        super().finalize()
        if self.drift is not None:
            self.drift.close()
        self.dispatch.encoder.close()

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        """The windows of one execute run as one batch (`FusedDispatch.run_batch`: pair
        features built and scored once per routed version); each request still gets its own
        answer or error. Refused UNAVAILABLE, unworked, while the server drains."""
        if self.drain_gate.closed():
            return draining_responses(self, requests)
        self.follow_routing()
        if self.entitlement is not None:
            if self.warmup_left <= 0:
                return self._answer_entitled(requests, self.entitlement)
            self.warmup_left -= 1  # Triton's warm-up: no key, and before any client's window
        return self.answer_batch(requests, self.input_names, self.dispatch.run_batch, self._answer)

    def _answer_entitled(
        self, requests: Sequence[Any], entitlement: PriorityEntitlement
    ) -> list[Any]:
        """The lane: a window without the priority key is refused INVALID_ARG, unworked (its
        check costs a hash, so a flood of them holds the lane's stubs briefly); the others
        run as one batch."""
        admitted = [entitlement.admits(request) for request in requests]
        chosen = [request for request, ok in zip(requests, admitted, strict=True) if ok]
        answers = iter(
            self.answer_batch(chosen, self.input_names, self.dispatch.run_batch, self._answer)
            if chosen
            else []
        )
        message = f"{self.model_name}: {PRIORITY_REFUSED}"
        code = self.pb.TritonError.INVALID_ARG
        return [
            next(answers) if ok else self.error(request, message, code)
            for request, ok in zip(requests, admitted, strict=True)
        ]

    def _answer(self, request: Any, result: FusedResult) -> Any:
        geocoding = self.dispatch.encoder.geocoder.observations()
        if not is_probe(request):  # the launcher's deep check is no user traffic
            self.record(fused_observations(result) + geocoding)
            log_decision(
                self.decisions,
                request,
                self.model_name,
                lambda request_id: fused_answered_window(request_id, self.model_name, result),
            )
            if self.drift is not None:
                self.drift.observe_routed(result.city, result.encoded, result.routed)
        log_failed_calls(self, request, result.routed, self.dispatch.settings.scoring_model)
        return self.response(result.outputs)


def warmup_executions(config: dict[str, Any]) -> int:
    """How many executions Triton runs on a new instance to warm it up: one per warm-up
    sample and count (a count of 0 runs it once), all before the instance is given any
    client's request."""
    return sum(max(1, int(sample.get("count", 0))) for sample in config.get("model_warmup", []))


def fused_observations(result: FusedResult) -> list[Observation]:
    """The encoder's, the router's and the resolver's observations of one answered window."""
    return [
        *encoder_observations(result.encoded, result.encode_ms),
        *routed_observations(result.routed, FUSED_SCORING_LATENCY, result.city),
        *resolver_observations(result.outputs, result.resolve_ms),
    ]


def fused_adapter_for(pb_utils: Any, args: dict[str, str]) -> FusedDispatchAdapter:
    """Build the adapter from Triton's `initialize` args; log the settings and any version
    it could not load (whose orders will take the fallback chain).

    Bad settings raise (SettingsError / ValueError), which fails the load.
    """
    settings = FusedSettings.from_parameters(prepare_stub(pb_utils, args))
    name = args["model_name"]
    version = str(args.get("model_version", ""))
    instance = str(args.get("model_instance_name", ""))
    repository = Path(args["model_repository"]).parent
    trusted = model_trust()
    dispatch = FusedDispatch.from_repository(repository, settings, trusted=trusted)
    metrics = triton_metrics(pb_utils, name, version, FUSED_METRICS)

    def no_reference(reason: str) -> None:
        log_event(pb_utils, "warn", event="drift_unmonitored", model=name, error=reason)

    adapter = FusedDispatchAdapter(
        pb_utils,
        name,
        dispatch,
        metrics=metrics,
        version=version,
        instance=instance,
        routing_file=live_routing_file(),
        drift=drift_monitor(
            repository, settings.scoring_model, metrics, trusted=trusted, on_error=no_reference
        ),
    )
    adapter.decisions = decision_writer(pb_utils, name, adapter.record)
    if name == PRIORITY_MODEL:
        adapter.entitlement = priority_entitlement()
        adapter.warmup_left = warmup_executions(json.loads(args["model_config"]))
    adapter.follow_routing()
    adapter.loaded()
    log_event(
        pb_utils,
        "info",
        **settings_record(settings.routing, model=name, version=version, instance=instance),
        scoring_model=settings.scoring_model,
    )
    for missing, reason in dispatch.unavailable.items():
        log_event(
            pb_utils,
            "warn",
            event="version_unavailable",
            model=name,
            instance=instance,
            target_version=missing,
            error=reason,
        )
    return adapter
