"""Reporting outcomes: what became of the orders the service decided
(`dispatch_contract.outcomes` is the wire format; the server's launcher answers it).

    from dispatch_client import DispatchClient
    from dispatch_client.outcomes import OutcomeReport

    receipt = client.report_outcomes(
        [OutcomeReport.delivered(result.request_id, "o-17", picked_up_at=..., delivered_at=...,
                                 rider_id="r-3")],
        url="http://127.0.0.1:8003",
    )
    receipt.refused  # each refused record with its reason; the others were stored

`report_outcomes` sends any number of records as reports of at most
`MAX_OUTCOMES_PER_REPORT` each, with the outcome key (argument, else ``DISPATCH_OUTCOME_KEY``,
else the file named by ``DISPATCH_OUTCOME_KEY_FILE``). Sending the same records again is
safe: a stored outcome is counted as a duplicate, not stored twice.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from dispatch_client.errors import DispatchConnectionError, DispatchServerError
from dispatch_contract.keys import read_key
from dispatch_contract.outcomes import (
    MAX_OUTCOME_BODY_BYTES,
    MAX_OUTCOMES_PER_REPORT,
    OUTCOME_KEY_ENV,
    OUTCOME_KEY_HEADER,
    OUTCOMES_PATH,
    OutcomeStatus,
)

__all__ = [
    "DEFAULT_OUTCOMES_URL",
    "OutcomeReceipt",
    "OutcomeReport",
    "RefusedOutcome",
    "report_outcomes",
]

# The launcher's HTTP service of `make serve` (metrics port + 1).
DEFAULT_OUTCOMES_URL: Final = "http://127.0.0.1:8003"


@dataclass(frozen=True)
class OutcomeReport:
    """One record: the decision's id (the window's request id and the order id) and what
    happened. Build it with `delivered`, `cancelled` or `reassigned`."""

    request_id: str
    order_id: str
    status: OutcomeStatus
    times: tuple[tuple[str, float], ...]
    rider_id: str | None = None

    @classmethod
    def delivered(
        cls,
        request_id: str,
        order_id: str,
        *,
        picked_up_at: float,
        delivered_at: float,
        rider_id: str,
    ) -> OutcomeReport:
        times = (("picked_up_at", picked_up_at), ("delivered_at", delivered_at))
        return cls(request_id, order_id, OutcomeStatus.DELIVERED, times, rider_id)

    @classmethod
    def cancelled(cls, request_id: str, order_id: str, *, cancelled_at: float) -> OutcomeReport:
        return cls(request_id, order_id, OutcomeStatus.CANCELLED, (("cancelled_at", cancelled_at),))

    @classmethod
    def reassigned(
        cls, request_id: str, order_id: str, *, reassigned_at: float, rider_id: str | None = None
    ) -> OutcomeReport:
        times = (("reassigned_at", reassigned_at),)
        return cls(request_id, order_id, OutcomeStatus.REASSIGNED, times, rider_id)

    def to_json_dict(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "request_id": self.request_id,
            "order_id": self.order_id,
            "status": str(self.status),
        }
        record.update((name, float(value)) for name, value in self.times)
        if self.rider_id is not None:
            record["rider_id"] = self.rider_id
        return record


@dataclass(frozen=True)
class RefusedOutcome:
    index: int  # position among the records given to `report_outcomes`
    reason: str  # a `dispatch_contract.outcomes.RefusalReason` value
    detail: str
    request_id: str | None
    order_id: str | None


@dataclass
class OutcomeReceipt:
    stored: int = 0
    duplicates: int = 0
    refused: list[RefusedOutcome] = field(default_factory=list)

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "stored": self.stored,
            "duplicates": self.duplicates,
            "refused": [vars(r) for r in self.refused],
        }


def _reports(records: Sequence[dict[str, Any]]) -> Iterable[tuple[int, bytes]]:
    """(offset, body) per report: at most MAX_OUTCOMES_PER_REPORT records and
    MAX_OUTCOME_BODY_BYTES each (a report too large is split in two)."""
    pending = [
        (start, records[start : start + MAX_OUTCOMES_PER_REPORT])
        for start in range(0, len(records), MAX_OUTCOMES_PER_REPORT)
    ]
    while pending:
        start, chunk = pending.pop(0)
        body = json.dumps({"outcomes": list(chunk)}, separators=(",", ":")).encode("utf-8")
        if len(body) <= MAX_OUTCOME_BODY_BYTES or len(chunk) == 1:
            yield start, body
        else:
            half = len(chunk) // 2
            pending[:0] = [(start, chunk[:half]), (start + half, chunk[half:])]


def report_outcomes(
    outcomes: Iterable[OutcomeReport | dict[str, Any]],
    *,
    url: str = DEFAULT_OUTCOMES_URL,
    key: str | None = None,
    timeout_s: float = 30.0,
) -> OutcomeReceipt:
    """Send the records (`OutcomeReport`s, or dicts already in the wire format); returns
    what the server stored and refused. Raises DispatchServerError when a report is refused
    whole (a wrong key, a body too large, the store unavailable: the reason in the message,
    the HTTP status in ``status``) and DispatchConnectionError when the server cannot be
    reached; the reports sent before it stay stored (send them all again: idempotent)."""
    resolved_key = read_key(key, OUTCOME_KEY_ENV)
    records = [o.to_json_dict() if isinstance(o, OutcomeReport) else dict(o) for o in outcomes]
    receipt = OutcomeReceipt()
    endpoint = url.rstrip("/") + OUTCOMES_PATH
    for start, body in _reports(records):
        answer = _post(endpoint, body, resolved_key, timeout_s)
        receipt.stored += int(answer["stored"])
        receipt.duplicates += int(answer["duplicates"])
        receipt.refused.extend(
            RefusedOutcome(
                index=start + int(item["index"]),
                reason=str(item["reason"]),
                detail=str(item["detail"]),
                request_id=item.get("request_id"),
                order_id=item.get("order_id"),
            )
            for item in answer["refused"]
        )
    return receipt


def _post(endpoint: str, body: bytes, key: str | None, timeout_s: float) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers[OUTCOME_KEY_HEADER] = key
    request = urllib.request.Request(endpoint, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            answer: dict[str, Any] = json.loads(response.read())
            return answer
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")
        try:
            detail = json.loads(text)
            message = f"{detail['error']}: {detail['detail']}"
        except (ValueError, KeyError, TypeError):
            message = text.strip()[:300]
        raise DispatchServerError(
            f"outcome report refused (HTTP {exc.code}): {message}", status=str(exc.code)
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        raise DispatchConnectionError(f"cannot reach {endpoint}: {exc}") from None
