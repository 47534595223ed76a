"""Stand-ins for the few `triton_python_backend_utils` names the adapters use.

`pb_utils` only exists inside Triton's backend stub; the adapters take it as a parameter,
so unit tests pass these instead. Shared by the adapter, router and metrics tests.
"""

from __future__ import annotations

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
