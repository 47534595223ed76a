"""What every step shares: the arrays a step answers with, the protocol of a step, and how a
step reads a tensor it needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Protocol

from numpy.typing import NDArray

from dispatch_service.core.errors import DispatchInputError

__all__ = ["Arrays", "Step", "required"]

Arrays = dict[str, NDArray[Any]]


class Step(Protocol):
    """One request's tensors in, its output tensors out; raises DispatchInputError."""

    input_names: ClassVar[tuple[str, ...]]

    def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> Arrays: ...


def required(inputs: Mapping[str, NDArray[Any] | None], name: str) -> NDArray[Any]:
    """The named input; DispatchInputError naming it when it is absent."""
    value = inputs.get(name)
    if value is None:
        raise DispatchInputError(name, "is required but missing", "missing")
    return value
