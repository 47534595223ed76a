"""What every Triton adapter shares: requests read into arrays, answers and error answers
built, rejections logged and counted, load and unload logged.

An exception becomes that request's own error response (INVALID_ARG for bad input,
INTERNAL otherwise) so one bad request never fails its batch neighbours nor the model.
`pb_utils` is passed in because it only exists inside the backend stub.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, TypeVar

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import spec_by_name, wire_shape
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.log_text import LogRateLimit, clip, describe_error, without_values
from dispatch_service.core.metrics import (
    MetricsSink,
    NullMetrics,
    Observation,
    rejection_observation,
)
from dispatch_service.serving import stub_gc
from dispatch_service.serving.backend_log import log_event
from dispatch_service.serving.stub_setup import settle_cpu_priority
from dispatch_service.serving.triton_metrics import metrics_error_logger

__all__ = ["BACK_TO_BACK_S", "ReadBatch", "TritonResponder", "unbatched"]

# An execute that begins within this long of the instance's previous answers found its
# requests queued while the instance worked; after a longer gap the instance sat idle and,
# with no queue delay, its next batch was dispatched as it came. Erring long only asks more.
BACK_TO_BACK_S: Final = 0.005

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

    A window-level request is asked `request.is_cancelled()` before it is read
    (`read_batch`) and a cancelled one is answered CANCELLED at once, unworked: Triton 2.51's
    dynamic batcher does not drop a request whose client gave up (its deadline passed) but
    hands it to `execute` like any other, so without the ask such requests held the
    instances and the queue behind them filled for every other caller. Each ask is a round
    trip from the stub to the server, so the requests are asked only when the batch may
    have waited in the queue (`queue_waited`): a batch that reaches an idle instance was
    dispatched as it came (the window-level models configure no queue delay) and is served
    without asking. An ensemble's step requests never read as cancelled on 2.51: the
    ensemble does not pass its client's cancellation on.
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
        self.clock: Callable[[], float] = time.perf_counter
        # When this instance last answered a batch (None: it has not yet), and how many
        # batches it is working on now (an async `execute` may overlap another).
        self._idle_since: float | None = None
        self._in_flight = 0

    def loaded(self) -> None:
        """Log this instance's load (called once `initialize` has built the adapter), lower
        the stub's CPU priority, its setup done (`stub_setup.settle_cpu_priority`), and
        turn the garbage collector back on (`stub_gc.resume`)."""
        stub_gc.resume()
        settle_cpu_priority()
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

    def queue_waited(self) -> bool:
        """Whether this execute's requests may have waited in the queue: this is the
        instance's first execute, another is still in flight, or it began within
        `BACK_TO_BACK_S` of the previous one's answers (the instance was busy while they
        queued)."""
        idle_since = self._idle_since
        return (
            idle_since is None or self._in_flight > 0 or self.clock() - idle_since < BACK_TO_BACK_S
        )

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
        self.answered(requests, read, outcomes)
        return self.answer_outcomes(requests, read, outcomes, answer)

    def answered(self, requests: Sequence[Any], read: ReadBatch, outcomes: Sequence[Any]) -> None:
        """A subclass's look at one execute's inputs and outcomes before they are answered
        (topk_resolver records its decisions); nothing here. Must not raise."""

    def read_batch(self, requests: Sequence[Any], names: Sequence[str]) -> ReadBatch:
        """`answer_batch`'s first half: each request's named inputs (`arrays`), or its
        answer already where it was cancelled or its inputs cannot be read."""
        read = ReadBatch([None] * len(requests), [], [])
        ask = self.queue_waited()
        self._in_flight += 1
        for i, request in enumerate(requests):
            if ask and self.cancelled(request):
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
        self._in_flight = max(self._in_flight - 1, 0)
        self._idle_since = self.clock()
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
