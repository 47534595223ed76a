"""The Triton models that run one pipeline step each: feature_encoder, topk_resolver and
dispatch_model.

Each `model.py` names its adapter class and builds it with `from_triton` from Triton's
`initialize` args: requests become numpy arrays, the step runs, arrays become response
tensors (`serving.responder`), and the model's custom metrics are recorded
(`pipeline.step_metrics`, `serving.triton_metrics`).

Each adapter imports its step's modules when its model loads (`from_triton`), not when this
module is imported: a stub loads only what its own model runs (geocoding and shapely for the
encoder, SciPy's graph matching for the encoder and the resolver, ONNX Runtime for the
scoring model). Imports are most of a stub's start-up CPU, paid by every stub at each server
start and restart (`tests/unit/serving/test_stub_imports.py`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import PAIR_OBJECTIVES
from dispatch_service.core.batches import isolated_outcomes
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.log_text import describe_error
from dispatch_service.core.metrics import MetricSpec, MetricsSink, Observation, StepObserver
from dispatch_service.core.repository_layout import (
    DISPATCH_ENSEMBLE,
    ENCODER_MODEL,
    RESOLVER_MODEL,
    SCORING_MODEL,
    ModelLayout,
)
from dispatch_service.geocoding.metrics import GEOCODING_METRICS
from dispatch_service.pipeline.step_io import Arrays, Step
from dispatch_service.pipeline.step_metrics import STEP_OBSERVERS, encoder_observations, metrics_of
from dispatch_service.routing.engine import ModelCallError
from dispatch_service.routing.settings import SCORING_MODEL_NAME
from dispatch_service.serving.bls import scored_objectives, scoring_request
from dispatch_service.serving.decision_log import (
    decision_writer,
    log_decision,
    resolver_answered_window,
)
from dispatch_service.serving.drain import DrainGate, draining_responses
from dispatch_service.serving.probe import is_probe
from dispatch_service.serving.responder import ReadBatch, TritonResponder
from dispatch_service.serving.stub_setup import prepare_stub
from dispatch_service.serving.triton_metrics import triton_metrics
from dispatch_service.serving.trust import model_trust

if TYPE_CHECKING:
    from dispatch_service.outcomes.writer import DecisionWriter
    from dispatch_service.pipeline.encoder_step import FeatureEncoderStep
    from dispatch_service.pipeline.model_step import DispatchModelStep
    from dispatch_service.pipeline.resolver_step import TopKResolverStep

__all__ = [
    "TritonBatchedModelAdapter",
    "TritonEncoderAdapter",
    "TritonLoad",
    "TritonResolverAdapter",
    "TritonStepAdapter",
    "with_instance_device",
]


@dataclass(frozen=True)
class TritonLoad:
    """What Triton's `initialize` args say about the instance being loaded."""

    name: str
    version: str
    instance: str
    parameters: dict[str, str]
    layout: ModelLayout  # the model's folder in the served repository

    @classmethod
    def read(cls, pb_utils: Any, args: Mapping[str, str]) -> TritonLoad:
        """The args read, after the stub's first steps (`stub_setup.prepare_stub`)."""
        parameters = prepare_stub(pb_utils, args)
        return cls(
            name=args["model_name"],
            version=str(args.get("model_version", "")),
            instance=str(args.get("model_instance_name", "")),
            parameters=parameters,
            layout=ModelLayout(Path(args.get("model_repository", ""))),
        )

    def metrics(self, pb_utils: Any, definitions: Sequence[MetricSpec]) -> MetricsSink:
        return triton_metrics(pb_utils, self.name, self.version, definitions)


class TritonStepAdapter(TritonResponder):
    """Runs a `Step` for the windows of one `execute` (`run_batch`: each on its own here; a
    step that shares work across windows overrides it), each request answered on its own."""

    def __init__(
        self,
        pb_utils: Any,
        model_name: str,
        step: Step,
        *,
        version: str = "",
        instance: str = "",
        metrics: MetricsSink | None = None,
        observer: StepObserver | None = None,
    ) -> None:
        super().__init__(pb_utils, model_name, version=version, instance=instance, metrics=metrics)
        self.step = step
        self.observer = observer

    def finalize(self) -> None:
        super().finalize()
        close = getattr(self.step, "close", None)  # the encoder's: its geocoder's event-loop thread
        if callable(close):
            close()

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        """`run_batch` over the requests' windows (`answer_batch`); each answered window's
        latency is its share of the execute."""
        started = time.perf_counter()
        count = max(len(requests), 1)

        def answer(request: Any, outputs: Arrays) -> Any:
            if self.observer is not None and not is_probe(request):
                elapsed_ms = (time.perf_counter() - started) * 1000.0 / count
                self.record(self.observer(outputs, elapsed_ms))
            return self.response(outputs)

        return self.answer_batch(requests, self.step.input_names, self.run_batch, answer)

    def run_batch(self, windows: list[dict[str, NDArray[Any] | None]]) -> list[Arrays | Exception]:
        """The step run on each window alone; a window that fails gets its exception."""
        return isolated_outcomes(windows, self.step.run)


class TritonEncoderAdapter(TritonStepAdapter):
    """feature_encoder: the windows of one `execute` are encoded as a batch
    (`FeatureEncoderStep.encode_batch`: their pair features built in one pass); each request
    still gets its own answer or error."""

    step: FeatureEncoderStep
    # Where a window enters the `dispatch` ensembles: closed while the server drains.
    drain_gate: DrainGate = DrainGate.from_environ()

    @classmethod
    def from_triton(cls, pb_utils: Any, args: Mapping[str, str]) -> TritonEncoderAdapter:
        """The adapter feature_encoder's `initialize` builds; its load logged."""
        from dispatch_service.pipeline.encoder_step import FeatureEncoderStep

        load = TritonLoad.read(pb_utils, args)
        encoder = FeatureEncoderStep.from_parameters(load.parameters)

        def observer(outputs: Mapping[str, NDArray[Any]], elapsed_ms: float) -> list[Observation]:
            return encoder_observations(outputs, elapsed_ms) + encoder.geocoder.observations()

        definitions = (*metrics_of(ENCODER_MODEL), *GEOCODING_METRICS)
        adapter = cls(
            pb_utils,
            load.name,
            encoder,
            metrics=load.metrics(pb_utils, definitions),
            observer=observer,
            version=load.version,
            instance=load.instance,
        )
        adapter.loaded()
        return adapter

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        if self.drain_gate.closed():
            return draining_responses(self, requests)
        return super().execute(requests)

    def run_batch(self, windows: list[dict[str, NDArray[Any] | None]]) -> list[Arrays | Exception]:
        encoded = self.step.encode_batch(windows)
        return [item if isinstance(item, Exception) else item[2] for item in encoded]


class TritonResolverAdapter(TritonStepAdapter):
    """topk_resolver: the step, re-scoring stacked orders through BLS calls of the version of
    the scoring model that scored each order (`TopKResolverStep.run` with a ``score``). As
    the `dispatch` ensemble's last step it records its decisions (`serving.decision_log`)."""

    step: TopKResolverStep
    decisions: DecisionWriter | None = None  # None: records are off

    def __init__(
        self,
        pb_utils: Any,
        model_name: str,
        step: TopKResolverStep,
        *,
        target_model: str = SCORING_MODEL_NAME,
        version: str = "",
        instance: str = "",
        metrics: MetricsSink | None = None,
        observer: StepObserver | None = None,
    ) -> None:
        super().__init__(
            pb_utils,
            model_name,
            step,
            version=version,
            instance=instance,
            metrics=metrics,
            observer=observer,
        )
        self.step = step
        self.target_model = target_model

    @classmethod
    def from_triton(cls, pb_utils: Any, args: Mapping[str, str]) -> TritonResolverAdapter:
        """The adapter topk_resolver's `initialize` builds; its load logged."""
        from dispatch_service.pipeline.resolver_step import TopKResolverStep

        load = TritonLoad.read(pb_utils, args)
        adapter = cls(
            pb_utils,
            load.name,
            TopKResolverStep.from_parameters(load.parameters),
            metrics=load.metrics(pb_utils, metrics_of(RESOLVER_MODEL)),
            observer=STEP_OBSERVERS[RESOLVER_MODEL],
            version=load.version,
            instance=load.instance,
        )
        adapter.decisions = decision_writer(pb_utils, load.name, adapter.record)
        adapter.loaded()
        return adapter

    def answered(self, requests: Sequence[Any], read: ReadBatch, outcomes: Sequence[Any]) -> None:
        """Each answered window's decisions to the writer (not the launcher's probes)."""
        for i, inputs, outcome in zip(read.members, read.windows, outcomes, strict=True):
            if isinstance(outcome, Exception) or is_probe(requests[i]):
                continue
            log_decision(
                self.decisions,
                requests[i],
                DISPATCH_ENSEMBLE,
                partial(
                    resolver_answered_window,
                    entry_point=DISPATCH_ENSEMBLE,
                    inputs=inputs,
                    outputs=outcome,
                ),
            )

    def finalize(self) -> None:
        if self.decisions is not None:
            self.decisions.close()
        super().finalize()

    def run_batch(self, windows: list[dict[str, NDArray[Any] | None]]) -> list[Arrays | Exception]:
        """`TopKResolverStep.run_batch`: the windows where nothing stacks resolved together."""
        return self.step.run_batch([(inputs, None, self.score) for inputs in windows])

    def score(self, version: int, features: NDArray[np.float32]) -> NDArray[Any]:
        """One BLS call (awaited here: this step has nothing else to do meanwhile); any
        failure is logged and raises ModelCallError, and those pairs keep their objectives."""
        timeout_us = self.step.stacking.rescore_timeout_ms * 1000
        call = scoring_request(self.pb, self.target_model, version, features, timeout_us)
        try:
            return scored_objectives(self.pb, call.exec())
        except Exception as exc:
            self.log_limited(  # the resolution goes on, so say why its figures are stand-alone
                "warn",
                "rescore_failed",
                target=self.target_model,
                target_version=int(version),
                pairs=len(features),
                error=describe_error(exc),
            )
            if isinstance(exc, ModelCallError):
                raise
            raise ModelCallError(f"{type(exc).__name__}: {exc}") from exc


class TritonBatchedModelAdapter(TritonStepAdapter):
    """dispatch_model under dynamic batching: score all good requests in one session call."""

    step: DispatchModelStep
    one_window_per_request: ClassVar[bool] = False  # its batch dimension is the pair rows

    def __init__(
        self,
        pb_utils: Any,
        model_name: str,
        step: DispatchModelStep,
        *,
        version: str = "",
        instance: str = "",
        metrics: MetricsSink | None = None,
    ) -> None:
        super().__init__(
            pb_utils, model_name, step, version=version, instance=instance, metrics=metrics
        )
        self.step = step

    @classmethod
    def from_triton(cls, pb_utils: Any, args: Mapping[str, str]) -> TritonBatchedModelAdapter:
        """The adapter a dispatch_model version's `initialize` builds (its version folder's
        ONNX file, verified when the server trusts keys); its load logged."""
        from dispatch_service.pipeline.model_step import DispatchModelStep

        load = TritonLoad.read(pb_utils, args)
        step = DispatchModelStep.from_parameters(
            load.layout.onnx(args["model_version"]),
            with_instance_device(load.parameters, args),
            trusted=model_trust(),
        )
        adapter = cls(
            pb_utils,
            load.name,
            step,
            metrics=load.metrics(pb_utils, metrics_of(SCORING_MODEL)),
            version=load.version,
            instance=load.instance,
        )
        adapter.loaded()
        return adapter

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        batch: list[NDArray[np.float32]] = []
        members: list[int] = []
        (input_name,) = self.step.input_names
        for i, request in enumerate(requests):
            tensor = self.pb.get_input_tensor_by_name(request, input_name)
            try:
                if tensor is None:
                    raise DispatchInputError(input_name, "is required but missing", "missing")
                features = tensor.as_numpy()
                self.step.scorer.check(features)
            except DispatchInputError as exc:
                responses[i] = self.reject(request, exc)
                continue
            batch.append(features)
            members.append(i)
        if members:
            try:
                scored = self.step.run_batch(batch)
            except Exception as exc:
                for i in members:
                    responses[i] = self.internal_error(requests[i], exc)
            else:
                for i, scores in zip(members, scored, strict=True):
                    responses[i] = self.response({PAIR_OBJECTIVES.name: scores})
        return responses


def with_instance_device(parameters: dict[str, str], args: Mapping[str, str]) -> dict[str, str]:
    """A KIND_GPU instance's CUDA session runs on the GPU Triton placed the instance on."""
    if str(args.get("model_instance_kind", "")).upper() != "GPU" or "cuda_device_id" in parameters:
        return parameters
    return {**parameters, "cuda_device_id": str(args.get("model_instance_device_id", "0"))}
