"""Stand-ins for the few `triton_python_backend_utils` names the adapters use.

`pb_utils` only exists inside Triton's backend stub; the adapters take it as a parameter,
so unit tests pass these instead. Shared by the adapter, router, fused and metrics tests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from numpy.typing import NDArray


class FakeTensor:
    def __init__(self, name: str, array: NDArray[Any]) -> None:
        self._name = name
        self._array = np.asarray(array)

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> NDArray[Any]:
        return self._array


class FakeTritonError:
    INVALID_ARG: ClassVar[str] = "INVALID_ARG"
    INTERNAL: ClassVar[str] = "INTERNAL"
    CANCELLED: ClassVar[str] = "CANCELLED"
    UNAVAILABLE: ClassVar[str] = "UNAVAILABLE"

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        self._message = message
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> str:
        return self._code


class FakeMetric:
    """Records every call; `value` and `observations` are what the calls add up to."""

    def __init__(self, labels: dict[str, str], buckets: list[float] | None) -> None:
        self.labels = labels
        self.buckets = buckets
        self.calls: list[tuple[str, float]] = []

    def increment(self, value: float) -> None:
        self.calls.append(("increment", value))

    def set(self, value: float) -> None:
        self.calls.append(("set", value))

    def observe(self, value: float) -> None:
        self.calls.append(("observe", value))

    @property
    def value(self) -> float:
        total = 0.0
        for kind, value in self.calls:
            if kind == "increment":
                total += value
            elif kind == "set":
                total = value
        return total

    @property
    def observations(self) -> list[float]:
        return [value for kind, value in self.calls if kind == "observe"]


class FakeMetricFamily:
    """One `pb_utils.MetricFamily`, with the stub's rule that only histograms take buckets."""

    def __init__(self, name: str, description: str, kind: str) -> None:
        self.name = name
        self.description = description
        self.kind = kind
        self.metrics: list[FakeMetric] = []

    def Metric(  # noqa: N802 (pb_utils' spelling)
        self, labels: dict[str, str], buckets: list[float] | None = None
    ) -> FakeMetric:
        if (self.kind == "HISTOGRAM") != (buckets is not None):
            raise ValueError("Failed to create metric. Missing required buckets.")
        metric = FakeMetric(labels, buckets)
        self.metrics.append(metric)
        return metric


class FakeResponse:
    def __init__(
        self,
        output_tensors: list[FakeTensor] | None = None,
        error: FakeTritonError | None = None,
    ) -> None:
        self._tensors = list(output_tensors or [])
        self._error = error

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> FakeTritonError:
        assert self._error is not None, "response has no error"
        return self._error

    def outputs(self) -> dict[str, NDArray[Any]]:
        assert self._error is None, f"unexpected error: {self._error.message()}"
        names = [tensor.name() for tensor in self._tensors]
        assert len(names) == len(set(names)), names
        return {tensor.name(): tensor.as_numpy() for tensor in self._tensors}


class FakeLogger:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def log_info(self, message: str) -> None:
        self.lines.append(("info", message))

    def log_warn(self, message: str) -> None:
        self.lines.append(("warn", message))

    def log_error(self, message: str) -> None:
        self.lines.append(("error", message))


class FakeRequest:
    def __init__(
        self,
        inputs: Mapping[str, NDArray[Any] | None],
        request_id: str = "",
        cancelled: bool = False,
        parameters: Mapping[str, Any] | None = None,
    ) -> None:
        self.tensors = {name: value for name, value in inputs.items() if value is not None}
        self._parameters = dict(parameters or {})  # Triton hands them over as JSON text
        self._id = request_id
        self._cancelled = cancelled
        self.cancel_asks = 0  # each ask is a round trip from the stub to the server

    def request_id(self) -> str:
        return self._id

    def parameters(self) -> str:
        return json.dumps(self._parameters)

    def is_cancelled(self) -> bool:
        self.cancel_asks += 1
        return self._cancelled

    def inputs(self) -> list[FakeTensor]:
        return [FakeTensor(name, array) for name, array in self.tensors.items()]


class FakeMetricFamilies:
    """`pb_utils.MetricFamily`: the kinds as attributes; calling it creates a family."""

    COUNTER: ClassVar[str] = "COUNTER"
    GAUGE: ClassVar[str] = "GAUGE"
    HISTOGRAM: ClassVar[str] = "HISTOGRAM"

    def __init__(self) -> None:
        self.created: dict[str, FakeMetricFamily] = {}

    def __call__(self, name: str, description: str, kind: str) -> FakeMetricFamily:
        family = FakeMetricFamily(name, description, kind)
        self.created[name] = family
        return family

    def series(self, name: str, **labels: str) -> FakeMetric:
        (metric,) = (
            m
            for m in self.created[name].metrics
            if all(m.labels.get(k) == v for k, v in labels.items())
        )
        return metric


class FakePbUtils:
    """The pb_utils names the adapters use; build a fresh one per test."""

    Tensor = FakeTensor
    TritonError = FakeTritonError
    InferenceResponse = FakeResponse

    def __init__(self) -> None:
        self.Logger = FakeLogger()
        self.MetricFamily = FakeMetricFamilies()

    @staticmethod
    def get_input_tensor_by_name(request: FakeRequest, name: str) -> FakeTensor | None:
        array = request.tensors.get(name)
        return None if array is None else FakeTensor(name, array)
