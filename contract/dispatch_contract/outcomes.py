"""The outcome report's wire format: how the platform tells the service what became of the
orders it decided (`POST /v1/outcomes` on the launcher's HTTP port), and why a report or
one of its records is refused.

Both sides need it: the client builds reports (`dispatch_client.outcomes`), the server
checks them (`dispatch_service.outcomes`). A decision is named by the request id the
window was sent under and the order's id; one outcome per decision.

The body is JSON (UTF-8), at most `MAX_OUTCOME_BODY_BYTES`, with the outcome key in the
`OUTCOME_KEY_HEADER` header::

    {"outcomes": [
      {"request_id": "9f0c...", "order_id": "o-17", "status": "delivered",
       "picked_up_at": 1717000300.0, "delivered_at": 1717001500.0, "rider_id": "r-3"},
      {"request_id": "9f0c...", "order_id": "o-18", "status": "cancelled",
       "cancelled_at": 1717000200},
      {"request_id": "9f0c...", "order_id": "o-19", "status": "reassigned",
       "reassigned_at": 1717000250, "rider_id": "r-9"}
    ]}

Times are unix seconds (numbers). Per status, the fields in `STATUS_FIELDS` are required
and no others are allowed (``rider_id`` is optional for ``reassigned``). A ``delivered``
outcome names the rider the service assigned; ``reassigned`` is an order the platform gave
to another rider (or assigned itself where the service left it unassigned). Every time
must lie in [decision time, decision time + `MAX_OUTCOME_DELAY_S`], the decision time being
the window's DISPATCH_TIME, and not after the server's clock + `MAX_CLOCK_SKEW_S`;
``picked_up_at`` <= ``delivered_at``.

The answer (HTTP 200 whenever the body could be read) gives, per record, whether it was
stored, already stored (the same outcome sent again: idempotent), or refused with a
`RefusalReason`; the other records of the report are stored regardless::

    {"stored": 1, "duplicates": 1, "refused": [
      {"index": 2, "request_id": "9f0c...", "order_id": "o-19",
       "reason": "unknown_decision", "detail": "no decision recorded for this id"}]}

A report that cannot be read at all is answered with its status and
``{"error": <RefusalReason>, "detail": ...}``: 401 (``missing_key``, ``wrong_key``),
413 (``body_too_large``, ``too_many_outcomes``), 400 (``not_utf8``, ``not_json``,
``not_a_report``), 503 (``store_unavailable``).
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = [
    "MAX_CLOCK_SKEW_S",
    "MAX_OUTCOMES_PER_REPORT",
    "MAX_OUTCOME_BODY_BYTES",
    "MAX_OUTCOME_DELAY_S",
    "MAX_OUTCOME_ID_BYTES",
    "OUTCOMES_PATH",
    "OUTCOME_KEY_ENV",
    "OUTCOME_KEY_FILE_ENV",
    "OUTCOME_KEY_HEADER",
    "STATUS_FIELDS",
    "OutcomeStatus",
    "RefusalReason",
]

OUTCOMES_PATH: Final = "/v1/outcomes"
OUTCOME_KEY_HEADER: Final = "outcome-key"
OUTCOME_KEY_ENV: Final = "DISPATCH_OUTCOME_KEY"
OUTCOME_KEY_FILE_ENV: Final = "DISPATCH_OUTCOME_KEY_FILE"
# A report larger than either is refused whole (413): send it in several.
MAX_OUTCOMES_PER_REPORT: Final = 1000
MAX_OUTCOME_BODY_BYTES: Final = 512 * 1024
# An outcome more than this after its decision is refused (a day covers every promise).
MAX_OUTCOME_DELAY_S: Final = 86_400
# A time after the server's clock by more than this is refused (it has not happened yet).
MAX_CLOCK_SKEW_S: Final = 300
MAX_OUTCOME_ID_BYTES: Final = 64  # as the window's order and request ids


class OutcomeStatus(enum.StrEnum):
    DELIVERED = "delivered"
    CANCELLED = "cancelled"
    REASSIGNED = "reassigned"


# Per status: the fields it requires, then those it may carry, besides the decision id.
STATUS_FIELDS: Final[dict[OutcomeStatus, tuple[tuple[str, ...], tuple[str, ...]]]] = {
    OutcomeStatus.DELIVERED: (("picked_up_at", "delivered_at", "rider_id"), ()),
    OutcomeStatus.CANCELLED: (("cancelled_at",), ()),
    OutcomeStatus.REASSIGNED: (("reassigned_at",), ("rider_id",)),
}


class RefusalReason(enum.StrEnum):
    """Why a record (or a whole report) was refused; the answer names it."""

    # a whole report
    MISSING_KEY = "missing_key"
    WRONG_KEY = "wrong_key"
    BODY_TOO_LARGE = "body_too_large"
    TOO_MANY_OUTCOMES = "too_many_outcomes"
    NOT_UTF8 = "not_utf8"
    NOT_JSON = "not_json"
    NOT_A_REPORT = "not_a_report"  # not {"outcomes": [...]}
    STORE_UNAVAILABLE = "store_unavailable"
    # one record
    NOT_AN_OBJECT = "not_an_object"
    MISSING_FIELD = "missing_field"
    UNKNOWN_FIELD = "unknown_field"  # a field the record's status does not take
    WRONG_TYPE = "wrong_type"
    BAD_ID = "bad_id"  # empty, longer than MAX_OUTCOME_ID_BYTES or with control characters
    BAD_STATUS = "bad_status"
    BAD_TIME = "bad_time"  # not finite, or picked up after delivered
    BEFORE_DECISION = "before_decision"
    TOO_LATE = "too_late"  # more than MAX_OUTCOME_DELAY_S after the decision
    IN_FUTURE = "in_future"  # after the server's clock by more than MAX_CLOCK_SKEW_S
    UNKNOWN_DECISION = "unknown_decision"
    RIDER_NOT_ASSIGNED = "rider_not_assigned"
    DUPLICATE_IN_REPORT = "duplicate_in_report"  # the same decision twice in one report
    CONFLICTING_OUTCOME = "conflicting_outcome"  # a different outcome is already stored
