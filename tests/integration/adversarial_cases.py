"""Protocol-level adversarial requests, sent raw over gRPC and HTTP binary.

`test_malformed.py` breaks a window's values through tritonclient, which keeps the wire
honest; these cases break the wire itself: declared shapes that overflow int64 (without
landing on the real byte size: see `exact_wrap`), negative and zero dims, shapes and data
that disagree, declared datatypes that disagree with the model or exist nowhere, BYTES
tensors whose length prefixes lie or are cut short, missing, unknown and duplicated tensors,
batch sizes beyond the model's. Each case is one request, sent as built: gRPC through the raw
`ModelInfer` stub (a `ModelInferRequest` with `raw_input_contents`), HTTP through a raw body
(JSON header + binary blobs). Each case names what its refusal must name: the tensor, or the
rule's words when the request as a whole is wrong.

`exact_wrap` builds the one shape family the embedded Triton 2.51 cannot survive: dims whose
byte size overflows int64 onto the real byte size pass Triton's check, and the Python
backend's stub dies building the numpy array before any model code runs
(docs/security.md). It is kept out of the CI run and reproduced by
`scripts/repro_shape_wrap.py`.
"""

from __future__ import annotations

import http.client
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import np_to_triton_dtype

from dispatch_contract import batched
from triton_helpers import sim_window

__all__ = [
    "Case",
    "GrpcRaw",
    "HttpRaw",
    "Raw",
    "base_tensors",
    "exact_wrap",
    "generate",
    "refusal_names",
]

INT64_MAX = (1 << 63) - 1
ITEM_BYTES = {"FP64": 8, "FP32": 4, "INT32": 4, "INT64": 8, "BOOL": 1, "UINT8": 1}


@dataclass(frozen=True)
class Raw:
    """One input tensor as it goes on the wire."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes


@dataclass(frozen=True)
class Case:
    kind: str
    tensors: tuple[Raw, ...]
    names: tuple[str, ...]  # a refusal must contain one of these (case-insensitive)
    grpc_only: bool = False  # HTTP's JSON header cannot carry it (e.g. negative dims)


def _bytes_tensor(values: np.ndarray[Any, Any]) -> bytes:
    out = bytearray()
    for value in values.reshape(-1):
        item = value if isinstance(value, bytes) else str(value).encode()
        out += struct.pack("<I", len(item)) + item
    return bytes(out)


def base_tensors(seed: int = 5) -> tuple[Raw, ...]:
    """A valid small window (4 orders, 8 riders) as raw tensors with the batch dim of 1."""
    tensors = []
    for name, array in batched(sim_window(seed, 4, 8)).items():
        datatype = str(np_to_triton_dtype(array.dtype))
        data = (
            _bytes_tensor(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
        )
        tensors.append(Raw(name, datatype, tuple(int(d) for d in array.shape), data))
    return tuple(tensors)


def _product(shape: tuple[int, ...]) -> int:
    total = 1
    for dim in shape:
        total *= dim
    return total


def _wrapped(value: int) -> int:
    """``value`` as int64 arithmetic leaves it (two's complement wrap)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


def lands_on_real_size(tensor: Raw) -> bool:
    """Whether Triton 2.51's int64 size check would pass this tensor's shape (see
    `exact_wrap`): the wrapped element count (BYTES) or byte size equals the real one."""
    if tensor.datatype == "BYTES":
        count = 0
        at = 0
        while at + 4 <= len(tensor.data):
            (length,) = struct.unpack_from("<I", tensor.data, at)
            at += 4 + length
            count += 1
        return _wrapped(_product(tensor.shape)) == count and _product(tensor.shape) != count
    item = ITEM_BYTES.get(tensor.datatype)
    if item is None:
        return False
    real = _product(tensor.shape) * item
    return _wrapped(real) == len(tensor.data) and real != len(tensor.data)


def exact_wrap(tensor: Raw) -> Raw:
    """``tensor`` with its second dim grown by a multiple of 2^64 / gcd so that the declared
    byte size wraps onto the real one (the 2.51 stub-killing family)."""
    if tensor.datatype == "BYTES":
        raise ValueError("numeric tensors only")
    item = ITEM_BYTES[tensor.datatype]
    inner = item * _product(tensor.shape[2:]) * tensor.shape[0]
    step = (1 << 64) // np.gcd(inner, 1 << 64)
    shape = (tensor.shape[0], tensor.shape[1] + int(step), *tensor.shape[2:])
    if shape[1] > INT64_MAX:
        raise ValueError("no int64 dim wraps this tensor")
    return replace(tensor, shape=shape)


def _pick(rng: np.random.Generator, tensors: tuple[Raw, ...], kind: str = "") -> int:
    indices = [
        i for i, t in enumerate(tensors) if not kind or (t.datatype == "BYTES") == (kind == "BYTES")
    ]
    return int(indices[int(rng.integers(len(indices)))])


def _with(tensors: tuple[Raw, ...], index: int, tensor: Raw) -> tuple[Raw, ...]:
    return (*tensors[:index], tensor, *tensors[index + 1 :])


Mutation = Callable[[np.random.Generator, tuple[Raw, ...]], Case]

OVERFLOW_DIMS = (1 << 61, 1 << 62, INT64_MAX, (1 << 62) + 1, 3 << 60, (1 << 32) + 1)


def overflow_dim(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors)
    t = tensors[i]
    dim = OVERFLOW_DIMS[int(rng.integers(len(OVERFLOW_DIMS)))]
    position = int(rng.integers(1, len(t.shape))) if len(t.shape) > 1 else 0
    shape = list(t.shape)
    shape[position] = dim
    changed = replace(t, shape=tuple(shape))
    if lands_on_real_size(changed):  # never the exact wrap: that one is not for CI
        changed = replace(changed, shape=(*changed.shape[:-1], changed.shape[-1] + 1))
    return Case("overflow_dim", _with(tensors, i, changed), (t.name,))


def overflow_product(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors)
    t = tensors[i]
    big = 1 << int(rng.integers(20, 40))
    shape = (t.shape[0], *(big for _ in t.shape[1:])) if len(t.shape) > 1 else (big,)
    changed = replace(t, shape=shape)
    if lands_on_real_size(changed):
        changed = replace(changed, shape=(*shape[:-1], shape[-1] + 1))
    return Case("overflow_product", _with(tensors, i, changed), (t.name, "batch"))


def negative_dim(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors)
    t = tensors[i]
    shape = list(t.shape)
    position = int(rng.integers(len(shape)))
    shape[position] = -int(rng.integers(1, 9))
    changed = replace(t, shape=tuple(shape))
    declared = _product(changed.shape) * ITEM_BYTES.get(t.datatype, 1)
    if lands_on_real_size(changed) or declared == len(t.data):
        changed = replace(changed, shape=(*changed.shape[:-1], changed.shape[-1] + 1))
    return Case("negative_dim", _with(tensors, i, changed), (t.name, "batch"), grpc_only=True)


def zero_dim(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors)
    t = tensors[i]
    shape = list(t.shape)
    shape[int(rng.integers(1, len(shape))) if len(shape) > 1 else 0] = 0
    data = b"" if rng.random() < 0.5 else t.data
    return Case("zero_dim", _with(tensors, i, replace(t, shape=tuple(shape), data=data)), (t.name,))


def shape_disagrees(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors)
    t = tensors[i]
    shape = list(t.shape)
    position = len(shape) - 1 if len(shape) > 1 else 0
    shape[position] += int(rng.choice([-1, 1, 7]))
    return Case("shape_disagrees", _with(tensors, i, replace(t, shape=tuple(shape))), (t.name,))


def data_disagrees(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors, "numeric")
    t = tensors[i]
    cut = int(rng.integers(1, len(t.data)))
    data = t.data[:-cut] if rng.random() < 0.5 else t.data + bytes(cut)
    return Case("data_disagrees", _with(tensors, i, replace(t, data=data)), (t.name,))


def wrong_rank(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors)
    t = tensors[i]
    shape = t.shape[1:] if rng.random() < 0.5 and len(t.shape) > 1 else (1, *t.shape)
    # Without its batch dim a tensor's first dim reads as its batch size: Triton then names
    # the rule ("batch size does not match") and the first tensor it compared.
    changed = _with(tensors, i, replace(t, shape=tuple(shape)))
    return Case("wrong_rank", changed, (t.name, "batch size"))


def batch_beyond(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    batch = int(rng.choice([65, 1000, 1 << 31, 2]))
    changed = tuple(replace(t, shape=(batch, *t.shape[1:])) for t in tensors)
    return Case("batch_beyond", changed, ("batch", *(t.name for t in tensors)))


def batch_mismatch(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors)
    t = tensors[i]
    return Case(
        "batch_mismatch", _with(tensors, i, replace(t, shape=(2, *t.shape[1:]))), (t.name, "batch")
    )


def wrong_datatype(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors)
    t = tensors[i]
    datatype = str(rng.choice(["FP32", "INT64", "BOOL", "UINT8", "BYTES", "FP64", "FP128", ""]))
    if datatype == t.datatype:
        datatype = "INT32"
    return Case(
        "wrong_datatype",
        _with(tensors, i, replace(t, datatype=datatype)),
        (t.name, "datatype", "data-type", "data type"),
    )


def bytes_prefix_lies(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors, "BYTES")
    t = tensors[i]
    choice = int(rng.integers(4))
    if choice == 0:  # the first length claims more than there is
        data = struct.pack("<I", len(t.data) + int(rng.integers(1, 1 << 20))) + t.data[4:]
    elif choice == 1:  # 0xFFFFFFFF
        data = struct.pack("<I", 0xFFFFFFFF) + t.data[4:]
    elif choice == 2:  # cut inside a length prefix
        data = t.data + b"\x05\x00"
    else:  # fewer elements than the shape
        (first,) = struct.unpack_from("<I", t.data, 0)
        data = t.data[4 + first :]
    return Case("bytes_prefix_lies", _with(tensors, i, replace(t, data=data)), (t.name,))


def bytes_not_utf8(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors, "BYTES")
    t = tensors[i]
    (first,) = struct.unpack_from("<I", t.data, 0)
    bad = bytes(rng.choice([b"\xff\xfe", b"\xc3(", b"\xed\xa0\x80", b"\x00"]))
    data = struct.pack("<I", len(bad)) + bad + t.data[4 + first :]
    return Case("bytes_not_utf8", _with(tensors, i, replace(t, data=data)), (t.name,))


def missing(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors)
    return Case("missing", (*tensors[:i], *tensors[i + 1 :]), (tensors[i].name,))


def unknown(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    extra = Raw("NOT_AN_INPUT", "INT32", (1, 3), bytes(12))
    return Case("unknown", (*tensors, extra), ("NOT_AN_INPUT",))


def duplicated(rng: np.random.Generator, tensors: tuple[Raw, ...]) -> Case:
    i = _pick(rng, tensors)
    return Case("duplicated", (*tensors, tensors[i]), (tensors[i].name,))


MUTATIONS: tuple[Mutation, ...] = (
    overflow_dim,
    overflow_product,
    negative_dim,
    zero_dim,
    shape_disagrees,
    data_disagrees,
    wrong_rank,
    batch_beyond,
    batch_mismatch,
    wrong_datatype,
    bytes_prefix_lies,
    bytes_not_utf8,
    missing,
    unknown,
    duplicated,
)


def generate(rng: np.random.Generator, http: bool) -> Case:
    """One adversarial case; HTTP never gets the cases its JSON header cannot carry."""
    tensors = base_tensors()
    while True:
        case = MUTATIONS[int(rng.integers(len(MUTATIONS)))](rng, tensors)
        if not (http and case.grpc_only):
            return case


def refusal_names(case: Case, message: str) -> bool:
    text = message.lower()
    return any(name.lower() in text for name in case.names)


class GrpcRaw:
    """`ModelInfer` with a request built field by field (no client-side checks)."""

    def __init__(self, url: str) -> None:
        self.channel = grpc.insecure_channel(url)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)

    def send(self, model: str, tensors: tuple[Raw, ...], timeout_s: float) -> tuple[str, str]:
        """(status, message): "OK" when served."""
        request = service_pb2.ModelInferRequest(model_name=model)
        for tensor in tensors:
            item = request.inputs.add()
            item.name = tensor.name
            item.datatype = tensor.datatype
            item.shape.extend(tensor.shape)
            request.raw_input_contents.append(tensor.data)
        try:
            self.stub.ModelInfer(request, timeout=timeout_s)
        except grpc.RpcError as exc:
            return str(exc.code().name), str(exc.details())
        return "OK", ""

    def close(self) -> None:
        self.channel.close()


class HttpRaw:
    """`POST /v2/models/<m>/infer` with a binary body built by hand."""

    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.connection = http.client.HTTPConnection(host, port, timeout=timeout_s)

    def send(self, model: str, tensors: tuple[Raw, ...], timeout_s: float) -> tuple[str, str]:
        header = json.dumps(
            {
                "inputs": [
                    {
                        "name": t.name,
                        "datatype": t.datatype,
                        "shape": list(t.shape),
                        "parameters": {"binary_data_size": len(t.data)},
                    }
                    for t in tensors
                ]
            }
        ).encode()
        body = header + b"".join(t.data for t in tensors)
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        }
        try:
            self.connection.request("POST", f"/v2/models/{model}/infer", body, headers)
            response = self.connection.getresponse()
            text = response.read().decode(errors="replace")
        except (OSError, http.client.HTTPException) as exc:
            self.connection.close()
            return "NO_ANSWER", f"{type(exc).__name__}: {exc}"
        if response.status == 200:
            return "OK", ""
        try:
            message = str(json.loads(text).get("error", text))
        except ValueError:
            message = text
        return str(response.status), message

    def close(self) -> None:
        self.connection.close()
