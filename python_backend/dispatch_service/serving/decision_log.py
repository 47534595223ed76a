"""Decision records from the entry points (`outcomes`): each answered window handed to the
stub's `DecisionWriter` as an `AnsweredWindow`, off the request path.

`dispatch_fused` and `dispatch_priority` hand over their `FusedResult`; the `dispatch`
ensemble's records come from its last step, `topk_resolver`, which gets the window's
ids, city, routing outputs and decision time beside its own inputs (optional inputs: a
request without them, such as `dispatch_features`' without WINDOW_FIELDS, records nothing).
A window without a request id records nothing either: its decisions could not be named.

The store's address comes from the launcher through the environment (`OUTCOME_STORE_ENV`),
not from a config parameter, for the reason `live_routing` gives. Unset: no records.
Arrays are copied where they may be Triton's request buffers, which it reuses after the
answer.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    ORDER_FALLBACK_LEVEL,
    ORDER_FIELD_COLUMNS,
    ORDER_MODEL_VERSION,
    WINDOW_CITY,
    WINDOW_FIELD_COLUMNS,
)
from dispatch_service.core.log_text import describe_error
from dispatch_service.core.metrics import Observation
from dispatch_service.domain.window_wire import user_ids_from_wire
from dispatch_service.outcomes.records import AnsweredWindow
from dispatch_service.outcomes.sql_store import open_store
from dispatch_service.outcomes.store import OUTCOME_STORE_ENV
from dispatch_service.outcomes.writer import DecisionWriter, writer_observations
from dispatch_service.serving.backend_log import log_event

if TYPE_CHECKING:  # the fused pipeline is not loaded by topk_resolver's stub
    from dispatch_service.pipeline.fused import FusedResult

__all__ = [
    "decision_writer",
    "fused_answered_window",
    "log_decision",
    "request_id_of",
    "resolver_answered_window",
]

_CREATED_AT = ORDER_FIELD_COLUMNS.index("created_at")
_PROMISED = ORDER_FIELD_COLUMNS.index("promised_minutes")
_DISPATCH_TIME = WINDOW_FIELD_COLUMNS.index("dispatch_time")


def decision_writer(
    pb_utils: Any,
    model_name: str,
    record: Callable[[list[Observation]], None],
    environ: Mapping[str, str] | None = None,
) -> DecisionWriter | None:
    """The stub's writer to the launcher's store, its counts recorded through ``record``
    (the model's metrics) and its store failures logged; None where no store is named."""
    url = (os.environ if environ is None else environ).get(OUTCOME_STORE_ENV, "")
    if not url:
        return None

    def failed(exc: Exception) -> None:
        log_event(
            pb_utils,
            "warn",
            event="decision_store_failed",
            model=model_name,
            error=describe_error(exc),
        )

    return DecisionWriter(
        lambda: open_store(url),
        on_counts=lambda change: record(writer_observations(change)),
        on_error=failed,
    )


def request_id_of(request: Any) -> str:
    """Triton's request id ("" where the request has none or cannot say)."""
    try:
        return str(request.request_id() or "")
    except Exception:
        return ""


def fused_answered_window(
    request_id: str, entry_point: str, result: FusedResult
) -> AnsweredWindow | None:
    """A `dispatch_fused` / `dispatch_priority` answer (None without its window)."""
    window = result.window
    if window is None:
        return None
    outputs = result.outputs
    return AnsweredWindow(
        request_id=request_id,
        entry_point=entry_point,
        city=result.city or "",
        dispatch_time=float(window.dispatch_time),
        order_ids=window.order_ids,
        user_ids=window.order_user_ids,
        created_at=window.created_at,
        promised_minutes=window.promised_minutes,
        rider_ids=window.rider_ids,
        weights=result.weights,
        model_version=result.routed.model_version,
        fallback_level=result.routed.fallback_level,
        topk_rider_index=outputs["TOPK_RIDER_INDEX"],
        assigned_rider_index=outputs["ASSIGNED_RIDER_INDEX"],
        assigned_objectives=outputs["ASSIGNED_OBJECTIVES"],
    )


def _copy(value: NDArray[Any] | None) -> NDArray[Any] | None:
    return None if value is None else np.array(value, copy=True)


def resolver_answered_window(
    request_id: str,
    entry_point: str,
    inputs: Mapping[str, NDArray[Any] | None],
    outputs: Mapping[str, NDArray[Any]],
) -> AnsweredWindow | None:
    """An ensemble's answer as its `topk_resolver` step sees it; None where the step's
    request lacks what a record needs (ids, order fields, decision time, versions)."""
    order_ids = inputs.get("ORDER_IDS")
    fields = inputs.get("ORDER_FIELDS")
    window_fields = inputs.get("WINDOW_FIELDS")
    versions = inputs.get(ORDER_MODEL_VERSION.name)
    if order_ids is None or fields is None or window_fields is None or versions is None:
        return None
    if inputs.get("ORDER_TEXT") is None:
        return None
    city = inputs.get(WINDOW_CITY.name)
    city_text = "" if city is None else np.asarray(city).reshape(-1)[0]
    if isinstance(city_text, bytes):
        city_text = city_text.decode("utf-8", "replace")
    return AnsweredWindow(
        request_id=request_id,
        entry_point=entry_point,
        city=str(city_text),
        dispatch_time=float(np.asarray(window_fields).reshape(-1)[_DISPATCH_TIME]),
        order_ids=np.array(order_ids, dtype=object, copy=True),
        user_ids=np.array(user_ids_from_wire(inputs), dtype=object, copy=True),
        created_at=np.array(fields[:, _CREATED_AT], copy=True),
        promised_minutes=np.array(fields[:, _PROMISED], copy=True),
        rider_ids=np.array(inputs["RIDER_IDS"], dtype=object, copy=True),
        weights=_copy(inputs.get("OBJECTIVE_WEIGHTS")),
        model_version=np.array(versions, copy=True),
        fallback_level=_copy(inputs.get(ORDER_FALLBACK_LEVEL.name)),
        topk_rider_index=outputs["TOPK_RIDER_INDEX"],
        assigned_rider_index=outputs["ASSIGNED_RIDER_INDEX"],
        assigned_objectives=outputs["ASSIGNED_OBJECTIVES"],
    )


def log_decision(
    writer: DecisionWriter | None,
    request: Any,
    entry_point: str,
    build: Callable[[str], AnsweredWindow | None],
) -> None:
    """Hand one answered request's window to ``writer`` (None: records are off). A window
    without a request id is not recorded. Never raises: a record is never worth a request."""
    if writer is None:
        return
    try:
        request_id = request_id_of(request)
        window = build(request_id) if request_id else None
        if window is not None:
            writer.submit(window)
    except Exception:  # counted, never raised: the answer is already made
        writer.count_unreadable()
