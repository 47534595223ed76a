"""The one bridge between Triton's Python backend and the library.

Every `model.py` is a dozen lines over this: requests become numpy arrays, the step runs,
arrays become response tensors, and an exception becomes that request's own error
response (INVALID_ARG for bad input, INTERNAL otherwise) so one bad request never fails
its batch neighbours nor the model. `pb_utils` is passed in because it only exists inside
the backend stub.

It also records the model's custom metrics (`dispatch_service.core.metrics`) and logs one JSON
line per model instance load and unload and per rejected or failed request.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import PAIR_FEATURES, PAIR_OBJECTIVES, spec_by_name, wire_shape
from dispatch_service.core.backend_shm import seal_own_region
from dispatch_service.core.batches import each_alone
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.log_text import LogRateLimit, clip, describe_error, without_values
from dispatch_service.core.metrics import (
    STEP_OBSERVERS,
    BackgroundMetrics,
    MetricSpec,
    MetricsSink,
    NullMetrics,
    Observation,
    StepObserver,
    TritonMetrics,
    encoder_observations,
    metrics_of,
    rejection_observation,
)
from dispatch_service.core.settings import parameters_from_model_config
from dispatch_service.geocoding.metrics import GEOCODING_METRICS
from dispatch_service.pipeline.steps import (
    Arrays,
    DispatchModelStep,
    FeatureEncoderStep,
    Step,
    TopKResolverStep,
)
from dispatch_service.routing.engine import ModelCallError
from dispatch_service.routing.settings import SCORING_MODEL_NAME
from dispatch_service.serving.drain import DrainGate, draining_responses
from dispatch_service.serving.probe import is_probe
from dispatch_service.serving.trust import model_trust

__all__ = [
    "ReadBatch",
    "TritonBatchedModelAdapter",
    "TritonResolverAdapter",
    "TritonResponder",
    "TritonStepAdapter",
    "adapter_for",
    "log_event",
    "metrics_error_logger",
    "scored_objectives",
    "scoring_request",
    "seal_backend_region",
    "triton_metrics",
    "unbatched",
    "with_instance_device",
]


def log_event(pb_utils: Any, level: str, **fields: Any) -> None:
    """One JSON log line through Triton's logger (never with request payload)."""
    line = json.dumps(fields, sort_keys=True, default=str)
    getattr(pb_utils.Logger, f"log_{level}")(line)


def seal_backend_region(pb_utils: Any, model_name: str) -> None:
    """Make this stub's shared-memory region unreachable by name (`core.backend_shm`); the
    first thing every `model.py`'s `initialize` does. A failure is logged, never fails the
    load."""
    try:
        seal_own_region()
    except OSError as exc:
        log_event(
            pb_utils,
            "warn",
            event="shm_region_not_sealed",
            model=model_name,
            error=describe_error(exc),
        )


T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class ReadBatch:
    """The requests of one `execute`, read: ``responses`` holds the answer of each request
    whose inputs could not be read (None for the others), ``windows`` the inputs of the
    others, in order, and ``members`` their positions among the requests."""

    responses: list[Any]
    members: list[int]
    windows: list[dict[str, NDArray[Any] | None]]


class TritonResponder:
    """What every adapter shares: error responses, rejection logs, metrics, load/unload logs.

    Each window-level request is asked `request.is_cancelled()` before it is read
    (`read_batch`) and a cancelled one is answered CANCELLED at once, unworked: Triton 2.51's
    dynamic batcher does not drop a request whose client gave up (its deadline passed) but
    hands it to `execute` like any other -- about half of dispatch_fused's requests under
    32 callers with 1-15 ms deadlines -- so without the ask they held the
    instances, and the queue behind them filled for every other caller. Each ask is a round
    trip from the stub to the server (dispatch_fused served 7-8 % fewer small windows a
    second at concurrency 64 with it, measured before the batcher's behaviour was known).
    An ensemble's step requests never read as cancelled on 2.51: the ensemble does not pass
    its client's cancellation on.
    """

    def __init__(
        self,
        pb_utils: Any,
        model_name: str,
        *,
        version: str = "",
        instance: str = "",
        metrics: MetricsSink | None = None,
    ) -> None:
        self.pb = pb_utils
        self.model_name = model_name
        self.version = version
        self.instance = instance
        self.metrics: MetricsSink = metrics if metrics is not None else NullMetrics()
        self._metrics_failed = metrics_error_logger(pb_utils, model_name)
        self.request_lines = LogRateLimit()

    def loaded(self) -> None:
        """Log this instance's load (called once `initialize` has built the adapter)."""
        self._log_lifecycle("model_loaded")

    def finalize(self) -> None:
        """Log the unload and release the custom metrics (Triton's `finalize`)."""
        self._log_lifecycle("model_unloaded")
        close = getattr(self.metrics, "close", None)
        if close is not None:
            close()
        self.metrics = NullMetrics()

    def _log_lifecycle(self, event: str) -> None:
        log_event(
            self.pb,
            "info",
            event=event,
            model=self.model_name,
            version=self.version,
            instance=self.instance,
        )

    def record(self, observations: list[Observation]) -> None:
        """Record metrics; a metrics failure is logged once and never fails a request."""
        try:
            self.metrics.record(observations)
        except Exception as exc:
            self._metrics_failed(exc)

    # Window-level models (max_batch_size > 0, contract v2): every request carries one
    # window behind a leading batch dimension of 1, which `arrays` removes and `response`
    # puts back. dispatch_model batches pair rows instead and sets this False.
    one_window_per_request: ClassVar[bool] = True

    def arrays(self, request: Any, names: Sequence[str]) -> dict[str, NDArray[Any] | None]:
        """The named inputs of a request as arrays (None where absent), in one pass over its
        inputs: `pb_utils.get_input_tensor_by_name` lists them all again for every name.

        Raises DispatchInputError when a window-level input's batch dimension is not 1."""
        present = {tensor.name(): tensor for tensor in request.inputs()}
        arrays = {
            name: None if (tensor := present.get(name)) is None else tensor.as_numpy()
            for name in names
        }
        if not self.one_window_per_request:
            return arrays
        return {
            name: None if value is None else unbatched(name, value)
            for name, value in arrays.items()
        }

    def response(self, outputs: dict[str, NDArray[Any]]) -> Any:
        batch = self.one_window_per_request
        return self.pb.InferenceResponse(
            output_tensors=[
                self.pb.Tensor(name, np.asarray(value)[np.newaxis] if batch else np.asarray(value))
                for name, value in outputs.items()
            ]
        )

    def error(self, request: Any, message: str, code: Any) -> Any:
        return self.pb.InferenceResponse(error=self.pb.TritonError(message, code))

    def cancelled(self, request: Any) -> bool:
        """Whether the request's client gave up on it (a failed ask reads as not cancelled:
        the request is then served as usual)."""
        try:
            return bool(request.is_cancelled())
        except Exception:
            return False

    def cancelled_response(self, request: Any) -> Any:
        """The answer of a request cancelled before it was worked (never logged: a client's
        deadline is not an error of the request)."""
        return self.error(
            request,
            f"{self.model_name}: request cancelled before it was served",
            self.pb.TritonError.CANCELLED,
        )

    def log_limited(self, level: str, event: str, **fields: Any) -> None:
        """One line of a kind there can be one of per request, rate-limited per instance
        (`request_lines`); the first line let through after some were dropped is preceded
        by a ``log_lines_dropped`` line counting them. ``fields`` hold no payload value."""
        dropped = self.request_lines.admit()
        if dropped is None:
            return
        if dropped:
            log_event(
                self.pb, "warn", event="log_lines_dropped", model=self.model_name, lines=dropped
            )
        log_event(self.pb, level, event=event, model=self.model_name, **fields)

    def log_request(self, level: str, request: Any, event: str, **fields: Any) -> None:
        """`log_limited` with the request's id, capped and escaped (`core.log_text.clip`)."""
        try:
            request_id = clip(request.request_id())
        except Exception:  # a request that cannot say its id is still logged
            request_id = ""
        self.log_limited(level, event, request_id=request_id, **fields)

    def reject(self, request: Any, exc: DispatchInputError) -> Any:
        self.log_request(
            "warn",
            request,
            "request_rejected",
            tensor=clip(exc.tensor),
            rule=without_values(exc.rule),  # the message to the client may quote its values
            code=exc.code,
        )
        self.record([rejection_observation(exc)])
        return self.error(request, str(exc), self.pb.TritonError.INVALID_ARG)

    def answer_batch(
        self,
        requests: Sequence[Any],
        names: Sequence[str],
        run_batch: Callable[[list[dict[str, NDArray[Any] | None]]], Sequence[T | Exception]],
        answer: Callable[[Any, T], Any],
    ) -> list[Any]:
        """One `execute`'s requests run as one batch, each answered on its own: a request
        whose inputs cannot be read is refused alone, the others go to ``run_batch`` together
        (one outcome per window, in order), and each outcome is answered: DispatchInputError
        as INVALID_ARG, another exception as an internal error, a result by ``answer``.
        A failure of the batch itself is each member's own internal error."""
        read = self.read_batch(requests, names)
        try:
            outcomes = run_batch(read.windows) if read.windows else []
        except Exception as exc:
            outcomes = [exc] * len(read.windows)
        return self.answer_outcomes(requests, read, outcomes, answer)

    def read_batch(self, requests: Sequence[Any], names: Sequence[str]) -> ReadBatch:
        """`answer_batch`'s first half: each request's named inputs (`arrays`), or its
        answer already where it was cancelled or its inputs cannot be read."""
        read = ReadBatch([None] * len(requests), [], [])
        for i, request in enumerate(requests):
            if self.cancelled(request):
                read.responses[i] = self.cancelled_response(request)
                continue
            try:
                read.windows.append(self.arrays(request, names))
            except DispatchInputError as exc:
                read.responses[i] = self.reject(request, exc)
                continue
            except Exception as exc:  # any other failure to read it answers this request only
                read.responses[i] = self.internal_error(request, exc)
                continue
            read.members.append(i)
        return read

    def answer_outcomes(
        self,
        requests: Sequence[Any],
        read: ReadBatch,
        outcomes: Sequence[T | Exception],
        answer: Callable[[Any, T], Any],
    ) -> list[Any]:
        """`answer_batch`'s second half: each read window's outcome answered, in order."""
        responses = list(read.responses)
        for i, outcome in zip(read.members, outcomes, strict=True):
            request = requests[i]
            if isinstance(outcome, DispatchInputError):
                responses[i] = self.reject(request, outcome)
            elif isinstance(outcome, Exception):
                responses[i] = self.internal_error(request, outcome)
            else:
                responses[i] = answer(request, outcome)
        return responses

    def internal_error(self, request: Any, exc: Exception) -> Any:
        self.log_request(
            "error",
            request,
            "request_failed",
            error=describe_error(exc),
            # The exception's own frames (its message is `error`): a batch answers its
            # failures after the fact.
            trace=clip("".join(traceback.format_tb(exc.__traceback__, limit=5)), 2048),
        )
        return self.error(
            request,
            f"{self.model_name}: internal error ({type(exc).__name__}: {exc})",
            self.pb.TritonError.INTERNAL,
        )


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
        if isinstance(self.step, FeatureEncoderStep):
            self.step.close()  # its geocoder's event-loop thread

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
        return each_alone(windows, self.step.run)


class TritonEncoderAdapter(TritonStepAdapter):
    """feature_encoder: the windows of one `execute` are encoded as a batch
    (`FeatureEncoderStep.encode_batch`: their pair features built in one pass); each request
    still gets its own answer or error."""

    step: FeatureEncoderStep
    # Where a window enters the `dispatch` ensembles: closed while the server drains.
    drain_gate: DrainGate = DrainGate.from_environ()

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        if self.drain_gate.closed():
            return draining_responses(self, requests)
        return super().execute(requests)

    def run_batch(self, windows: list[dict[str, NDArray[Any] | None]]) -> list[Arrays | Exception]:
        encoded = self.step.encode_batch(windows)
        return [item if isinstance(item, Exception) else item[2] for item in encoded]


class TritonResolverAdapter(TritonStepAdapter):
    """topk_resolver: the step, re-scoring stacked orders through BLS calls of the version of
    the scoring model that scored each order (`TopKResolverStep.run` with a ``score``)."""

    step: TopKResolverStep

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


def scoring_request(
    pb_utils: Any, model: str, version: int, features: NDArray[Any], timeout_us: int = 0
) -> Any:
    """A BLS request of one version of the scoring model: PAIR_FEATURES in, objectives out;
    ``timeout_us`` > 0: refused once it has waited that long in the model's queue."""
    options = {"timeout": timeout_us} if timeout_us > 0 else {}
    return pb_utils.InferenceRequest(
        model_name=model,
        model_version=int(version),
        inputs=[pb_utils.Tensor(PAIR_FEATURES.name, features)],
        requested_output_names=[PAIR_OBJECTIVES.name],
        **options,
    )


def scored_objectives(pb_utils: Any, response: Any) -> NDArray[Any]:
    """A BLS answer's PAIR_OBJECTIVES; an error answer raises ModelCallError."""
    if response.has_error():
        raise ModelCallError(response.error().message())
    tensor = pb_utils.get_output_tensor_by_name(response, PAIR_OBJECTIVES.name)
    if tensor is None:
        raise ModelCallError(f"the answer lacks {PAIR_OBJECTIVES.name}")
    scores: NDArray[Any] = tensor.as_numpy()
    return scores


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


def unbatched(name: str, value: NDArray[Any]) -> NDArray[Any]:
    """One request's window tensor without its batch dimension, which must be 1."""
    if value.ndim == 0 or value.shape[0] != 1:
        try:
            expected = wire_shape(spec_by_name(name))
        except KeyError:
            expected = "[1, ...]"
        raise DispatchInputError(
            name,
            f"must have a batch dimension of 1 (one window per request, contract v2): "
            f"shape {expected}, got {list(value.shape)}",
            "shape",
        )
    window: NDArray[Any] = value[0]
    return window


def with_instance_device(parameters: dict[str, str], args: dict[str, str]) -> dict[str, str]:
    """A KIND_GPU instance's CUDA session runs on the GPU Triton placed the instance on."""
    if str(args.get("model_instance_kind", "")).upper() != "GPU" or "cuda_device_id" in parameters:
        return parameters
    return {**parameters, "cuda_device_id": str(args.get("model_instance_device_id", "0"))}


def adapter_for(pb_utils: Any, args: dict[str, str], model: str) -> TritonStepAdapter:
    """Build the adapter a `model.py` needs from Triton's `initialize` args; log the load."""
    seal_backend_region(pb_utils, args["model_name"])
    parameters = parameters_from_model_config(args["model_config"])
    name = args["model_name"]
    version = str(args.get("model_version", ""))
    labels = {"version": version, "instance": str(args.get("model_instance_name", ""))}
    adapter: TritonStepAdapter
    observer = STEP_OBSERVERS.get(model)
    definitions = metrics_of(model)
    if model == "feature_encoder":
        encoder = FeatureEncoderStep.from_parameters(parameters)

        def observer(outputs: Mapping[str, NDArray[Any]], elapsed_ms: float) -> list[Observation]:
            return encoder_observations(outputs, elapsed_ms) + encoder.geocoder.observations()

        definitions = (*definitions, *GEOCODING_METRICS)
        adapter = TritonEncoderAdapter(
            pb_utils,
            name,
            encoder,
            metrics=triton_metrics(pb_utils, name, version, definitions),
            observer=observer,
            **labels,
        )
    elif model == "topk_resolver":
        adapter = TritonResolverAdapter(
            pb_utils,
            name,
            TopKResolverStep.from_parameters(parameters),
            metrics=triton_metrics(pb_utils, name, version, definitions),
            observer=observer,
            **labels,
        )
    elif model == "dispatch_model":
        path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        adapter = TritonBatchedModelAdapter(
            pb_utils,
            name,
            DispatchModelStep.from_parameters(
                path, with_instance_device(parameters, args), trusted=model_trust()
            ),
            metrics=triton_metrics(pb_utils, name, version, definitions),
            **labels,
        )
    else:
        raise ValueError(f"no adapter for model {model!r}")
    adapter.loaded()
    return adapter


def triton_metrics(
    pb_utils: Any, model_name: str, version: str, definitions: Sequence[MetricSpec]
) -> MetricsSink:
    """The model's custom metrics on Triton's metrics port; none (logged) where unavailable.

    Recorded from a thread of the stub (`BackgroundMetrics`): each value is a round trip to
    the server, which a request should not wait for. Each series carries the stub's `pid`:
    Triton frees a series shared by several processes when the first of them unloads, so a
    live reload must never share one (sum over `pid`).
    """
    try:
        labels = {"model": model_name, "version": version, "pid": str(os.getpid())}
        sink = TritonMetrics(pb_utils, labels, definitions)
    except Exception as exc:  # e.g. a server started with --allow-metrics=false
        log_event(
            pb_utils,
            "warn",
            event="metrics_unavailable",
            model=model_name,
            error=describe_error(exc),
        )
        return NullMetrics()
    return BackgroundMetrics(sink, on_error=metrics_error_logger(pb_utils, model_name))


def metrics_error_logger(pb_utils: Any, model_name: str) -> Callable[[Exception], None]:
    """The first failure of a model's metrics recording as one error line; later ones quiet."""
    failed: list[Exception] = []

    def report(exc: Exception) -> None:
        if not failed:
            failed.append(exc)
            log_event(
                pb_utils,
                "error",
                event="metrics_failed",
                model=model_name,
                error=describe_error(exc),
            )

    return report
