"""The SQLite store: schema created and migrated by the store, idempotent writes, lookups,
the join, retention and the size bound (PostgreSQL: the same over a real server, in
tests/integration/test_outcome_store_postgres.py)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from dispatch_contract.outcomes import OutcomeStatus
from dispatch_service.outcomes.records import (
    DecisionId,
    Outcome,
    batch_decision_records,
    decision_records,
    decision_rows,
)
from dispatch_service.outcomes.schema import SCHEMA_TABLE, SCHEMA_VERSION
from dispatch_service.outcomes.sql_store import SqliteStore, open_store
from dispatch_service.outcomes.store import StoreError, StoreLimits

from .outcome_helpers import DECIDED_AT, answered_window


def test_open_creates_the_schema_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "state" / "outcomes.sqlite3"
    store = open_store(path)
    assert isinstance(store, SqliteStore)
    assert store.schema_version() == SCHEMA_VERSION
    store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"decisions", "outcomes", SCHEMA_TABLE} <= tables
    # opened again: nothing to migrate, nothing lost
    assert open_store(f"sqlite://{path}").schema_version() == SCHEMA_VERSION


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    open_store(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE {SCHEMA_TABLE} SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError, match="newer than this service"):
        open_store(path)


def test_an_unwritable_place_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError):
        open_store(blocker / "o.sqlite3")


def test_decisions_are_stored_once_and_looked_up(tmp_path: Path) -> None:
    store = open_store(tmp_path / "o.sqlite3")
    records = decision_records(answered_window("req-1", orders=3))
    assert store.write_decisions(records, recorded_at=100.0) == 3
    assert store.write_decisions(records, recorded_at=101.0) == 0  # a resent request
    found = store.decisions(
        [DecisionId("req-1", "o0"), DecisionId("req-1", "o2"), DecisionId("x", "o0")]
    )
    assert set(found) == {DecisionId("req-1", "o0"), DecisionId("req-1", "o2")}
    assert found[DecisionId("req-1", "o0")].assigned_rider == "r0"
    assert found[DecisionId("req-1", "o2")].assigned_rider is None  # left unassigned
    assert found[DecisionId("req-1", "o0")].decided_at == DECIDED_AT
    assert store.counts().decisions == 3


def test_ids_with_sql_metacharacters_are_data(tmp_path: Path) -> None:
    store = open_store(tmp_path / "o.sqlite3")
    hostile = "x'); DROP TABLE decisions; --"
    assert store.decisions([DecisionId(hostile, "o0")]) == {}
    store.write_decisions(decision_records(answered_window(hostile, orders=2)), recorded_at=1.0)
    assert DecisionId(hostile, "o0") in store.decisions([DecisionId(hostile, "o0")])
    assert store.counts().decisions == 2


def test_lookups_span_many_ids(tmp_path: Path) -> None:
    store = open_store(tmp_path / "o.sqlite3")
    for n in range(30):
        store.write_decisions(
            decision_records(answered_window(f"req-{n}", orders=50)), recorded_at=1.0
        )
    ids = [DecisionId(f"req-{n}", f"o{i}") for n in range(30) for i in range(50)]
    assert len(store.decisions(ids)) == 1500


def test_outcomes_join_their_decisions(tmp_path: Path) -> None:
    store = open_store(tmp_path / "o.sqlite3")
    store.write_decisions(decision_records(answered_window("req-1", orders=3)), recorded_at=1.0)
    outcome = Outcome(
        "req-1", "o1", OutcomeStatus.DELIVERED,
        picked_up_at=DECIDED_AT + 60, delivered_at=DECIDED_AT + 900, rider_id="r1",
    )  # fmt: skip
    assert store.write_outcomes([outcome], received_at=50.0) == 1
    assert store.write_outcomes([outcome], received_at=51.0) == 0
    assert store.outcomes([outcome.decision_id]) == {outcome.decision_id: outcome}
    (row,) = store.joined()
    assert (row.model_version, row.city, row.assigned_rider, row.rider_id) == (
        1,
        "shanghai",
        "r1",
        "r1",
    )
    assert row.eta_minutes == pytest.approx(11.0)
    assert row.delivered_at == DECIDED_AT + 900
    assert store.joined(since=50.5) == []


def test_retention_and_size_bound(tmp_path: Path) -> None:
    store = open_store(tmp_path / "o.sqlite3")
    for n, recorded_at in enumerate((1000.0, 2000.0, 3000.0, 4000.0)):
        store.write_decisions(
            decision_records(answered_window(f"req-{n}", orders=2)), recorded_at=recorded_at
        )
    old = Outcome("req-0", "o0", OutcomeStatus.CANCELLED, ended_at=DECIDED_AT + 10)
    store.write_outcomes([old], received_at=1.0)
    # retention: recorded before now - retention_s goes, with its outcome
    assert store.prune(StoreLimits(retention_s=2500.0, max_decisions=100), now=4000.0) == 2
    assert store.counts().decisions == 6 and store.counts().outcomes == 0
    # size bound: the newest max_decisions stay
    assert store.prune(StoreLimits(retention_s=1e9, max_decisions=2), now=4000.0) == 4
    assert store.decisions([DecisionId("req-3", "o0"), DecisionId("req-3", "o1")]).keys() == {
        DecisionId("req-3", "o0"), DecisionId("req-3", "o1"),
    }  # fmt: skip


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="retention_s"):
        StoreLimits(retention_s=0)
    with pytest.raises(ValueError, match="max_decisions"):
        StoreLimits(max_decisions=0)


def test_reads_take_no_write_lock(tmp_path: Path) -> None:
    """The analysis (joined, counts, lookups) reads a snapshot: a write under way elsewhere
    does not hold it up, and a long read would not hold up the decision writers."""
    path = tmp_path / "o.sqlite3"
    store = open_store(path)
    store.write_decisions(decision_records(answered_window("req-1", orders=2)), recorded_at=1.0)
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        assert store.counts().decisions == 2
        assert len(store.decisions([DecisionId("req-1", "o0")])) == 1
        assert store.joined() == []
        assert store.schema_version() == SCHEMA_VERSION
        other = sqlite3.connect(path, timeout=0.0, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError, match="locked"):  # the lock is held
            other.execute("BEGIN IMMEDIATE")
        other.close()
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        store.close()


def test_the_topk_column_is_the_riders_as_json(tmp_path: Path) -> None:
    """Stored as `json.dumps` writes the list (the reference), for ids that JSON escapes."""
    window = answered_window("req-1", orders=2)
    riders = ['r"0', "r\\1", "骑手-2", "r\n3"]
    object.__setattr__(window, "rider_ids", np.array([r.encode() for r in riders], dtype=object))
    object.__setattr__(window, "topk_rider_index", np.array([[0, 1], [2, 3]], dtype=np.int32))
    store = open_store(tmp_path / "o.sqlite3")
    assert store.write_decision_rows(decision_rows([window]), recorded_at=1.0) == 2
    store.close()
    with sqlite3.connect(tmp_path / "o.sqlite3") as conn:
        stored = [r[0] for r in conn.execute("SELECT topk_riders FROM decisions ORDER BY order_id")]
    assert stored == [json.dumps(riders[:2]), json.dumps(riders[2:])]
    assert [json.loads(text) for text in stored] == [riders[:2], riders[2:]]


def test_records_and_their_columns_are_stored_alike(tmp_path: Path) -> None:
    """Wiring: `write_decisions` (records) and `write_decision_rows` (the writer's
    columns) store the same rows."""
    windows = [answered_window("a", orders=3), answered_window("b", orders=1, version=2)]
    stored = []
    for name, write in (
        ("records", lambda s: s.write_decisions(batch_decision_records(windows), recorded_at=5.0)),
        ("rows", lambda s: s.write_decision_rows(decision_rows(windows), recorded_at=5.0)),
    ):
        store = open_store(tmp_path / f"{name}.sqlite3")
        assert write(store) == 4
        store.close()
        with sqlite3.connect(tmp_path / f"{name}.sqlite3") as conn:
            stored.append(conn.execute("SELECT * FROM decisions ORDER BY 1, 2").fetchall())
    assert stored[0] == stored[1] and len(stored[0]) == 4
