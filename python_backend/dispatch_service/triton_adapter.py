"""The one bridge between Triton's Python backend and the library.

Every `model.py` is a dozen lines over this: requests become numpy arrays, the step runs,
arrays become response tensors, and an exception becomes that request's own error
response (INVALID_ARG for bad input, INTERNAL otherwise) so one bad request never fails
its batch neighbours nor the model. `pb_utils` is passed in because it only exists inside
the backend stub.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_service.contracts import PAIR_OBJECTIVES
from dispatch_service.errors import DispatchInputError
from dispatch_service.settings import parameters_from_model_config
from dispatch_service.steps import DispatchModelStep, FeatureEncoderStep, Step, TopKResolverStep


def _log(pb_utils: Any, level: str, **fields: Any) -> None:
    line = json.dumps(fields, sort_keys=True, default=str)
    getattr(pb_utils.Logger, f"log_{level}")(line)


class TritonStepAdapter:
    """Runs a `Step` once per request."""

    def __init__(self, pb_utils: Any, model_name: str, step: Step) -> None:
        self.pb = pb_utils
        self.model_name = model_name
        self.step = step

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        return [self._respond(request) for request in requests]

    def _inputs(self, request: Any) -> dict[str, NDArray[Any] | None]:
        arrays: dict[str, NDArray[Any] | None] = {}
        for name in self.step.input_names:
            tensor = self.pb.get_input_tensor_by_name(request, name)
            arrays[name] = None if tensor is None else tensor.as_numpy()
        return arrays

    def _respond(self, request: Any) -> Any:
        if request.is_cancelled():
            return self.error(request, "request cancelled", self.pb.TritonError.CANCELLED)
        try:
            outputs = self.step.run(self._inputs(request))
        except DispatchInputError as exc:
            return self.reject(request, exc)
        except Exception as exc:  # any failure answers this request only
            return self.internal_error(request, exc)
        return self.response(outputs)

    def response(self, outputs: dict[str, NDArray[Any]]) -> Any:
        return self.pb.InferenceResponse(
            output_tensors=[
                self.pb.Tensor(name, np.asarray(value)) for name, value in outputs.items()
            ]
        )

    def error(self, request: Any, message: str, code: Any) -> Any:
        return self.pb.InferenceResponse(error=self.pb.TritonError(message, code))

    def reject(self, request: Any, exc: DispatchInputError) -> Any:
        _log(
            self.pb,
            "warn",
            event="request_rejected",
            model=self.model_name,
            request_id=request.request_id(),
            tensor=exc.tensor,
            rule=exc.rule,
        )
        return self.error(request, str(exc), self.pb.TritonError.INVALID_ARG)

    def internal_error(self, request: Any, exc: Exception) -> Any:
        _log(
            self.pb,
            "error",
            event="request_failed",
            model=self.model_name,
            request_id=request.request_id(),
            error=f"{type(exc).__name__}: {exc}",
            trace=traceback.format_exc(limit=5),
        )
        return self.error(
            request,
            f"{self.model_name}: internal error ({type(exc).__name__}: {exc})",
            self.pb.TritonError.INTERNAL,
        )


class TritonBatchedModelAdapter(TritonStepAdapter):
    """dispatch_model under dynamic batching: score all good requests in one session call."""

    step: DispatchModelStep

    def __init__(self, pb_utils: Any, model_name: str, step: DispatchModelStep) -> None:
        super().__init__(pb_utils, model_name, step)
        self.step = step

    def execute(self, requests: Sequence[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        batch: list[NDArray[np.float32]] = []
        members: list[int] = []
        (input_name,) = self.step.input_names
        for i, request in enumerate(requests):
            if request.is_cancelled():
                responses[i] = self.error(
                    request, "request cancelled", self.pb.TritonError.CANCELLED
                )
                continue
            tensor = self.pb.get_input_tensor_by_name(request, input_name)
            try:
                if tensor is None:
                    raise DispatchInputError(input_name, "is required but missing")
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


def adapter_for(pb_utils: Any, args: dict[str, str], model: str) -> TritonStepAdapter:
    """Build the adapter a `model.py` needs from Triton's `initialize` args."""
    parameters = parameters_from_model_config(args["model_config"])
    name = args["model_name"]
    if model == "feature_encoder":
        return TritonStepAdapter(pb_utils, name, FeatureEncoderStep.from_parameters(parameters))
    if model == "topk_resolver":
        return TritonStepAdapter(pb_utils, name, TopKResolverStep.from_parameters(parameters))
    if model == "dispatch_model":
        path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        step = DispatchModelStep.from_parameters(path, parameters)
        return TritonBatchedModelAdapter(pb_utils, name, step)
    raise ValueError(f"no adapter for model {model!r}")
