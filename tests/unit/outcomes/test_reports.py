"""Outcome reports over real HTTP (the aiohttp routes, a real SQLite store): good reports
stored once, and >= 200 malformed and hostile ones, generated here, each refused with its
named reason; nothing wrong is stored and the service answers the next good report."""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from dispatch_client.errors import DispatchServerError
from dispatch_client.outcomes import OutcomeReport, report_outcomes
from dispatch_contract.outcomes import (
    MAX_OUTCOME_BODY_BYTES,
    MAX_OUTCOME_DELAY_S,
    MAX_OUTCOMES_PER_REPORT,
    OUTCOME_KEY_HEADER,
    OUTCOMES_PATH,
    RefusalReason,
)
from dispatch_service.outcomes.records import DecisionId, decision_records
from dispatch_service.outcomes.service import OutcomeService, serve_outcomes
from dispatch_service.outcomes.sql_store import open_store

from .outcome_helpers import DECIDED_AT, NOW, answered_window, delivered

KEY = "test-outcome-key"
REQUESTS = 40  # decisions req-0..req-39, orders o0, o1 (assigned r0, r1) and o2 (unassigned)


@dataclass
class Running:
    url: str
    host: str
    port: int
    service: OutcomeService
    path: Path


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    path = tmp_path / "outcomes.sqlite3"
    store = open_store(path)
    for n in range(REQUESTS):
        store.write_decisions(decision_records(answered_window(f"req-{n}")), recorded_at=NOW)
    store.close()
    service = OutcomeService(str(path), KEY, clock=lambda: NOW)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(serve_outcomes(service))
    ready = threading.Event()
    address: list[tuple[str, int]] = []

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def start() -> None:
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            host, port = runner.addresses[0][:2]
            address.append((host, port))

        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30)
    host, port = address[0]
    yield Running(f"http://{host}:{port}", host, port, service, path)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(30)
    loop.close()
    service.close()


def post(
    running: Running,
    body: bytes,
    *,
    key: str | None = KEY,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection(running.host, running.port, timeout=30)
    sent = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        sent[OUTCOME_KEY_HEADER] = key
    conn.request("POST", OUTCOMES_PATH, body=body, headers=sent)
    response = conn.getresponse()
    status, text = response.status, response.read()
    conn.close()
    return status, json.loads(text)


def report(*records: Any) -> bytes:
    return json.dumps({"outcomes": list(records)}).encode()


def test_good_reports_are_stored_once(running: Running) -> None:
    records = [
        OutcomeReport.delivered(
            "req-0",
            "o0",
            picked_up_at=DECIDED_AT + 60,
            delivered_at=DECIDED_AT + 900,
            rider_id="r0",
        ),
        OutcomeReport.cancelled("req-0", "o1", cancelled_at=DECIDED_AT + 30),
        OutcomeReport.reassigned("req-0", "o2", reassigned_at=DECIDED_AT + 50, rider_id="r9"),
    ]
    receipt = report_outcomes(records, url=running.url, key=KEY)
    assert (receipt.stored, receipt.duplicates, receipt.refused) == (3, 0, [])
    again = report_outcomes(records, url=running.url, key=KEY)  # idempotent
    assert (again.stored, again.duplicates, again.refused) == (0, 3, [])
    assert open_store(running.path).counts().outcomes == 3


def test_the_client_splits_large_sends(running: Running) -> None:
    records = [
        delivered(f"req-{n}", f"o{i}", f"r{i}") for n in range(REQUESTS) for i in range(2)
    ] * 15  # 1200 records, 80 of them new: more than one report's worth
    assert len(records) > MAX_OUTCOMES_PER_REPORT
    receipt = report_outcomes(records, url=running.url, key=KEY)
    assert receipt.stored == 80
    # the first report already repeats them (duplicate_in_report), the second resends them
    assert receipt.stored + receipt.duplicates + len(receipt.refused) == 1200
    assert {r.reason for r in receipt.refused} == {"duplicate_in_report"}
    assert max(r.index for r in receipt.refused) >= MAX_OUTCOMES_PER_REPORT  # mapped back


def test_the_client_raises_a_whole_refusal(running: Running) -> None:
    with pytest.raises(DispatchServerError, match="wrong_key") as caught:
        report_outcomes([delivered("req-0", "o0", "r0")], url=running.url, key="nope")
    assert caught.value.status == "401"


# ---- the hostile cases -----------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    reason: RefusalReason
    status: int = 200  # 200: a record refused inside an answered report
    key: str | None = KEY
    headers: tuple[tuple[str, str], ...] = ()


def whole_report_cases() -> Iterator[Case]:
    good = report(delivered("req-1", "o0", "r0"))
    yield Case("no key", good, RefusalReason.MISSING_KEY, 401, key=None)
    yield Case("empty key", good, RefusalReason.MISSING_KEY, 401, key="")
    for n, wrong in enumerate(
        ["x", KEY + "x", KEY[:-1], KEY.upper(), "admin", "'; --", "k" * 4096]
    ):
        yield Case(f"wrong key {n}", good, RefusalReason.WRONG_KEY, 401, key=wrong)
    big = b'{"outcomes": [' + b" " * (MAX_OUTCOME_BODY_BYTES + 10) + b"]}"
    yield Case("oversize body", big, RefusalReason.BODY_TOO_LARGE, 413)
    many = report(*[delivered("req-1", "o0", "r0")] * (MAX_OUTCOMES_PER_REPORT + 1))
    yield Case("too many outcomes", many, RefusalReason.TOO_MANY_OUTCOMES, 413)
    for n, raw in enumerate(
        [b"\xff\xfe", b'{"outcomes": ["\xc3\x28"]}', b"\x80abc", b'{"outcomes": []}\xed\xa0\x80']
    ):
        yield Case(f"not utf-8 {n}", raw, RefusalReason.NOT_UTF8, 400)
    for n, text in enumerate(
        [
            "",
            "{",
            "nope",
            '{"outcomes": [}',
            "[1,]",
            '{"outcomes": [] "x": 1}',
            "'single'",
            "{" * 100_000,
        ]
    ):
        yield Case(f"not json {n}", text.encode(), RefusalReason.NOT_JSON, 400)
    for n, doc in enumerate(
        [[], {}, None, 1, "x", {"outcomes": {}}, {"outcomes": "x"}, {"outcomes": None},
         {"outcomes": [], "more": 1}, {"outcome": []}, [{"outcomes": []}]]
    ):  # fmt: skip
        yield Case(f"not a report {n}", json.dumps(doc).encode(), RefusalReason.NOT_A_REPORT, 400)


def record_cases() -> Iterator[Case]:
    """One bad record per report, beside nothing else (its reason is the answer's only one)."""
    base = delivered("req-2", "o0", "r0")

    def case(name: str, record: Any, reason: RefusalReason) -> Case:
        return Case(name, report(record), reason)

    for n, item in enumerate([1, "x", None, [], [base], True, 2.5]):
        yield case(f"not an object {n}", item, RefusalReason.NOT_AN_OBJECT)
    for field in ("request_id", "order_id", "picked_up_at", "delivered_at", "rider_id", "status"):
        yield case(
            f"missing {field}",
            {k: v for k, v in base.items() if k != field},
            RefusalReason.MISSING_FIELD,
        )
    for field in ("cancelled_at", "reassigned_at", "note", "user_id", "'; DROP TABLE outcomes; --"):
        yield case(f"unknown field {field}", {**base, field: 1}, RefusalReason.UNKNOWN_FIELD)
    cancel = {"request_id": "req-2", "order_id": "o0", "status": "cancelled"}
    with_rider = {**cancel, "cancelled_at": DECIDED_AT + 1, "rider_id": "r0"}
    yield case("cancel with rider", with_rider, RefusalReason.UNKNOWN_FIELD)
    yield case("cancel without time", cancel, RefusalReason.MISSING_FIELD)
    wrong_values: list[Any] = [True, False, None, [], {}, [1], {"a": 1}]
    for field in ("picked_up_at", "delivered_at"):
        for n, value in enumerate([*wrong_values, "1709500300", "soon"]):
            yield case(f"{field} wrong type {n}", {**base, field: value}, RefusalReason.WRONG_TYPE)
    reassign = {"request_id": "req-2", "order_id": "o0", "status": "reassigned"}
    for other, field in ((cancel, "cancelled_at"), (reassign, "reassigned_at")):
        for n, value in enumerate([*wrong_values, "1709500300", "soon"]):
            yield case(f"{field} wrong type {n}", {**other, field: value}, RefusalReason.WRONG_TYPE)
    for n, value in enumerate([True, 17, [], {"id": "r0"}]):
        record = {**reassign, "reassigned_at": DECIDED_AT + 5, "rider_id": value}
        yield case(f"reassigned rider wrong type {n}", record, RefusalReason.WRONG_TYPE)
    for field in ("request_id", "order_id", "rider_id"):
        for n, value in enumerate([*wrong_values, 17, 1.5]):
            yield case(f"{field} wrong type {n}", {**base, field: value}, RefusalReason.WRONG_TYPE)
    for n, status in enumerate(
        ["lost", "DELIVERED", "", " delivered", "delivered\x00", 1, None, True, []]
    ):
        yield case(f"bad status {n}", {**base, "status": status}, RefusalReason.BAD_STATUS)
    for field in ("request_id", "order_id", "rider_id"):
        for n, value in enumerate(
            ["", "x" * 65, "é" * 33, "a\nb", "tab\there", "\x00", "\x7f", "\x1b[31m"]
        ):
            yield case(f"{field} bad id {n}", {**base, field: value}, RefusalReason.BAD_ID)
    for field in ("picked_up_at", "delivered_at"):
        for n, token in enumerate(["NaN", "Infinity", "-Infinity", "1e999"]):
            body = json.dumps({"outcomes": [{**base, field: 0.0}]}).replace(
                f'"{field}": 0.0', f'"{field}": {token}'
            )
            yield Case(f"{field} not finite {n}", body.encode(), RefusalReason.BAD_TIME)
    yield case("picked up after delivered", {**base, "picked_up_at": base["delivered_at"] + 1},
               RefusalReason.BAD_TIME)  # fmt: skip
    for field in ("picked_up_at", "delivered_at"):
        for n, early in enumerate([DECIDED_AT - 1, DECIDED_AT - 86_400, 0, -1e12]):
            record = {**base, "picked_up_at": early, "delivered_at": base["delivered_at"]}
            if field == "delivered_at":
                record = {**base, "picked_up_at": early, "delivered_at": early}
            yield case(f"{field} before the decision {n}", record, RefusalReason.BEFORE_DECISION)
    for n, late in enumerate(
        [DECIDED_AT + MAX_OUTCOME_DELAY_S + 1, DECIDED_AT + 10 * 86_400, 4e9, 1e300]
    ):
        yield case(f"too late {n}", {**base, "delivered_at": late}, RefusalReason.TOO_LATE)
    # the server's clock (NOW = decision + 2 h): a delivery 3 h after the decision has not happened
    yield case("in the future", {**base, "delivered_at": NOW + 3600}, RefusalReason.IN_FUTURE)
    future_cancel = {**cancel, "order_id": "o1", "cancelled_at": NOW + 600}
    yield case("cancel in the future", future_cancel, RefusalReason.IN_FUTURE)
    for n, rider in enumerate(["r1", "r3", "R0", "r0 ", "'; DROP TABLE decisions; --"]):
        yield case(
            f"rider not assigned {n}", {**base, "rider_id": rider}, RefusalReason.RIDER_NOT_ASSIGNED
        )
    yield case(
        "delivery of an unassigned order",
        delivered("req-2", "o2", "r2"),
        RefusalReason.RIDER_NOT_ASSIGNED,
    )
    hostile_ids = [
        "req-999", "req-2 ", "REQ-2", "req-2'", "req-2' OR '1'='1",
        "req-2\"; DROP TABLE decisions; --", "%", "_", "req-%", "*", "\\", "req-2\\",
        "\U0001f600", "\uff52\uff45\uff51-2", "req-2;", "NULL", "null", "0",
    ]  # fmt: skip
    for n, request_id in enumerate(hostile_ids):
        yield case(
            f"unknown decision {n}",
            {**base, "request_id": request_id},
            RefusalReason.UNKNOWN_DECISION,
        )
    for n, order_id in enumerate(["o9", "o0 OR 1=1", "o0'--", "O0"]):
        yield case(
            f"unknown order {n}", {**base, "order_id": order_id}, RefusalReason.UNKNOWN_DECISION
        )


CASES = [*whole_report_cases(), *record_cases()]


def test_there_are_at_least_200_cases() -> None:
    assert len(CASES) >= 200
    assert len({case.name for case in CASES}) == len(CASES)


def test_each_hostile_report_is_refused_by_name(running: Running) -> None:
    good = [delivered("req-3", "o0", "r0"), delivered("req-3", "o1", "r1")]
    for case in CASES:
        status, answer = post(running, case.body, key=case.key, headers=dict(case.headers))
        assert status == case.status, (case.name, answer)
        if case.status != 200:
            assert answer["error"] == case.reason, (case.name, answer)
            assert answer["detail"], case.name
            continue
        assert (answer["stored"], answer["duplicates"]) == (0, 0), (case.name, answer)
        (refused,) = answer["refused"]
        assert refused["reason"] == case.reason, (case.name, refused)
        assert refused["index"] == 0 and refused["detail"], case.name
    # nothing of it was stored, and the store still takes a good report
    assert open_store(running.path).counts().outcomes == 0
    status, answer = post(running, report(*good))
    assert (status, answer["stored"], answer["refused"]) == (200, 2, [])
    counts = open_store(running.path).counts()
    assert (counts.decisions, counts.outcomes) == (3 * REQUESTS, 2)


def test_bad_records_do_not_stop_their_neighbours(running: Running) -> None:
    records = [
        delivered("req-4", "o0", "r0"),
        {**delivered("req-4", "o1", "r1"), "delivered_at": "later"},
        delivered("req-4", "o1", "r1"),
        delivered("req-4", "o1", "r1"),  # the same decision twice in one report
        delivered("req-404", "o0", "r0"),
    ]
    status, answer = post(running, report(*records))
    assert status == 200
    assert answer["stored"] == 2
    assert [(r["index"], r["reason"]) for r in answer["refused"]] == [
        (1, "wrong_type"),
        (3, "duplicate_in_report"),
        (4, "unknown_decision"),
    ]
    # a different outcome for a stored decision is a conflict, the same one a duplicate
    changed = {**delivered("req-4", "o0", "r0"), "delivered_at": DECIDED_AT + 1500}
    status, answer = post(running, report(changed, delivered("req-4", "o1", "r1")))
    assert answer["duplicates"] == 1
    assert [r["reason"] for r in answer["refused"]] == ["conflicting_outcome"]
    stored = open_store(running.path).outcomes([DecisionId("req-4", "o0")])
    assert stored[DecisionId("req-4", "o0")].delivered_at == DECIDED_AT + 20 * 60  # the first


def test_refusals_are_counted_for_prometheus(running: Running) -> None:
    post(running, report(delivered("req-5", "o0", "r0"), delivered("req-nope", "o0", "r0")))
    post(running, b"[]")
    post(running, report(), key="wrong")
    families = {m.name: m for m in running.service.collector().collect()}
    samples = {
        (s.labels["result"], s.labels["reason"]): s.value
        for s in families["dispatch_outcomes_received"].samples
        if s.name.endswith("_total")
    }
    assert samples[("stored", "")] == 1
    assert samples[("refused", "unknown_decision")] == 1
    assert samples[("refused", "not_a_report")] == 1
    assert samples[("refused", "wrong_key")] == 1


def test_quality_is_served_with_the_key(running: Running) -> None:
    post(running, report(delivered("req-6", "o0", "r0", minutes=20.0)))
    conn = http.client.HTTPConnection(running.host, running.port, timeout=30)
    conn.request("GET", "/v1/quality?since=0", headers={OUTCOME_KEY_HEADER: KEY})
    answer = json.loads(conn.getresponse().read())
    conn.request("GET", "/v1/quality")
    assert conn.getresponse().status == 401
    conn.close()
    (row,) = answer["quality"]
    assert (row["model_version"], row["city"], row["deliveries"]) == (1, "shanghai", 1)
    # predicted 10 minutes (answered_window's order 0), delivered 20 minutes after the decision
    assert math.isclose(row["eta_bias"], -10.0) and math.isclose(row["eta_mae"], 10.0)
    running.service.housekeep()
    gauges = {m.name: m for m in running.service.collector().collect()}
    (sample,) = gauges["dispatch_quality_eta_mae"].samples
    assert sample.labels == {"model_version": "1", "city": "shanghai", "fallback_level": "0"}
    assert sample.value == pytest.approx(10.0)


def test_the_command_line_reports_a_file(
    running: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dispatch_client import cli

    key_file = tmp_path / "outcome.key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    records = tmp_path / "outcomes.json"
    records.write_text(json.dumps({"outcomes": [delivered("req-7", "o0", "r0")]}))
    argv = ["report-outcomes", "--url", running.url, "--key-file", str(key_file), str(records)]
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out) == {"stored": 1, "duplicates": 0, "refused": []}
    records.write_text(json.dumps([delivered("req-7", "o1", "r0")]))  # a plain list
    assert cli.main(argv) == 2  # refused: named in the output
    (refused,) = json.loads(capsys.readouterr().out)["refused"]
    assert refused["reason"] == "rider_not_assigned"
    key_file.write_text("wrong\n")
    assert cli.main(argv) == 1
    assert "wrong_key" in capsys.readouterr().err
    records.write_text("{not json")
    assert cli.main(argv) == 2
