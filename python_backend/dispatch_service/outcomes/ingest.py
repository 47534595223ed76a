"""Checking an outcome report (`dispatch_contract.outcomes`) and storing what passes.

`ingest_report` reads the body (size, UTF-8, JSON, shape), checks each record on its own
and stores the good ones in one transaction; a record that fails is refused with its
`RefusalReason` and never stored, and never stops the others. The shape of a record
(fields, types, ids) is a pydantic model per status; the rest needs the store: the
decision must exist, the times must lie after it (and not after the server's clock), a
delivery must name the assigned rider, and an outcome already stored is either the same
(a resend: counted as a duplicate, stored once) or a conflict (refused).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
)
from pydantic_core import PydanticCustomError

from dispatch_contract.outcomes import (
    MAX_CLOCK_SKEW_S,
    MAX_OUTCOME_BODY_BYTES,
    MAX_OUTCOME_DELAY_S,
    MAX_OUTCOME_ID_BYTES,
    MAX_OUTCOMES_PER_REPORT,
    OutcomeStatus,
    RefusalReason,
)
from dispatch_service.outcomes.records import DecisionId, Outcome
from dispatch_service.outcomes.store import DecisionFacts, OutcomeStore

__all__ = [
    "Refusal",
    "ReportAnswer",
    "ReportRefusedError",
    "ingest_report",
    "parse_outcome",
    "store_outcomes",
]


class ReportRefusedError(Exception):
    """The whole report is refused (nothing stored): HTTP ``status``, a named reason."""

    def __init__(self, status: int, reason: RefusalReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.status = status
        self.reason = reason
        self.detail = detail

    def to_json_dict(self) -> dict[str, Any]:
        return {"error": str(self.reason), "detail": self.detail}


@dataclass(frozen=True)
class Refusal:
    index: int  # the record's position in the report
    reason: RefusalReason
    detail: str
    request_id: str | None = None
    order_id: str | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "request_id": self.request_id,
            "order_id": self.order_id,
            "reason": str(self.reason),
            "detail": self.detail,
        }


@dataclass
class ReportAnswer:
    stored: int = 0
    duplicates: int = 0
    refused: list[Refusal] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "stored": self.stored,
            "duplicates": self.duplicates,
            "refused": [r.to_json_dict() for r in self.refused],
        }


# ---- the shape of one record -----------------------------------------------------------


# Control characters (C0, DEL) and lone surrogates (JSON's "\\ud800") are no part of an id.
_NOT_IN_IDS: Final = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def _check_id(value: str) -> str:
    if _NOT_IN_IDS.search(value) is not None:
        raise PydanticCustomError("bad_id", "must not contain control characters")
    size = len(value.encode("utf-8"))
    if not 1 <= size <= MAX_OUTCOME_ID_BYTES:
        raise PydanticCustomError(
            "bad_id", f"must be 1..{MAX_OUTCOME_ID_BYTES} UTF-8 bytes, got {size}"
        )
    return value


Id = Annotated[str, Field(strict=True), AfterValidator(_check_id)]
# Unix seconds: a JSON number (not a string, not a boolean), finite.
Time = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    request_id: Id
    order_id: Id


class _Delivered(_Record):
    status: Literal[OutcomeStatus.DELIVERED]
    picked_up_at: Time
    delivered_at: Time
    rider_id: Id


class _Cancelled(_Record):
    status: Literal[OutcomeStatus.CANCELLED]
    cancelled_at: Time


class _Reassigned(_Record):
    status: Literal[OutcomeStatus.REASSIGNED]
    reassigned_at: Time
    rider_id: Id | None = None


_RECORD: Final = TypeAdapter(
    Annotated[_Delivered | _Cancelled | _Reassigned, Field(discriminator="status")]
)

# pydantic's error types -> the reason named to the client (anything else: a wrong type).
_REASONS: Final = {
    "missing": RefusalReason.MISSING_FIELD,
    "extra_forbidden": RefusalReason.UNKNOWN_FIELD,
    "union_tag_invalid": RefusalReason.BAD_STATUS,
    "union_tag_not_found": RefusalReason.MISSING_FIELD,
    "model_attributes_type": RefusalReason.NOT_AN_OBJECT,
    "model_type": RefusalReason.NOT_AN_OBJECT,
    "finite_number": RefusalReason.BAD_TIME,
    "bad_id": RefusalReason.BAD_ID,
}


def _ids_of(item: Any) -> tuple[str | None, str | None]:
    """The record's ids where they are strings (for the refusal), else None."""
    if not isinstance(item, dict):
        return None, None
    ids = (item.get("request_id"), item.get("order_id"))
    return tuple(v if isinstance(v, str) and len(v) <= 256 else None for v in ids)  # type: ignore[return-value]


def parse_outcome(item: Any, index: int = 0) -> Outcome | Refusal:
    """One record's shape checked: an `Outcome`, or its `Refusal` (the first error)."""
    if not isinstance(item, dict):
        return Refusal(index, RefusalReason.NOT_AN_OBJECT, "each outcome must be a JSON object")
    try:
        record = _RECORD.validate_python(item)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        reason = _REASONS.get(error["type"], RefusalReason.WRONG_TYPE)
        if error["type"].startswith("union_tag"):
            detail = f"status: must be one of {', '.join(OutcomeStatus)}"
        else:  # the field's name (behind the status tag pydantic puts first), and the rule
            detail = f"{'.'.join(str(part) for part in error['loc'][1:])}: {error['msg']}"
        request_id, order_id = _ids_of(item)
        return Refusal(index, reason, detail, request_id, order_id)
    if isinstance(record, _Delivered):
        return Outcome(
            record.request_id,
            record.order_id,
            OutcomeStatus.DELIVERED,
            picked_up_at=record.picked_up_at,
            delivered_at=record.delivered_at,
            rider_id=record.rider_id,
        )
    if isinstance(record, _Cancelled):
        return Outcome(
            record.request_id,
            record.order_id,
            OutcomeStatus.CANCELLED,
            ended_at=record.cancelled_at,
        )
    return Outcome(
        record.request_id,
        record.order_id,
        OutcomeStatus.REASSIGNED,
        ended_at=record.reassigned_at,
        rider_id=record.rider_id,
    )


# ---- against the decision ----------------------------------------------------------------


def _check_against(
    outcome: Outcome, decision: DecisionFacts, now: float
) -> tuple[RefusalReason, str] | None:
    times = [
        t for t in (outcome.picked_up_at, outcome.delivered_at, outcome.ended_at) if t is not None
    ]
    if any(t < decision.decided_at for t in times):
        return (
            RefusalReason.BEFORE_DECISION,
            f"a time is before the decision ({decision.decided_at:.0f})",
        )
    if any(t > decision.decided_at + MAX_OUTCOME_DELAY_S for t in times):
        return (
            RefusalReason.TOO_LATE,
            f"a time is more than {MAX_OUTCOME_DELAY_S} s after the decision",
        )
    if any(t > now + MAX_CLOCK_SKEW_S for t in times):
        return (
            RefusalReason.IN_FUTURE,
            f"a time is more than {MAX_CLOCK_SKEW_S} s after the server's clock",
        )
    if (
        outcome.picked_up_at is not None
        and outcome.delivered_at is not None
        and outcome.picked_up_at > outcome.delivered_at
    ):
        return RefusalReason.BAD_TIME, "picked_up_at is after delivered_at"
    if outcome.status is OutcomeStatus.DELIVERED and outcome.rider_id != decision.assigned_rider:
        assigned = "no rider" if decision.assigned_rider is None else "another rider"
        return RefusalReason.RIDER_NOT_ASSIGNED, (
            f"the decision assigned {assigned}: report a delivery by another rider as reassigned"
        )
    return None


def ingest_report(
    body: bytes,
    store: OutcomeStore,
    *,
    clock: Callable[[], float] = time.time,
) -> ReportAnswer:
    """Check the report and store its good records; raises ReportRefusedError when the body
    cannot be read as a report, StoreError when the store is down (nothing stored)."""
    if len(body) > MAX_OUTCOME_BODY_BYTES:
        raise ReportRefusedError(
            413, RefusalReason.BODY_TOO_LARGE, f"at most {MAX_OUTCOME_BODY_BYTES} bytes"
        )
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReportRefusedError(
            400, RefusalReason.NOT_UTF8, f"byte {exc.start}: not UTF-8"
        ) from None
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ReportRefusedError(400, RefusalReason.NOT_JSON, str(exc)[:200]) from None
    if (
        not isinstance(document, dict)
        or set(document) != {"outcomes"}
        or not isinstance(document["outcomes"], list)
    ):
        raise ReportRefusedError(
            400, RefusalReason.NOT_A_REPORT, 'the body must be {"outcomes": [...]} and no more'
        )
    items: list[Any] = document["outcomes"]
    if len(items) > MAX_OUTCOMES_PER_REPORT:
        raise ReportRefusedError(
            413,
            RefusalReason.TOO_MANY_OUTCOMES,
            f"{len(items)} outcomes: at most {MAX_OUTCOMES_PER_REPORT} per report",
        )
    return store_outcomes([parse_outcome(item, i) for i, item in enumerate(items)], store, clock())


def store_outcomes(
    parsed: Sequence[Outcome | Refusal], store: OutcomeStore, now: float
) -> ReportAnswer:
    """The shape-checked records checked against their decisions, the good ones stored."""
    answer = ReportAnswer()
    seen: set[DecisionId] = set()
    candidates: list[tuple[int, DecisionId, Outcome]] = []
    for index, item in enumerate(parsed):
        if isinstance(item, Refusal):
            answer.refused.append(item)
            continue
        key = item.decision_id
        if key in seen:
            answer.refused.append(
                _refuse(
                    index,
                    item,
                    RefusalReason.DUPLICATE_IN_REPORT,
                    "this decision's outcome came earlier in the report",
                )
            )
        else:
            seen.add(key)
            candidates.append((index, key, item))
    ids = [key for _, key, _ in candidates]
    decisions = store.decisions(ids)
    stored = store.outcomes([i for i in ids if i in decisions])
    fresh: list[Outcome] = []
    for index, key, outcome in candidates:
        decision = decisions.get(key)
        if decision is None:
            answer.refused.append(
                _refuse(
                    index,
                    outcome,
                    RefusalReason.UNKNOWN_DECISION,
                    "no decision is recorded under this id",
                )
            )
            continue
        problem = _check_against(outcome, decision, now)
        if problem is not None:
            answer.refused.append(_refuse(index, outcome, *problem))
            continue
        previous = stored.get(key)
        if previous is None:
            fresh.append(outcome)
        elif previous.same_as(outcome):
            answer.duplicates += 1
        else:
            answer.refused.append(
                _refuse(
                    index,
                    outcome,
                    RefusalReason.CONFLICTING_OUTCOME,
                    f"a different outcome ({previous.status}) is stored",
                )
            )
    written = store.write_outcomes(fresh, received_at=now)
    answer.stored = written
    answer.duplicates += len(fresh) - written  # stored meanwhile by a concurrent report
    answer.refused.sort(key=lambda refusal: refusal.index)
    return answer


def _refuse(index: int, outcome: Outcome, reason: RefusalReason, detail: str) -> Refusal:
    return Refusal(index, reason, detail, outcome.request_id, outcome.order_id)
