"""HTTP request bodies built once from simulator windows, and the answers they get back.

Four wire forms of the same window (`perf.windows` gives each as its contract v2 wire
tensors, one window without the batch dimension; the Triton bodies add the batch
dimension of 1 every request carries):
- Triton KServe v2 JSON (`/v2/models/dispatch/infer`, tensors as JSON lists, answer in JSON);
- Triton KServe v2 binary extension (JSON header + raw tensors, `Inference-Header-Content-Length`);
- the FastAPI baseline's window JSON (`POST /dispatch`): the client's documented window
  schema (`dispatch_client.window_json`), answered with the client's per-order result JSON;
- the FastAPI baseline's arrays JSON (`POST /dispatch/arrays`): `{"tensors": {NAME:
  {"dtype", "shape", "b64" | "text"}}}`, numbers as base64 of little-endian raw bytes,
  BYTES as a list of UTF-8 strings; answered in the same form.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from numpy.typing import NDArray

from dispatch_client.window_json import window_to_json
from dispatch_contract import DISPATCH_ENSEMBLE_OUTPUTS, TRITON_TO_NUMPY, batched, spec_by_name
from dispatch_service.domain.window_wire import window_tensors_from_wire
from perf.pa import tensor_entry

__all__ = [
    "OUTPUT_NAMES",
    "TRITON_INFER_PATH",
    "RequestBody",
    "Tensors",
    "decode_arrays",
    "decode_triton_json_answer",
    "encode_arrays",
    "fastapi_arrays_body",
    "fastapi_window_body",
    "triton_binary_body",
    "triton_infer_path",
    "triton_json_body",
]

Tensors = dict[str, NDArray[Any]]
# Contract v2: rider indices and objective matrices, plus the per-order routing outputs.
OUTPUT_NAMES: tuple[str, ...] = tuple(spec.name for spec in DISPATCH_ENSEMBLE_OUTPUTS)


def triton_infer_path(model: str) -> str:
    """KServe v2 infer path of a Triton model (`dispatch` or `dispatch_fused`: same bodies)."""
    return f"/v2/models/{model}/infer"


TRITON_INFER_PATH = triton_infer_path("dispatch")


@dataclass(frozen=True)
class RequestBody:
    data: bytes
    headers: dict[str, str] = field(default_factory=dict)


def triton_json_body(tensors: Mapping[str, NDArray[Any]]) -> RequestBody:
    """KServe v2 JSON: every tensor as a flat JSON list, every output asked for as JSON."""
    document = {
        "inputs": [
            {"name": name, "datatype": spec_by_name(name).triton_dtype, **_kserve_json(array)}
            for name, array in batched(tensors).items()
        ],
        "outputs": [{"name": name, "parameters": {"binary_data": False}} for name in OUTPUT_NAMES],
    }
    data = json.dumps(document, separators=(",", ":")).encode()
    return RequestBody(data, {"Content-Type": "application/json"})


def _kserve_json(array: NDArray[Any]) -> dict[str, Any]:
    entry = tensor_entry(array)
    return {"shape": entry["shape"], "data": entry["content"]}


def triton_binary_body(tensors: Mapping[str, NDArray[Any]]) -> RequestBody:
    """KServe v2 binary-tensor extension, built by tritonclient exactly as its client sends it."""
    inputs = []
    for name, array in batched(tensors).items():
        infer_input = httpclient.InferInput(
            name, list(array.shape), spec_by_name(name).triton_dtype
        )
        infer_input.set_data_from_numpy(array, binary_data=True)
        inputs.append(infer_input)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in OUTPUT_NAMES]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs, outputs)
    headers = {"Content-Type": "application/octet-stream"}
    if json_size is not None:
        headers["Inference-Header-Content-Length"] = str(json_size)
    return RequestBody(bytes(body), headers)


def decode_triton_json_answer(data: bytes) -> Tensors:
    """Outputs of a KServe v2 JSON answer as numpy arrays (BYTES as bytes objects)."""
    arrays: Tensors = {}
    for output in json.loads(data)["outputs"]:
        shape = tuple(int(d) for d in output["shape"])
        if output["datatype"] == "BYTES":
            values = np.empty(len(output["data"]), dtype=object)
            values[:] = [str(v).encode("utf-8") for v in output["data"]]
        else:
            values = np.asarray(output["data"], dtype=TRITON_TO_NUMPY[output["datatype"]])
        arrays[output["name"]] = values.reshape(shape)
    return arrays


def fastapi_window_body(tensors: Mapping[str, NDArray[Any]]) -> RequestBody:
    """The client's window JSON, compact, as `dispatch-client` would read it."""
    logical = window_tensors_from_wire(tensors)
    data = window_to_json({k: v for k, v in logical.items() if v is not None}, indent=None).encode()
    return RequestBody(data, {"Content-Type": "application/json"})


def encode_arrays(tensors: Mapping[str, NDArray[Any]]) -> dict[str, Any]:
    """Tensors as the arrays JSON document (numbers base64, BYTES as strings)."""
    encoded: dict[str, Any] = {}
    for name, array in tensors.items():
        shape = [int(d) for d in array.shape]
        if array.dtype.kind in "OSU":
            text = [
                item.decode("utf-8") if isinstance(item, bytes) else str(item)
                for item in array.reshape(-1)
            ]
            encoded[name] = {"dtype": "BYTES", "shape": shape, "text": text}
        else:
            raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
            encoded[name] = {
                "dtype": array.dtype.str.lstrip("<>=|"),
                "shape": shape,
                "b64": base64.b64encode(raw).decode("ascii"),
            }
    return {"tensors": encoded}


def decode_arrays(document: Mapping[str, Any]) -> Tensors:
    """Inverse of `encode_arrays`; raises ValueError on a malformed entry."""
    try:
        entries = document["tensors"]
        tensors: Tensors = {}
        for name, entry in entries.items():
            shape = tuple(int(d) for d in entry["shape"])
            if entry["dtype"] == "BYTES":
                values = np.empty(len(entry["text"]), dtype=object)
                values[:] = [str(v).encode("utf-8") for v in entry["text"]]
                tensors[str(name)] = values.reshape(shape)
            else:
                dtype = np.dtype("<" + str(entry["dtype"]))
                raw = base64.b64decode(entry["b64"], validate=True)
                array = np.frombuffer(raw, dtype=dtype).reshape(shape)
                tensors[str(name)] = array.astype(dtype.newbyteorder("="))  # a writable copy
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise ValueError(f"malformed arrays document: {exc}") from exc
    return tensors


def fastapi_arrays_body(tensors: Mapping[str, NDArray[Any]]) -> RequestBody:
    data = json.dumps(encode_arrays(tensors), separators=(",", ":")).encode()
    return RequestBody(data, {"Content-Type": "application/json"})
