"""The outcome store on a real PostgreSQL server that this module starts (initdb, pg_ctl;
`perf.postgres_server`): the schema migrated by the stores themselves (two replicas opening
together migrate once), idempotent writes, the join, retention, hostile ids as data, two
replicas' writers into one database read by one analysis, and a server that goes away."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import psycopg
import pytest

from dispatch_contract.outcomes import OutcomeStatus
from dispatch_service.outcomes.ingest import ingest_report
from dispatch_service.outcomes.quality import QualityKey, live_quality
from dispatch_service.outcomes.records import DecisionId, Outcome, decision_records
from dispatch_service.outcomes.schema import SCHEMA_VERSION
from dispatch_service.outcomes.sql_store import PostgresStore, open_store
from dispatch_service.outcomes.store import OutcomeStore, StoreError, StoreLimits
from dispatch_service.outcomes.writer import DecisionWriter, WriterCounts
from perf.postgres_server import throwaway_postgres
from tests.unit.outcomes.outcome_helpers import DECIDED_AT, NOW, answered_window, delivered


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with throwaway_postgres() as url:
        yield url


@pytest.fixture
def url(server_url: str) -> Iterator[str]:
    """An empty database per test (the tables dropped after)."""
    yield server_url
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS decisions, outcomes, outcome_schema")


@pytest.fixture
def opened() -> Iterator[list[OutcomeStore]]:
    """The stores a test opens, closed after it."""
    stores: list[OutcomeStore] = []
    yield stores
    for store in stores:
        store.close()


def connect(url: str, opened: list[OutcomeStore]) -> OutcomeStore:
    store = open_store(url)
    opened.append(store)
    return store


def test_replicas_opening_together_migrate_once(url: str, opened: list[OutcomeStore]) -> None:
    errors: list[BaseException] = []

    def open_one() -> None:
        try:
            opened.append(open_store(url))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(opened) == 4
    assert all(
        isinstance(s, PostgresStore) and s.schema_version() == SCHEMA_VERSION for s in opened
    )
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT COUNT(*) FROM outcome_schema").fetchone() == (1,)


def test_writes_are_idempotent_and_join(url: str, opened: list[OutcomeStore]) -> None:
    store = connect(url, opened)
    records = decision_records(answered_window("req-1", orders=3))
    assert store.write_decisions(records, recorded_at=NOW) == 3
    assert store.write_decisions(records, recorded_at=NOW) == 0
    found = store.decisions(
        [DecisionId("req-1", "o0"), DecisionId("req-1", "o2"), DecisionId("x", "y")]
    )
    assert found[DecisionId("req-1", "o0")].assigned_rider == "r0"
    assert found[DecisionId("req-1", "o2")].assigned_rider is None
    outcome = Outcome("req-1", "o1", OutcomeStatus.DELIVERED, picked_up_at=DECIDED_AT + 60,
                      delivered_at=DECIDED_AT + 600, rider_id="r1")  # fmt: skip
    assert store.write_outcomes([outcome], received_at=NOW) == 1
    assert store.write_outcomes([outcome], received_at=NOW) == 0
    assert store.outcomes([outcome.decision_id]) == {outcome.decision_id: outcome}
    (row,) = store.joined()
    assert (row.assigned_rider, row.rider_id, row.eta_minutes) == ("r1", "r1", pytest.approx(11.0))
    figures = live_quality(store.joined())[QualityKey(1, "shanghai", 0)]
    assert figures.eta_mae == pytest.approx(1.0)  # predicted 11, delivered after 10 minutes


def test_hostile_ids_are_data(url: str, opened: list[OutcomeStore]) -> None:
    store = connect(url, opened)
    hostile = "x'); DROP TABLE decisions; --"
    store.write_decisions(decision_records(answered_window(hostile, orders=2)), recorded_at=NOW)
    assert store.decisions([DecisionId("' OR '1'='1", "o0")]) == {}
    body = (
        b'{"outcomes": [{"request_id": "' + hostile.encode() + b'", "order_id": "o0", '
        b'"status": "cancelled", "cancelled_at": ' + str(DECIDED_AT + 5).encode() + b"}]}"
    )
    answer = ingest_report(body, store, clock=lambda: NOW)
    assert (answer.stored, answer.refused) == (1, [])
    assert store.counts().decisions == 2 and store.counts().outcomes == 1


def test_a_report_is_checked_against_the_database(url: str, opened: list[OutcomeStore]) -> None:
    store = connect(url, opened)
    store.write_decisions(decision_records(answered_window("req-9", orders=3)), recorded_at=NOW)
    body = json.dumps(
        {
            "outcomes": [
                delivered("req-9", "o0", "r0"),
                delivered("req-9", "o1", "r0"),
                delivered("req-nope", "o0", "r0"),
            ]
        }
    ).encode()
    answer = ingest_report(body, store, clock=lambda: NOW)
    assert answer.stored == 1
    assert [(r.index, r.reason) for r in answer.refused] == [
        (1, "rider_not_assigned"),
        (2, "unknown_decision"),
    ]


def test_retention_and_size_bound(url: str, opened: list[OutcomeStore]) -> None:
    store = connect(url, opened)
    for n, recorded_at in enumerate((1000.0, 2000.0, 3000.0)):
        store.write_decisions(
            decision_records(answered_window(f"r{n}", orders=2)), recorded_at=recorded_at
        )
    store.write_outcomes([Outcome("r0", "o0", OutcomeStatus.CANCELLED, ended_at=DECIDED_AT + 1)],
                         received_at=NOW)  # fmt: skip
    assert store.prune(StoreLimits(retention_s=1500.0, max_decisions=100), now=3000.0) == 2
    assert store.counts().outcomes == 0
    assert store.prune(StoreLimits(retention_s=1e9, max_decisions=2), now=3000.0) == 2
    assert set(store.decisions([DecisionId("r2", "o0"), DecisionId("r2", "o1")])) == {
        DecisionId("r2", "o0"), DecisionId("r2", "o1"),
    }  # fmt: skip


def test_two_replicas_write_and_one_analysis_reads(url: str, opened: list[OutcomeStore]) -> None:
    writers = [DecisionWriter(lambda: open_store(url)) for _ in range(2)]
    for n in range(100):
        writers[n % 2].submit(answered_window(f"replica-{n}", orders=5))
    for writer in writers:
        assert writer.flush(60)
        writer.close()
    assert sum((w.counts for w in writers), WriterCounts()) == WriterCounts(written=500)
    assert connect(url, opened).counts().decisions == 500


def test_a_server_that_goes_away_is_a_store_error(opened: list[OutcomeStore]) -> None:
    with throwaway_postgres() as url:
        store = connect(url, opened)
        writer = DecisionWriter(lambda: open_store(url))
        writer.submit(answered_window("before", orders=2))
        assert writer.flush(60)
    # the server is stopped now
    with pytest.raises(StoreError) as caught:
        store.counts()
    assert "outcome store" in str(caught.value)
    writer.submit(answered_window("after", orders=2))
    assert writer.flush(60)
    writer.close()
    assert writer.counts == WriterCounts(written=2, dropped_store_error=2)
    with pytest.raises(StoreError):
        open_store(url)
