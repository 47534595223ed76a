"""`DispatchClient`: send one dispatch window, get per-order results back.

The `dispatch` ensemble (contract v2) answers one window per request in padded [1, B, K]
rider indices and objective matrices; callers want, per order, the riders (by id) that were
really ranked and the one assigned. This module packs the window into the wire tensors,
maps the indices back to the window's rider ids, and checks the answer's shapes so a
contract drift shows up as an error, not as results attached to the wrong order.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_client.closing import Closing
from dispatch_client.errors import DispatchError, DispatchServerError
from dispatch_client.keys import PRIORITY_KEY_ENV, read_key
from dispatch_client.outcomes import (
    DEFAULT_OUTCOMES_URL,
    OutcomeReceipt,
    OutcomeReport,
    report_outcomes,
)
from dispatch_client.priority import (
    PREMIUM,
    STANDARD,
    PriorityMap,
    check_deadline_ms,
    check_priority,
)
from dispatch_client.retry import DEFAULT_RETRY, RetryPolicy, RetryThrottle
from dispatch_client.transport import (
    DEFAULT_GRPC_URL,
    DEFAULT_HTTP_URL,
    DEFAULT_TIMEOUT_S,
    GrpcTransport,
    HttpTransport,
    Transport,
)
from dispatch_contract import (
    ASSIGNED_OBJECTIVES,
    DISPATCH_ENSEMBLE_OUTPUTS,
    FEATURE_ENTRY_INPUTS,
    FEATURE_ENTRY_MODEL_NAME,
    FEATURE_ENTRY_OUTPUTS,
    NUM_PAIR_FEATURES,
    OBJECTIVES,
    ORDER_TEXT,
    PRIORITY_LANE_MODEL_NAME,
    ROUTING_INPUTS,
    TOPK_OBJECTIVE_COLUMNS,
    WINDOW_CITY,
    WINDOW_INPUTS,
    WIRE_DISPATCH_INPUTS,
    LocationSource,
    batched,
    pack_window,
)

__all__ = [
    "DEFAULT_MODEL_NAME",
    "LOCATION_SOURCE_NAMES",
    "OUTPUT_NAMES",
    "Candidate",
    "DispatchClient",
    "DispatchResult",
    "OrderResult",
    "new_request_id",
    "parse_dispatch_outputs",
    "unbatched_outputs",
]

DEFAULT_MODEL_NAME = "dispatch"
# Contract v2: the resolver's answer (rider indices and objective matrices) plus the
# router's per-order ORDER_MODEL_VERSION, ORDER_FALLBACK_LEVEL and the encoder's
# ORDER_LOCATION_SOURCE and WINDOW_CITY (the feature-level entry point has no encoder, so
# not those two).
OUTPUT_NAMES: tuple[str, ...] = tuple(spec.name for spec in DISPATCH_ENSEMBLE_OUTPUTS)
_FEATURE_OUTPUT_NAMES: tuple[str, ...] = tuple(spec.name for spec in FEATURE_ENTRY_OUTPUTS)
# How the JSON names each ORDER_LOCATION_SOURCE value.
LOCATION_SOURCE_NAMES: dict[int, str] = {
    LocationSource.GIVEN: "coordinates",
    LocationSource.CACHE: "cache",
    LocationSource.GEOCODER: "geocoder",
    LocationSource.GAZETTEER: "gazetteer",
}
# A window in the library's form (one tensor per field, as `window_from_json` builds it),
# plus the optional MODEL_VERSION_TAG ("stable", "canary" or a version number) ...
_INPUT_NAMES = frozenset(spec.name for spec in (*WINDOW_INPUTS, *ROUTING_INPUTS))
# ... or already packed as the wire's v2 tensors (without the batch dimension).
_WIRE_NAMES = frozenset(spec.name for spec in WIRE_DISPATCH_INPUTS)
_FEATURE_SPECS = {spec.name: spec for spec in FEATURE_ENTRY_INPUTS}
_SCORE, _ETA, _ONTIME, _COST = (
    TOPK_OBJECTIVE_COLUMNS.index(name)
    for name in ("score", "eta_minutes", "ontime_probability", "cost")
)


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
    # The assigned pair's figures (ASSIGNED_OBJECTIVES): its rider may rank below the Top-K
    # list; None when unassigned or when the answer lacks them.
    assigned_eta_minutes: float | None = None
    assigned_ontime_probability: float | None = None
    assigned_cost: float | None = None
    # dispatch_model version that scored the order (0: rule-based) and the fallback level
    # (0 chosen version, 1 stable retry, 2 rule-based, 3 chosen version on CPU instances: no
    # healthy GPU); None when the answer lacks them.
    model_version: int | None = None
    fallback_level: int | None = None
    # How the pickup and the drop-off were located ("coordinates", "cache", "geocoder",
    # "gazetteer"); None when the answer lacks ORDER_LOCATION_SOURCE.
    pickup_source: str | None = None
    dropoff_source: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "order_id": self.order_id,
            "assigned_rider_id": self.assigned_rider_id,
            "assigned_score": self.assigned_score,
            "assigned_eta_minutes": self.assigned_eta_minutes,
            "assigned_ontime_probability": self.assigned_ontime_probability,
            "assigned_cost": self.assigned_cost,
            "top_k": [c._asdict() for c in self.top_k],
        }
        if self.model_version is not None:
            data["model_version"] = self.model_version
        if self.fallback_level is not None:
            data["fallback_level"] = self.fallback_level
        if self.pickup_source is not None:
            data["pickup_source"] = self.pickup_source
            data["dropoff_source"] = self.dropoff_source
        return data


@dataclass(frozen=True)
class DispatchResult:
    """Results in the window's order order (the i-th entry answers the i-th order)."""

    orders: tuple[OrderResult, ...]
    # The id the request went out with (not part of the JSON answer: it is the caller's).
    request_id: str | None = field(default=None, compare=False)
    # The id of the registered city that served the window (WINDOW_CITY, e.g. "shanghai");
    # None when the answer lacks it (`dispatch_features` encodes no window).
    city: str | None = None

    def assignments(self) -> dict[str, str | None]:
        """Order id -> assigned rider id (None when the order stays unassigned)."""
        return {o.order_id: o.assigned_rider_id for o in self.orders}

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data; `null` marks an unassigned order."""
        data: dict[str, Any] = {} if self.city is None else {"city": self.city}
        data["orders"] = [o.to_json_dict() for o in self.orders]
        return data


def new_request_id() -> str:
    """A fresh request id: 32 hex digits, unique enough to find one request in the logs."""
    return uuid.uuid4().hex


class DispatchClient(Closing):
    """Calls the `dispatch` ensemble through a `Transport`; closes it on exit.

    >>> with DispatchClient.http("localhost:8000") as client:  # doctest: +SKIP
    ...     result = client.dispatch(window_from_json(text))
    """

    def __init__(
        self,
        transport: Transport,
        *,
        model_name: str = DEFAULT_MODEL_NAME,
        deadline_ms: float | None = None,
        priority: int | None = None,
        priorities: PriorityMap | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        priority_lane: str | None = PRIORITY_LANE_MODEL_NAME,
        priority_key: str | None = None,
    ) -> None:
        """`deadline_ms`: the longest a window may wait in the server's queue before it is
        refused (UNAVAILABLE), (0, 60000] ms; None keeps the model's default timeout.
        `priority`: 1 (priority/premium), 2 (standard) or 3 (bulk) for every window;
        `priorities`: a tenant-to-level map choosing each window's level from its orders
        (used when `priority` is None). Neither: the model's default level (2).
        `priority_lane`: where `dispatch` sends a level-1 window instead of `model_name`
        (the server's `dispatch_priority`: the same answer on stubs of its own, so a busy
        server does not make it wait for bulk windows); None sends every window to
        `model_name`.
        `priority_key`: the server's priority key (else ``$DISPATCH_PRIORITY_KEY``, else the
        file named by ``$DISPATCH_PRIORITY_KEY_FILE``): level 1 is an entitlement, so
        without it a level-1 window goes out at level 2 to `model_name` (the lane refuses a
        window without the key; `dispatch_contract.keys`).
        `retry`: how a refusal without work (UNAVAILABLE, no connection) is sent again, with
        jittered backoff (`RetryPolicy`; `NO_RETRY` raises the first refusal); the client's
        `RetryThrottle` stops retries while most of its sends are refused.
        Raises ValueError for a bad deadline or an unknown level."""
        self.transport = transport
        self.model_name = model_name
        self.deadline_ms = check_deadline_ms(deadline_ms)
        self.priority = None if priority is None else check_priority(priority)
        self.priorities = priorities
        self.priority_lane = priority_lane
        self.priority_key = read_key(priority_key, PRIORITY_KEY_ENV) or ""
        self.retry = retry
        self.retry_throttle = RetryThrottle()

    @classmethod
    def http(
        cls,
        url: str = DEFAULT_HTTP_URL,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        model_name: str = DEFAULT_MODEL_NAME,
        deadline_ms: float | None = None,
        priority: int | None = None,
        priorities: PriorityMap | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        priority_lane: str | None = PRIORITY_LANE_MODEL_NAME,
        priority_key: str | None = None,
    ) -> DispatchClient:
        return cls(
            HttpTransport(url, timeout_s=timeout_s),
            model_name=model_name,
            deadline_ms=deadline_ms,
            priority=priority,
            priorities=priorities,
            retry=retry,
            priority_lane=priority_lane,
            priority_key=priority_key,
        )

    @classmethod
    def grpc(
        cls,
        url: str = DEFAULT_GRPC_URL,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        model_name: str = DEFAULT_MODEL_NAME,
        deadline_ms: float | None = None,
        priority: int | None = None,
        priorities: PriorityMap | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        priority_lane: str | None = PRIORITY_LANE_MODEL_NAME,
        priority_key: str | None = None,
    ) -> DispatchClient:
        return cls(
            GrpcTransport(url, timeout_s=timeout_s),
            model_name=model_name,
            deadline_ms=deadline_ms,
            priority=priority,
            priorities=priorities,
            retry=retry,
            priority_lane=priority_lane,
            priority_key=priority_key,
        )

    def dispatch(
        self, window: Mapping[str, ArrayLike], *, request_id: str | None = None
    ) -> DispatchResult:
        """Send a window (e.g. from `window_from_json`) and parse the answer.

        The window is packed into the v2 wire tensors (`dispatch_contract.pack_window`),
        one window per request (batch dimension 1); the answer's rider indices are mapped
        back to the window's rider ids. A window already in the wire form (ORDER_FIELDS,
        RIDER_FIELDS, WINDOW_FIELDS) is sent as it is. `request_id` is sent as Triton's
        request id (a fresh `new_request_id` when None): the server's rejection log lines
        carry it, the raised error and the result too. A level-1 window goes to
        `priority_lane` when one is set. Raises ValueError for a tensor name
        the contract does not know or a missing one (caught before any network traffic),
        and the transport's errors.
        """
        given = {name for name, value in window.items() if value is not None}
        wire = given & (_WIRE_NAMES - _INPUT_NAMES)
        unknown = sorted(given - (_WIRE_NAMES if wire else _INPUT_NAMES))
        if unknown:
            raise ValueError(f"unknown window tensor(s) {', '.join(unknown)}")
        present = {name: window[name] for name in given}
        if wire:
            inputs = {name: np.asarray(value) for name, value in present.items()}
        else:
            try:
                inputs = pack_window(present)
            except KeyError as exc:
                raise ValueError(f"window tensors lack {exc.args[0]}") from None
        for name in ("ORDER_IDS", "RIDER_IDS"):
            if name not in inputs:
                raise ValueError(f"window tensors lack {name}")
        options = self._request_options(present if not wire else {})
        model = self.model_name
        if options.get("priority") == PREMIUM:
            if not self.priority_key:
                options["priority"] = STANDARD  # level 1 needs the key
            elif self.priority_lane:
                # The lane is the precedence: its windows wait at its default level (it has
                # no level 1: a window claiming it there is refused at once).
                model = self.priority_lane
                del options["priority"]
        if self.priority_key and model in (self.priority_lane, PRIORITY_LANE_MODEL_NAME):
            options["priority_key"] = self.priority_key  # only the lane asks for it
        return self._call(model, inputs, request_id, options=options)

    def _request_options(self, window: Mapping[str, ArrayLike]) -> dict[str, Any]:
        """Triton's request priority and queue timeout, only those the caller set."""
        options: dict[str, Any] = {}
        level = self.priority
        if level is None and self.priorities is not None:
            level = self.priorities.level_of(window)
        if level is not None:
            options["priority"] = level
        if self.deadline_ms is not None:
            options["timeout_us"] = max(1, round(self.deadline_ms * 1000.0))
        return options

    def dispatch_features(
        self,
        order_ids: ArrayLike,
        features: Mapping[str, ArrayLike],
        *,
        model_name: str = FEATURE_ENTRY_MODEL_NAME,
        request_id: str | None = None,
    ) -> DispatchResult:
        """Send already encoded pair features to the `dispatch_features` ensemble.

        `features` holds the tensors of `contracts.FEATURE_ENTRY_INPUTS` (one window, without
        the batch dimension): PAIR_FEATURES [B x N, NUM_PAIR_FEATURES] (the served model
        versions' layout, rows in CANDIDATE_RIDER_INDEX order), CANDIDATE_RIDER_INDEX [B, N],
        ORDER_TEXT [B, 1] (the user ids, for canary routing; ORDER_USER_IDS [B] is taken in its
        place), RIDER_IDS [R], RIDER_FIELDS [R, 6] (`RIDER_FIELD_COLUMNS`; the resolver reads load
        and capacity) and optionally OBJECTIVE_WEIGHTS, MODEL_VERSION_TAG and ORDER_FIELDS
        [B, 7] (`ORDER_FIELD_COLUMNS`: with it the resolution is stack-aware, as `dispatch`'s;
        the resolver reads created_at). `order_ids`
        ([B]) label the results; they are not sent. `request_id` as in `dispatch`. Numeric
        tensors are cast to the contract's dtypes. Raises ValueError for an unknown or
        missing tensor or inconsistent shapes (before any network traffic), and the
        transport's errors.
        """
        features = dict(features)
        users = features.pop("ORDER_USER_IDS", None)
        if users is not None and features.get(ORDER_TEXT.name) is None:
            features[ORDER_TEXT.name] = np.asarray(users, dtype=object).reshape(-1, 1)
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
        text = inputs[ORDER_TEXT.name]
        if text.ndim != 2 or text.shape[0] != len(ids):
            raise ValueError(f"ORDER_TEXT must have shape [{len(ids)}, *] like the order ids")
        if pairs.shape[0] != candidates.size:
            raise ValueError(
                f"PAIR_FEATURES must have B x N = {candidates.size} rows, got {pairs.shape[0]}"
            )
        return self._call(
            model_name,
            inputs,
            request_id,
            ids,
            options=self._request_options({"ORDER_USER_IDS": text[:, 0]}),
            output_names=_FEATURE_OUTPUT_NAMES,
        )

    def _call(
        self,
        model_name: str,
        inputs: dict[str, NDArray[Any]],
        request_id: str | None,
        order_ids: ArrayLike | None = None,
        *,
        options: Mapping[str, Any] | None = None,
        output_names: tuple[str, ...] = OUTPUT_NAMES,
    ) -> DispatchResult:
        """One window (batch dimension 1) under one id, with the caller's priority and
        deadline (`options`), sent again under the same id by `self.retry` when refused
        without work; the id rides on the error or the result. The answer's rider indices
        become the window's rider ids."""
        rid = new_request_id() if request_id is None else request_id
        ids = inputs["ORDER_IDS"] if order_ids is None else order_ids
        wire = batched(inputs)
        try:
            outputs = self.retry.call(
                lambda: self.transport.infer(
                    model_name, wire, output_names, request_id=rid, **(options or {})
                ),
                throttle=self.retry_throttle,
            )
            result = parse_dispatch_outputs(ids, unbatched_outputs(outputs), inputs["RIDER_IDS"])
        except DispatchError as exc:
            exc.request_id = rid
            raise
        return DispatchResult(result.orders, request_id=rid, city=result.city)

    def report_outcomes(
        self,
        outcomes: Iterable[OutcomeReport | dict[str, Any]],
        *,
        url: str = DEFAULT_OUTCOMES_URL,
        key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> OutcomeReceipt:
        """Tell the server what became of the orders it decided (`outcomes.report_outcomes`:
        ``url`` is the launcher's HTTP service, not Triton's; ``key`` the outcome key)."""
        return report_outcomes(outcomes, url=url, key=key, timeout_s=timeout_s)

    def close(self) -> None:
        self.transport.close()


def unbatched_outputs(outputs: Mapping[str, ArrayLike]) -> dict[str, NDArray[Any]]:
    """A one-window answer without its batch dimension of 1 (DispatchServerError otherwise)."""
    out: dict[str, NDArray[Any]] = {}
    for name, value in outputs.items():
        array = np.asarray(value)
        if array.ndim == 0 or array.shape[0] != 1:
            raise DispatchServerError(
                f"malformed response: {name} has shape {array.shape}, expected a batch of 1"
            )
        out[name] = array[0]
    return out


def parse_dispatch_outputs(
    order_ids: ArrayLike, outputs: Mapping[str, ArrayLike], rider_ids: ArrayLike
) -> DispatchResult:
    """Turn the v2 answer (one window, no batch dimension) into per-order results: rider
    indices become the window's rider ids, padding (-1) is dropped.

    Raises DispatchServerError when an output is missing or shaped against the contract.
    """
    ids = [_text(v) for v in np.asarray(order_ids, dtype=object).reshape(-1)]
    riders = np.asarray(rider_ids, dtype=object).reshape(-1)
    count = len(ids)
    index = _output(outputs, "TOPK_RIDER_INDEX")
    width = index.shape[1] if index.ndim == 2 else -1
    if index.shape != (count, width):
        raise DispatchServerError(
            f"malformed response: TOPK_RIDER_INDEX has shape {index.shape}, "
            f"expected ({count}, K) for {count} orders"
        )
    objectives = _output(outputs, "TOPK_OBJECTIVES")
    expected = (count, width, len(TOPK_OBJECTIVE_COLUMNS))
    if objectives.shape != expected:
        raise DispatchServerError(
            f"malformed response: TOPK_OBJECTIVES has shape {objectives.shape}, expected {expected}"
        )
    assigned_index = _output(outputs, "ASSIGNED_RIDER_INDEX")
    assigned_score = _output(outputs, "ASSIGNED_SCORE")
    for name, array in (
        ("ASSIGNED_RIDER_INDEX", assigned_index),
        ("ASSIGNED_SCORE", assigned_score),
    ):
        if array.shape != (count,):
            raise DispatchServerError(
                f"malformed response: {name} has shape {array.shape}, expected ({count},)"
            )
    bad = (index >= len(riders)).any() or (assigned_index >= len(riders)).any()
    if bad:
        raise DispatchServerError(
            f"malformed response: a rider index is not below the window's {len(riders)} riders"
        )

    assigned_objectives = _optional_output(
        outputs, ASSIGNED_OBJECTIVES.name, (count, len(OBJECTIVES))
    )
    versions = _optional_output(outputs, "ORDER_MODEL_VERSION", (count,))
    levels = _optional_output(outputs, "ORDER_FALLBACK_LEVEL", (count,))
    sources = _location_sources(outputs, count)
    city = _optional_output(outputs, WINDOW_CITY.name, (1,))
    results = []
    for row, order_id in enumerate(ids):
        top_k = tuple(
            Candidate(
                rider_id=_text(riders[int(index[row, slot])]),
                score=_short_float(objectives[row, slot, _SCORE]),
                eta_minutes=_short_float(objectives[row, slot, _ETA]),
                ontime_probability=_short_float(objectives[row, slot, _ONTIME]),
                cost=_short_float(objectives[row, slot, _COST]),
            )
            for slot in range(width)
            if int(index[row, slot]) >= 0
        )
        chosen = int(assigned_index[row])
        figures: list[float | None] = [None] * len(OBJECTIVES)
        if chosen >= 0 and assigned_objectives is not None:
            figures = [_short_float(value) for value in assigned_objectives[row]]
        results.append(
            OrderResult(
                order_id=order_id,
                top_k=top_k,
                assigned_rider_id=_text(riders[chosen]) if chosen >= 0 else None,
                assigned_score=_short_float(assigned_score[row]) if chosen >= 0 else None,
                assigned_eta_minutes=figures[0],
                assigned_ontime_probability=figures[1],
                assigned_cost=figures[2],
                model_version=None if versions is None else int(versions[row]),
                fallback_level=None if levels is None else int(levels[row]),
                pickup_source=None if sources is None else sources[row][0],
                dropoff_source=None if sources is None else sources[row][1],
            )
        )
    return DispatchResult(orders=tuple(results), city=None if city is None else _text(city[0]))


def _location_sources(outputs: Mapping[str, ArrayLike], count: int) -> list[tuple[str, str]] | None:
    """ORDER_LOCATION_SOURCE by name per order (pickup, drop-off); None when absent."""
    value = outputs.get("ORDER_LOCATION_SOURCE")
    if value is None:
        return None
    array = np.asarray(value)
    if array.shape != (count, 2) or not np.isin(array, list(LOCATION_SOURCE_NAMES)).all():
        raise DispatchServerError(
            f"malformed response: ORDER_LOCATION_SOURCE has shape {array.shape} or values "
            f"outside {sorted(LOCATION_SOURCE_NAMES)}, expected ({count}, 2)"
        )
    names = LOCATION_SOURCE_NAMES
    return [(names[int(p)], names[int(d)]) for p, d in array.tolist()]


def _optional_output(
    outputs: Mapping[str, ArrayLike], name: str, shape: tuple[int, ...]
) -> NDArray[Any] | None:
    """An output an older server may not send, of this ``shape``; None when it is absent."""
    value = outputs.get(name)
    if value is None:
        return None
    array = np.asarray(value)
    if array.shape != shape:
        raise DispatchServerError(
            f"malformed response: {name} has shape {array.shape}, expected {shape}"
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
