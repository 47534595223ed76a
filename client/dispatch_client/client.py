"""`DispatchClient`: send one dispatch window, get per-order results back.

The `dispatch` ensemble answers in padded [B, K] tensors; callers want, per order, the
riders that were really ranked and the one assigned. This module does that reshaping once,
and checks the answer's shapes so a contract drift shows up as an error, not as results
attached to the wrong order.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_client.closing import Closing
from dispatch_client.errors import DispatchError, DispatchServerError
from dispatch_client.transport import (
    DEFAULT_GRPC_URL,
    DEFAULT_HTTP_URL,
    DEFAULT_TIMEOUT_S,
    GrpcTransport,
    HttpTransport,
    Transport,
)
from dispatch_contract import (
    DISPATCH_ENSEMBLE_OUTPUTS,
    FEATURE_ENTRY_INPUTS,
    FEATURE_ENTRY_MODEL_NAME,
    NUM_PAIR_FEATURES,
    ROUTING_INPUTS,
    WINDOW_INPUTS,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "OUTPUT_NAMES",
    "Candidate",
    "DispatchClient",
    "DispatchResult",
    "OrderResult",
    "new_request_id",
    "parse_dispatch_outputs",
]

DEFAULT_MODEL_NAME = "dispatch"
# The resolver's answer plus the router's per-order ORDER_MODEL_VERSION, ORDER_FALLBACK_LEVEL.
OUTPUT_NAMES: tuple[str, ...] = tuple(spec.name for spec in DISPATCH_ENSEMBLE_OUTPUTS)
# The window, plus the optional MODEL_VERSION_TAG ("stable", "canary" or a version number).
_INPUT_NAMES = frozenset(spec.name for spec in (*WINDOW_INPUTS, *ROUTING_INPUTS))
_FEATURE_SPECS = {spec.name: spec for spec in FEATURE_ENTRY_INPUTS}
_TOPK = (  # the index first: it defines K and marks padding
    "TOPK_RIDER_INDEX",
    "TOPK_RIDER_IDS",
    "TOPK_SCORE",
    "TOPK_ETA_MINUTES",
    "TOPK_ONTIME_PROBABILITY",
    "TOPK_COST",
)
_ASSIGNED = ("ASSIGNED_RIDER_IDS", "ASSIGNED_RIDER_INDEX", "ASSIGNED_SCORE")


class Candidate(NamedTuple):
    """One ranked rider for an order (a Top-K slot that is not padding)."""

    rider_id: str
    score: float
    eta_minutes: float
    ontime_probability: float
    cost: float


@dataclass(frozen=True)
class OrderResult:
    """What the server decided for one order; `assigned_*` are None when unassigned."""

    order_id: str
    top_k: tuple[Candidate, ...]
    assigned_rider_id: str | None
    assigned_score: float | None
    # dispatch_model version that scored the order (0: rule-based) and the fallback level
    # (0 chosen version, 1 stable retry, 2 rule-based, 3 chosen version on CPU instances: no
    # healthy GPU); None when the answer lacks them.
    model_version: int | None = None
    fallback_level: int | None = None

    def to_json_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "order_id": self.order_id,
            "assigned_rider_id": self.assigned_rider_id,
            "assigned_score": self.assigned_score,
            "top_k": [c._asdict() for c in self.top_k],
        }
        if self.model_version is not None:
            data["model_version"] = self.model_version
        if self.fallback_level is not None:
            data["fallback_level"] = self.fallback_level
        return data


@dataclass(frozen=True)
class DispatchResult:
    """Results in the window's order order (the i-th entry answers the i-th order)."""

    orders: tuple[OrderResult, ...]
    # The id the request went out with (not part of the JSON answer: it is the caller's).
    request_id: str | None = field(default=None, compare=False)

    def assignments(self) -> dict[str, str | None]:
        """Order id -> assigned rider id (None when the order stays unassigned)."""
        return {o.order_id: o.assigned_rider_id for o in self.orders}

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data; `null` marks an unassigned order."""
        return {"orders": [o.to_json_dict() for o in self.orders]}


def new_request_id() -> str:
    """A fresh request id: 32 hex digits, unique enough to find one request in the logs."""
    return uuid.uuid4().hex


class DispatchClient(Closing):
    """Calls the `dispatch` ensemble through a `Transport`; closes it on exit.

    >>> with DispatchClient.http("localhost:8000") as client:  # doctest: +SKIP
    ...     result = client.dispatch(window_from_json(text))
    """

    def __init__(self, transport: Transport, *, model_name: str = DEFAULT_MODEL_NAME) -> None:
        self.transport = transport
        self.model_name = model_name

    @classmethod
    def http(
        cls,
        url: str = DEFAULT_HTTP_URL,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        model_name: str = DEFAULT_MODEL_NAME,
    ) -> DispatchClient:
        return cls(HttpTransport(url, timeout_s=timeout_s), model_name=model_name)

    @classmethod
    def grpc(
        cls,
        url: str = DEFAULT_GRPC_URL,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        model_name: str = DEFAULT_MODEL_NAME,
    ) -> DispatchClient:
        return cls(GrpcTransport(url, timeout_s=timeout_s), model_name=model_name)

    def dispatch(
        self, window: Mapping[str, ArrayLike], *, request_id: str | None = None
    ) -> DispatchResult:
        """Send window tensors (e.g. from `window_from_json`) and parse the answer.

        `request_id` is sent as Triton's request id (a fresh `new_request_id` when None):
        the server's rejection log lines carry it, the raised error and the result too.
        Raises ValueError for a tensor name the contract does not know or a missing
        ORDER_IDS (caught before any network traffic), and the transport's errors.
        """
        unknown = sorted(set(window) - _INPUT_NAMES)
        if unknown:
            raise ValueError(f"unknown window tensor(s) {', '.join(unknown)}")
        inputs = {name: np.asarray(value) for name, value in window.items() if value is not None}
        if "ORDER_IDS" not in inputs:
            raise ValueError("window tensors lack ORDER_IDS")
        return self._call(self.model_name, inputs, inputs["ORDER_IDS"], request_id)

    def dispatch_features(
        self,
        order_ids: ArrayLike,
        features: Mapping[str, ArrayLike],
        *,
        model_name: str = FEATURE_ENTRY_MODEL_NAME,
        request_id: str | None = None,
    ) -> DispatchResult:
        """Send already encoded pair features to the `dispatch_features` ensemble.

        `features` holds the tensors of `contracts.FEATURE_ENTRY_INPUTS`: PAIR_FEATURES
        [B x N, 28] (the served model versions' layout, rows in CANDIDATE_RIDER_INDEX order),
        CANDIDATE_RIDER_INDEX [B, N], ORDER_USER_IDS [B] (canary routing), RIDER_IDS,
        RIDER_LOAD, RIDER_CAPACITY and optionally OBJECTIVE_WEIGHTS and MODEL_VERSION_TAG.
        `order_ids` ([B]) label the results; they are not sent. `request_id` as in
        `dispatch`. Numeric tensors are cast to
        the contract's dtypes. Raises ValueError for an unknown or
        missing tensor or inconsistent shapes (before any network traffic), and the
        transport's errors.
        """
        unknown = sorted(set(features) - set(_FEATURE_SPECS))
        if unknown:
            raise ValueError(f"unknown feature tensor(s) {', '.join(unknown)}")
        inputs: dict[str, NDArray[Any]] = {}
        for name, spec in _FEATURE_SPECS.items():
            value = features.get(name)
            if value is None:
                if not spec.optional:
                    raise ValueError(f"feature tensors lack {name}")
                continue
            dtype = object if spec.triton_dtype == "BYTES" else spec.numpy_dtype
            inputs[name] = np.asarray(value, dtype=dtype)
        ids = np.asarray(order_ids, dtype=object).reshape(-1)
        pairs, candidates = inputs["PAIR_FEATURES"], inputs["CANDIDATE_RIDER_INDEX"]
        if pairs.ndim != 2 or pairs.shape[1] != NUM_PAIR_FEATURES:
            raise ValueError(
                f"PAIR_FEATURES must have shape [P, {NUM_PAIR_FEATURES}], got {pairs.shape}"
            )
        if candidates.ndim != 2 or candidates.shape[0] != len(ids):
            raise ValueError(
                f"CANDIDATE_RIDER_INDEX must have shape [B, N] with B = {len(ids)} orders, "
                f"got {candidates.shape}"
            )
        if inputs["ORDER_USER_IDS"].shape != (len(ids),):
            raise ValueError(f"ORDER_USER_IDS must have shape [{len(ids)}] like the order ids")
        if pairs.shape[0] != candidates.size:
            raise ValueError(
                f"PAIR_FEATURES must have B x N = {candidates.size} rows, got {pairs.shape[0]}"
            )
        return self._call(model_name, inputs, ids, request_id)

    def _call(
        self,
        model_name: str,
        inputs: dict[str, NDArray[Any]],
        order_ids: ArrayLike,
        request_id: str | None,
    ) -> DispatchResult:
        """One request under one id; the id rides on the error or the result."""
        rid = new_request_id() if request_id is None else request_id
        try:
            outputs = self.transport.infer(model_name, inputs, OUTPUT_NAMES, request_id=rid)
            result = parse_dispatch_outputs(order_ids, outputs)
        except DispatchError as exc:
            exc.request_id = rid
            raise
        return DispatchResult(result.orders, rid)

    def close(self) -> None:
        self.transport.close()


def parse_dispatch_outputs(
    order_ids: ArrayLike, outputs: Mapping[str, ArrayLike]
) -> DispatchResult:
    """Turn the ensemble's padded outputs into per-order results, dropping padding (-1).

    Raises DispatchServerError when an output is missing or shaped against the contract.
    """
    ids = [_text(v) for v in np.asarray(order_ids, dtype=object).reshape(-1)]
    count = len(ids)
    arrays = {name: _output(outputs, name) for name in (*_TOPK, *_ASSIGNED)}
    width = arrays["TOPK_RIDER_INDEX"].shape[1] if arrays["TOPK_RIDER_INDEX"].ndim == 2 else -1
    for name in _TOPK:
        if arrays[name].shape != (count, width):
            raise DispatchServerError(
                f"malformed response: {name} has shape {arrays[name].shape}, "
                f"expected ({count}, K) for {count} orders"
            )
    for name in _ASSIGNED:
        if arrays[name].shape != (count,):
            raise DispatchServerError(
                f"malformed response: {name} has shape {arrays[name].shape}, expected ({count},)"
            )

    versions = _routing_output(outputs, "ORDER_MODEL_VERSION", count)
    levels = _routing_output(outputs, "ORDER_FALLBACK_LEVEL", count)
    results = []
    for row, order_id in enumerate(ids):
        top_k = tuple(
            Candidate(
                rider_id=_text(arrays["TOPK_RIDER_IDS"][row, slot]),
                score=_short_float(arrays["TOPK_SCORE"][row, slot]),
                eta_minutes=_short_float(arrays["TOPK_ETA_MINUTES"][row, slot]),
                ontime_probability=_short_float(arrays["TOPK_ONTIME_PROBABILITY"][row, slot]),
                cost=_short_float(arrays["TOPK_COST"][row, slot]),
            )
            for slot in range(width)
            if int(arrays["TOPK_RIDER_INDEX"][row, slot]) >= 0
        )
        assigned = int(arrays["ASSIGNED_RIDER_INDEX"][row]) >= 0
        results.append(
            OrderResult(
                order_id=order_id,
                top_k=top_k,
                assigned_rider_id=_text(arrays["ASSIGNED_RIDER_IDS"][row]) if assigned else None,
                assigned_score=_short_float(arrays["ASSIGNED_SCORE"][row]) if assigned else None,
                model_version=None if versions is None else int(versions[row]),
                fallback_level=None if levels is None else int(levels[row]),
            )
        )
    return DispatchResult(orders=tuple(results))


def _routing_output(outputs: Mapping[str, ArrayLike], name: str, count: int) -> NDArray[Any] | None:
    """An optional per-order routing output ([B] ints), None when the answer lacks it."""
    value = outputs.get(name)
    if value is None:
        return None
    array = np.asarray(value)
    if array.shape != (count,):
        raise DispatchServerError(
            f"malformed response: {name} has shape {array.shape}, expected ({count},)"
        )
    return array


def _output(outputs: Mapping[str, ArrayLike], name: str) -> NDArray[Any]:
    value = outputs.get(name)
    if value is None:
        raise DispatchServerError(f"malformed response: output {name} is missing")
    return np.asarray(value)


def _text(value: Any) -> str:
    # Ids went out as UTF-8; `replace` keeps a corrupted one visible instead of fatal.
    if isinstance(value, bytes | bytearray | np.bytes_):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _short_float(value: Any) -> float:
    """Shortest decimal of the FP32 value, so JSON shows 0.8, not 0.800000011920929."""
    return float(str(np.float32(value)))
