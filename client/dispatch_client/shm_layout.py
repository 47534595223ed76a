"""Shared-memory layout: errors, region names, slots, region sizes and tensor bytes.

What the shared-memory transport (`dispatch_client.shm`) needs to know before it touches
any memory: where each tensor goes in a region, how large the regions must be for the
largest window a caller sends (`ShmCapacity`, from the contract), how large each answer
can be (`output_sizes`, bounded from the request) and Triton's raw byte form of a tensor.
Requests carry the v2 contract's leading batch dimension of 1; it changes no size.
"""

from __future__ import annotations

import math
import os
import secrets
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Self

import numpy as np
from numpy.typing import NDArray
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor

from dispatch_client.errors import DispatchError, DispatchServerError
from dispatch_contract import (
    DISPATCH_ENSEMBLE_INPUTS,
    DISPATCH_ENSEMBLE_OUTPUTS,
    FEATURE_ENTRY_INPUTS,
    MAX_ADDRESS_BYTES,
    MAX_CANDIDATES,
    MAX_CITY_BYTES,
    MAX_ID_BYTES,
    ORDER_TEXT,
    ORDER_TEXT_COLUMNS,
    WINDOW_CITY,
    TensorSpec,
)

__all__ = [
    "ALIGNMENT",
    "BYTES_PREFIX",
    "REGION_PREFIX",
    "ShmCapacity",
    "ShmError",
    "ShmKind",
    "ShmPoolClosedError",
    "ShmRegionTooSmallError",
    "ShmUnavailableError",
    "Slot",
    "decode_bytes",
    "output_sizes",
    "plan_slots",
    "region_name",
    "tensor_bytes",
]

ShmKind = Literal["system", "cuda"]

ALIGNMENT: Final = 64  # every tensor starts on a cache line (and a safe GPU alignment)
BYTES_PREFIX: Final = 4  # Triton's BYTES wire form: uint32 little-endian length per element
# /dev/shm/dispatch_client_<pid>_<32 random hex digits>_{in,out}
REGION_PREFIX: Final = "dispatch_client"

_SPECS: Final[dict[str, TensorSpec]] = {
    spec.name: spec
    for spec in (*DISPATCH_ENSEMBLE_INPUTS, *FEATURE_ENTRY_INPUTS, *DISPATCH_ENSEMBLE_OUTPUTS)
}


# ---- errors -------------------------------------------------------------------------------


class ShmError(DispatchError):
    """A shared-memory problem on the client side (region setup, pool state)."""


class ShmUnavailableError(ShmError):
    """The requested kind of shared memory cannot be used here (no GPU, missing module)."""


class ShmPoolClosedError(ShmError):
    """The transport was closed; its regions are gone."""


class ShmRegionTooSmallError(ShmError):
    """A tensor does not fit its shared-memory region; nothing was sent.

    `tensor` is the tensor's name, `byte_size` its size in bytes, `region_bytes` the size of
    the region it had to go in and `direction` ``"input"`` or ``"output"``.
    """

    def __init__(self, tensor: str, byte_size: int, region_bytes: int, direction: str) -> None:
        self.tensor = tensor
        self.byte_size = byte_size
        self.region_bytes = region_bytes
        self.direction = direction
        super().__init__(
            f"{tensor} ({byte_size} bytes) does not fit the {region_bytes}-byte {direction} "
            "shared-memory region together with the tensors before it; "
            "build the transport with a larger ShmCapacity"
        )


# ---- naming and layout -----------------------------------------------------------------------


def region_name(role: str) -> str:
    """A name nobody can predict: prefix, pid (whose regions they are), 128 random bits,
    role. Another local user cannot create a region under it before the client does."""
    return f"{REGION_PREFIX}_{os.getpid()}_{secrets.token_hex(16)}_{role}"


def _aligned(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives in a region."""

    name: str
    offset: int
    byte_size: int

    @property
    def end(self) -> int:
        return self.offset + self.byte_size


def plan_slots(sizes: Sequence[tuple[str, int]], region_bytes: int, direction: str) -> list[Slot]:
    """Place tensors back to back at aligned offsets; raise if one passes the region's end."""
    slots: list[Slot] = []
    offset = 0
    for name, byte_size in sizes:
        offset = _aligned(offset)
        if offset + byte_size > region_bytes:
            raise ShmRegionTooSmallError(name, byte_size, region_bytes, direction)
        slots.append(Slot(name, offset, byte_size))
        offset += byte_size
    return slots


# ---- capacity: how large the regions are ------------------------------------------------------


def _element_bytes(spec: TensorSpec, id_bytes: int) -> int:
    if spec.name == ORDER_TEXT.name:  # ids, or addresses of up to MAX_ADDRESS_BYTES
        return BYTES_PREFIX + max(id_bytes, MAX_ADDRESS_BYTES)
    if spec.name == WINDOW_CITY.name:  # a city id, one of the names ORDER_TEXT[city] takes
        return BYTES_PREFIX + MAX_CITY_BYTES
    return BYTES_PREFIX + id_bytes if spec.triton_dtype == "BYTES" else spec.numpy_dtype.itemsize


def _bound_shape(name: str, orders: int, riders: int, candidates: int, top_k: int) -> list[int]:
    """The largest shape `name` takes for a window of that many orders, riders, N and K."""
    spec = _SPECS[name]
    lead = {
        "ORDER": orders,
        "RIDER": riders,
        "PAIR": orders * candidates,
        "CANDIDATE": orders,
        "TOPK": orders,
        "ASSIGNED": orders,
    }.get(name.split("_", 1)[0])
    if lead is None:  # COORD_SYSTEM, DISPATCH_TIME, OBJECTIVE_WEIGHTS: fixed dims
        return list(spec.dims)
    if name == ORDER_TEXT.name:
        return [lead, len(ORDER_TEXT_COLUMNS)]
    tail = [
        (candidates if name.startswith("CANDIDATE") else top_k) if dim < 0 else dim
        for dim in spec.dims[1:]
    ]
    return [lead, *tail]


def _bound_bytes(sizes: Sequence[tuple[str, int]]) -> int:
    end = 0
    for _, byte_size in sizes:
        end = _aligned(end) + byte_size
    return end


@dataclass(frozen=True)
class ShmCapacity:
    """The largest request a pool's regions must hold; sizes follow from the contract.

    `top_k` bounds K of the answer (K = min(top_k of topk_resolver, N) <= MAX_CANDIDATES,
    so the default always fits); lower it to the server's top_k to save memory.
    `candidates_per_order` bounds N for `dispatch_features` requests.
    """

    max_orders: int = 64
    max_riders: int = 1024
    top_k: int = MAX_CANDIDATES
    candidates_per_order: int = MAX_CANDIDATES
    max_id_bytes: int = MAX_ID_BYTES

    def __post_init__(self) -> None:
        for name in ("max_orders", "max_riders", "top_k", "candidates_per_order", "max_id_bytes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ShmCapacity.{name} must be >= 1")

    def _sizes(self, specs: Sequence[TensorSpec]) -> list[tuple[str, int]]:
        return [
            (
                spec.name,
                math.prod(
                    _bound_shape(
                        spec.name,
                        self.max_orders,
                        self.max_riders,
                        self.candidates_per_order,
                        self.top_k,
                    )
                )
                * _element_bytes(spec, self.max_id_bytes),
            )
            for spec in specs
        ]

    @property
    def input_bytes(self) -> int:
        """Room for either entry point's inputs (a window, or pair features)."""
        return max(
            _bound_bytes(self._sizes(DISPATCH_ENSEMBLE_INPUTS)),
            _bound_bytes(self._sizes(FEATURE_ENTRY_INPUTS)),
        )

    @property
    def output_bytes(self) -> int:
        """Room for every `dispatch` output at B = max_orders, K = top_k, 64-byte ids."""
        return _bound_bytes(self._sizes(DISPATCH_ENSEMBLE_OUTPUTS))

    @classmethod
    def for_window(cls, tensors: Mapping[str, Any], *, top_k: int = MAX_CANDIDATES) -> Self:
        """Just large enough for this window (e.g. a one-shot CLI call).

        Ids longer than the contract allows still fit, so the server, not the region size,
        tells the caller which rule the window broke.
        """
        orders = len(np.asarray(tensors.get("ORDER_IDS", ())).reshape(-1))
        riders = len(np.asarray(tensors.get("RIDER_IDS", ())).reshape(-1))
        longest = max(
            (
                _longest(np.asarray(tensors[name], dtype=object))
                for name in (
                    "ORDER_IDS",
                    "ORDER_USER_IDS",
                    "RIDER_IDS",
                    "COORD_SYSTEM",
                    ORDER_TEXT.name,
                )
                if tensors.get(name) is not None
            ),
            default=0,
        )
        return cls(
            max_orders=max(orders, 1),
            max_riders=max(riders, 1),
            top_k=top_k,
            max_id_bytes=max(MAX_ID_BYTES, longest),
        )


# ---- (de)serialising tensors -------------------------------------------------------------------


def tensor_bytes(array: NDArray[Any]) -> tuple[str, NDArray[np.uint8]]:
    """(Triton datatype, raw bytes) of one input tensor; str elements go out as UTF-8."""
    if array.dtype == np.object_ or array.dtype.kind in "SU":
        if array.size == 0:
            return "BYTES", np.zeros(0, dtype=np.uint8)
        serialized = serialize_byte_tensor(np.asarray(array, dtype=object))
        return "BYTES", np.frombuffer(serialized.item(), dtype=np.uint8)
    contiguous = np.ascontiguousarray(array)
    return np_to_triton_dtype(contiguous.dtype), contiguous.reshape(-1).view(np.uint8)


def decode_bytes(buffer: NDArray[np.uint8], count: int, name: str) -> list[bytes]:
    """`count` length-prefixed elements from `buffer`, refusing to run past its end."""
    data = buffer.tobytes()
    items: list[bytes] = []
    offset = 0
    for _ in range(count):
        if offset + BYTES_PREFIX > len(data):
            raise DispatchServerError(f"malformed response: {name} runs past its region slot")
        (length,) = struct.unpack_from("<I", data, offset)
        offset += BYTES_PREFIX
        if offset + length > len(data):
            raise DispatchServerError(f"malformed response: {name} runs past its region slot")
        items.append(data[offset : offset + length])
        offset += length
    return items


def _byte_length(value: Any) -> int:
    return len(value.encode("utf-8")) if isinstance(value, str) else len(bytes(value))


def _longest(values: NDArray[Any] | None) -> int:
    """Bytes of the longest element of a BYTES tensor (0 when absent or empty)."""
    if values is None or values.size == 0:
        return 0
    return max(_byte_length(v) for v in values.flat)


def output_sizes(
    inputs: Mapping[str, NDArray[Any]], output_names: Sequence[str], capacity: ShmCapacity
) -> list[tuple[str, int]]:
    """Byte bound of each requested output for this request (see the module docstring)."""
    # One window per request: the leading batch dimension of 1 changes no size.
    if "ORDER_IDS" in inputs:
        orders = int(inputs["ORDER_IDS"].size)
        columns = int(inputs["RIDER_IDS"].size) if "RIDER_IDS" in inputs else capacity.top_k
    elif "CANDIDATE_RIDER_INDEX" in inputs and inputs["CANDIDATE_RIDER_INDEX"].ndim >= 2:
        orders, columns = (int(d) for d in inputs["CANDIDATE_RIDER_INDEX"].shape[-2:])
    else:
        raise ValueError(
            "cannot bound the outputs: the request has neither ORDER_IDS nor a "
            "CANDIDATE_RIDER_INDEX [1, B, N]"
        )
    top_k = min(capacity.top_k, columns)
    id_bytes = _longest(inputs.get("RIDER_IDS"))  # output ids are rider ids (or b"")
    sizes = []
    for name in output_names:
        spec = _SPECS.get(name)
        if spec is None or spec not in DISPATCH_ENSEMBLE_OUTPUTS:
            raise ValueError(f"no shared-memory size bound for output {name}")
        shape = _bound_shape(name, orders, 0, 0, top_k)
        sizes.append((name, math.prod(shape) * _element_bytes(spec, id_bytes)))
    return sizes
