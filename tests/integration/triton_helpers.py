"""Helpers for the integration tests: simulated windows and raw tritonclient calls."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Sequence
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from patience import wait_for
from tritonclient.utils import np_to_triton_dtype

from dispatch_contract import DISPATCH_ENSEMBLE_OUTPUTS, RESOLVER_OUTPUTS, batched
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window

OUTPUT_NAMES = [spec.name for spec in RESOLVER_OUTPUTS]
# The resolver's answer plus the router's per-order ORDER_MODEL_VERSION / ORDER_FALLBACK_LEVEL
# and the encoder's ORDER_LOCATION_SOURCE and WINDOW_CITY.
ROUTED_OUTPUT_NAMES = [spec.name for spec in DISPATCH_ENSEMBLE_OUTPUTS]


def sim_window(seed: int, orders: int, riders: int) -> dict[str, np.ndarray[Any, Any]]:
    """One simulated window's contract v2 tensors, without the batch dimension (the infer
    helpers add it and take it off the answer)."""
    return window_to_wire(generate_window(np.random.default_rng(seed), orders, riders))


def infer_http(
    client: httpclient.InferenceServerClient,
    tensors: dict[str, np.ndarray[Any, Any]],
    model: str = "dispatch",
    binary: bool = True,
    output_names: Sequence[str] = OUTPUT_NAMES,
    batch: bool = True,
    headers: dict[str, str] | None = None,
) -> dict[str, np.ndarray[Any, Any]]:
    """One window over HTTP; `batch=False` sends the tensors exactly as given."""
    inputs = []
    for name, array in (batched(tensors) if batch else tensors).items():
        tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in output_names]
    result = client.infer(model, inputs, outputs=outputs, headers=headers)
    return {name: _as_bytes(result.as_numpy(name))[0] for name in output_names}


def _as_bytes(array: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """JSON responses carry BYTES as text; compare them as the bytes they are."""
    if array.dtype.kind != "O":
        return array
    return np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[object])(array)


def grpc_inputs(
    tensors: dict[str, np.ndarray[Any, Any]], batch: bool = True
) -> list[grpcclient.InferInput]:
    """gRPC inputs of one window (with the batch dimension of 1 unless batch=False)."""
    inputs = []
    for name, array in (batched(tensors) if batch else tensors).items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def infer_grpc(
    client: grpcclient.InferenceServerClient,
    tensors: dict[str, np.ndarray[Any, Any]],
    model: str = "dispatch",
    output_names: Sequence[str] = OUTPUT_NAMES,
    batch: bool = True,
    headers: dict[str, str] | None = None,
) -> dict[str, np.ndarray[Any, Any]]:
    inputs = grpc_inputs(tensors, batch)
    outputs = [grpcclient.InferRequestedOutput(n) for n in output_names]
    result = client.infer(model, inputs, outputs=outputs, headers=headers)
    return {name: result.as_numpy(name)[0] for name in output_names}


def metric_series(metrics_url: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every series of the metric ``name`` on a metrics endpoint: its labels and value."""
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    series = []
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} (\S+)", line)
        if match is not None:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            series.append((labels, float(match.group(2))))
    return series


def model_count(metrics_url: str, name: str, model: str) -> float:
    """A per-model counter (``nv_inference_exec_count``, ``nv_inference_request_success``)
    summed over the model's versions."""
    return sum(
        value for labels, value in metric_series(metrics_url, name) if labels.get("model") == model
    )


def settled_count(metrics_url: str, name: str, model: str, *, at_least: float) -> float:
    """The counter once it has reached ``at_least``: Triton counts a request after its response
    has gone out, so a count read right after an answer can lag it by one."""
    wait_for(lambda: model_count(metrics_url, name, model) >= at_least, f"{name} of {model}", 10)
    return model_count(metrics_url, name, model)
