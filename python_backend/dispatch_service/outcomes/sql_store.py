"""`OutcomeStore` on SQL: `SqliteStore` (the default, a WAL file) and `PostgresStore`.

One implementation over DB-API: the statements are the common subset of both databases,
written with ``?`` placeholders (PostgreSQL's driver takes ``%s``: swapped once, here).
A store holds one connection and serialises its calls with a lock, so the outcome service
may call it from its executor's threads. Every failure of the database comes out as
`StoreError`; `PostgresStore` reconnects on the next call after a lost connection.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any, Final, TypeVar

from dispatch_contract.outcomes import OutcomeStatus
from dispatch_service.outcomes.records import DecisionId, DecisionRecord, DecisionRows, Outcome
from dispatch_service.outcomes.schema import MIGRATIONS, SCHEMA_TABLE, SCHEMA_VERSION
from dispatch_service.outcomes.store import (
    DecisionFacts,
    JoinedRow,
    OutcomeStore,
    StoreCounts,
    StoreError,
    StoreLimits,
    is_postgres_url,
    store_address,
)

__all__ = ["PostgresStore", "SqlStore", "SqliteStore", "open_store"]

# Ids per lookup statement (two parameters each; SQLite allows 32766 parameters).
_LOOKUP_CHUNK: Final = 500
# How long a writer waits for another's SQLite lock before giving up (the writer drops the
# batch and counts it; the service answers 503).
SQLITE_BUSY_TIMEOUT_S: Final = 5.0
# Any number: the key of the PostgreSQL advisory lock replicas migrate under.
_MIGRATION_LOCK: Final = 46_046_046

_DECISION_COLUMNS: Final = (
    "request_id, order_id, decided_at, recorded_at, entry_point, city, routing_bucket, "
    "model_version, fallback_level, assigned_rider, topk_riders, eta_minutes, "
    "ontime_probability, cost, created_at, promised_minutes, weight_latency, weight_ontime, "
    "weight_cost"
)
_OUTCOME_COLUMNS: Final = (
    "request_id, order_id, status, picked_up_at, delivered_at, ended_at, rider_id, received_at"
)

T = TypeVar("T")


def _placeholders(count: int) -> str:
    return ", ".join(["?"] * count)


def _topk_json(riders: Sequence[str]) -> str:
    """The ``topk_riders`` column: the riders as a JSON list, as `json.dumps` writes it
    (one C call per rider instead of the encoder's set-up per record)."""
    return "[" + ", ".join(map(encode_basestring_ascii, riders)) + "]"


class SqlStore:
    """The shared implementation; subclasses connect and name their driver's errors."""

    url: str
    paramstyle: str = "?"

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._conn: Any = None
        self._run(self._migrate)

    # ---- connection --------------------------------------------------------------------

    def _connect(self) -> Any:
        raise NotImplementedError

    def _is_db_error(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def _sql(self, text: str) -> str:
        return text if self.paramstyle == "?" else text.replace("?", self.paramstyle)

    @contextmanager
    def _transaction(self, *, writes: bool) -> Iterator[Any]:
        """A cursor in one transaction (committed, or rolled back on error)."""
        conn = self._conn
        cursor = conn.cursor()
        try:
            self._begin(cursor, writes=writes)
            yield cursor
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            cursor.close()

    def _begin(self, cursor: Any, *, writes: bool) -> None:
        """Start the transaction (drivers that start one implicitly do nothing)."""

    def _run(self, work: Callable[[Any], T], *, writes: bool = True) -> T:
        """``work(cursor)`` in one transaction under the lock; database errors -> StoreError.
        ``writes=False``: ``work`` only reads (on SQLite it then holds no write lock, and the
        decision writers go on while a long analysis reads)."""
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = self._connect()
                with self._transaction(writes=writes) as cursor:
                    return work(cursor)
            except StoreError:
                raise
            except Exception as exc:
                if not self._is_db_error(exc):
                    raise
                self._drop_connection()
                raise StoreError(f"outcome store {self.redacted_url}: {exc}") from exc

    def _drop_connection(self) -> None:
        """After an error the connection may be broken: the next call opens a new one."""

    @property
    def redacted_url(self) -> str:
        return self.url

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    # ---- schema ------------------------------------------------------------------------

    def _lock_migrations(self, cursor: Any) -> None:
        """Hold off other processes migrating the same database (until commit)."""

    def _migrate(self, cursor: Any) -> None:
        self._lock_migrations(cursor)
        cursor.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA_TABLE} (version INTEGER NOT NULL)")
        cursor.execute(f"SELECT version FROM {SCHEMA_TABLE}")
        row = cursor.fetchone()
        current = 0 if row is None else int(row[0])
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"outcome store {self.redacted_url} is at schema version {current}, newer than "
                f"this service's {SCHEMA_VERSION}: upgrade the service"
            )
        for statements in MIGRATIONS[current:]:
            for statement in statements:
                cursor.execute(statement)
        if row is None:
            cursor.execute(
                self._sql(f"INSERT INTO {SCHEMA_TABLE} (version) VALUES (?)"), (SCHEMA_VERSION,)
            )
        elif current != SCHEMA_VERSION:
            cursor.execute(self._sql(f"UPDATE {SCHEMA_TABLE} SET version = ?"), (SCHEMA_VERSION,))

    def schema_version(self) -> int:
        def read(cursor: Any) -> int:
            cursor.execute(f"SELECT version FROM {SCHEMA_TABLE}")
            return int(cursor.fetchone()[0])

        return self._run(read, writes=False)

    # ---- decisions ---------------------------------------------------------------------

    def write_decisions(self, records: Sequence[DecisionRecord], *, recorded_at: float) -> int:
        return self.write_decision_rows(DecisionRows.of_records(records), recorded_at=recorded_at)

    def write_decision_rows(self, rows: DecisionRows, *, recorded_at: float) -> int:
        """The rows zipped from the columns as they are: one tuple per record, no object."""
        params = list(
            zip(
                rows.request_id, rows.order_id, rows.decided_at, [recorded_at] * len(rows),
                rows.entry_point, rows.city, rows.routing_bucket, rows.model_version,
                rows.fallback_level, rows.assigned_rider, map(_topk_json, rows.topk_riders),
                rows.eta_minutes, rows.ontime_probability, rows.cost, rows.created_at,
                rows.promised_minutes, rows.weight_latency, rows.weight_ontime,
                rows.weight_cost,
                strict=True,
            )
        )  # fmt: skip
        statement = self._sql(
            f"INSERT INTO decisions ({_DECISION_COLUMNS}) VALUES ({_placeholders(19)}) "
            "ON CONFLICT (request_id, order_id) DO NOTHING"
        )
        return self._insert_many(statement, params)

    def _insert_many(self, statement: str, rows: list[tuple[Any, ...]]) -> int:
        if not rows:
            return 0

        def insert(cursor: Any) -> int:
            before = self._count(cursor)
            cursor.executemany(statement, rows)
            return self._count(cursor) - before

        return self._run(insert)

    def _count(self, cursor: Any) -> int:
        """Rows changed so far on this connection (SQLite's ``total_changes``); the
        PostgreSQL store counts its inserts by ``RETURNING`` instead."""
        raise NotImplementedError

    def _lookup(self, ids: Sequence[DecisionId], columns: str, table: str) -> list[tuple[Any, ...]]:
        unique = list(dict.fromkeys(ids))
        found: list[tuple[Any, ...]] = []

        def read(cursor: Any) -> None:
            for start in range(0, len(unique), _LOOKUP_CHUNK):
                chunk = unique[start : start + _LOOKUP_CHUNK]
                values = ", ".join(["(?, ?)"] * len(chunk))
                # A join, so that each id is one primary-key search (SQLite scans the whole
                # table for `(request_id, order_id) IN (VALUES ...)`).
                cursor.execute(
                    self._sql(
                        f"WITH wanted (r, o) AS (VALUES {values}) "
                        f"SELECT t.request_id, t.order_id, {columns} FROM wanted "
                        f"JOIN {table} t ON t.request_id = wanted.r AND t.order_id = wanted.o"
                    ),
                    [part for key in chunk for part in key],
                )
                found.extend(cursor.fetchall())

        if unique:
            self._run(read, writes=False)
        return found

    def decisions(self, ids: Sequence[DecisionId]) -> dict[DecisionId, DecisionFacts]:
        rows = self._lookup(ids, "decided_at, assigned_rider", "decisions")
        return {DecisionId(r[0], r[1]): DecisionFacts(float(r[2]), r[3]) for r in rows}

    # ---- outcomes ----------------------------------------------------------------------

    def outcomes(self, ids: Sequence[DecisionId]) -> dict[DecisionId, Outcome]:
        rows = self._lookup(
            ids, "status, picked_up_at, delivered_at, ended_at, rider_id", "outcomes"
        )
        return {
            DecisionId(r[0], r[1]): Outcome(
                request_id=r[0],
                order_id=r[1],
                status=OutcomeStatus(r[2]),
                picked_up_at=r[3],
                delivered_at=r[4],
                ended_at=r[5],
                rider_id=r[6],
            )
            for r in rows
        }

    def write_outcomes(self, outcomes: Sequence[Outcome], *, received_at: float) -> int:
        rows = [
            (
                o.request_id, o.order_id, str(o.status), o.picked_up_at, o.delivered_at,
                o.ended_at, o.rider_id, received_at,
            )
            for o in outcomes
        ]  # fmt: skip
        statement = self._sql(
            f"INSERT INTO outcomes ({_OUTCOME_COLUMNS}) VALUES ({_placeholders(8)}) "
            "ON CONFLICT (request_id, order_id) DO NOTHING"
        )
        return self._insert_many(statement, rows)

    # ---- analysis ----------------------------------------------------------------------

    def joined(self, *, since: float = 0.0) -> list[JoinedRow]:
        def read(cursor: Any) -> list[tuple[Any, ...]]:
            cursor.execute(
                self._sql(
                    "SELECT d.model_version, d.city, d.fallback_level, d.entry_point, "
                    "d.decided_at, d.created_at, d.promised_minutes, d.assigned_rider, "
                    "d.eta_minutes, d.ontime_probability, d.cost, o.status, o.picked_up_at, "
                    "o.delivered_at, o.rider_id, d.recorded_at FROM decisions d JOIN outcomes o "
                    "ON d.request_id = o.request_id AND d.order_id = o.order_id "
                    "WHERE o.received_at >= ?"
                ),
                (since,),
            )
            return list(cursor.fetchall())

        return [
            JoinedRow(
                model_version=int(r[0]),
                city=r[1],
                fallback_level=int(r[2]),
                entry_point=r[3],
                decided_at=float(r[4]),
                created_at=float(r[5]),
                promised_minutes=float(r[6]),
                assigned_rider=r[7],
                eta_minutes=r[8],
                ontime_probability=r[9],
                cost=r[10],
                status=OutcomeStatus(r[11]),
                picked_up_at=r[12],
                delivered_at=r[13],
                rider_id=r[14],
                recorded_at=float(r[15]),
            )
            for r in self._run(read, writes=False)
        ]

    def counts(self) -> StoreCounts:
        def read(cursor: Any) -> StoreCounts:
            cursor.execute("SELECT COUNT(*) FROM decisions")
            decisions = int(cursor.fetchone()[0])
            cursor.execute("SELECT COUNT(*) FROM outcomes")
            return StoreCounts(decisions, int(cursor.fetchone()[0]))

        return self._run(read, writes=False)

    def prune(self, limits: StoreLimits, *, now: float) -> int:
        def prune(cursor: Any) -> int:
            cursor.execute("SELECT COUNT(*) FROM decisions")
            before = int(cursor.fetchone()[0])
            cutoff = now - limits.retention_s
            if before > limits.max_decisions:  # the newest max_decisions stay (and their ties)
                cursor.execute(
                    self._sql(
                        "SELECT recorded_at FROM decisions ORDER BY recorded_at DESC "
                        "LIMIT 1 OFFSET ?"
                    ),
                    (limits.max_decisions - 1,),
                )
                cutoff = max(cutoff, float(cursor.fetchone()[0]))
            cursor.execute(
                self._sql(
                    "DELETE FROM outcomes WHERE (request_id, order_id) IN "
                    "(SELECT request_id, order_id FROM decisions WHERE recorded_at < ?)"
                ),
                (cutoff,),
            )
            cursor.execute(self._sql("DELETE FROM decisions WHERE recorded_at < ?"), (cutoff,))
            cursor.execute("SELECT COUNT(*) FROM decisions")
            return before - int(cursor.fetchone()[0])

        return self._run(prune)


class SqliteStore(SqlStore):
    """The default store: one SQLite file in WAL mode (readers never wait for the writer)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        super().__init__(str(path))

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at each checkpoint
        return conn

    def _begin(self, cursor: Any, *, writes: bool) -> None:
        # a writer takes the write lock now, not halfway; a reader reads a snapshot (WAL)
        cursor.execute("BEGIN IMMEDIATE" if writes else "BEGIN")

    def _is_db_error(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.Error | OSError)

    def _count(self, cursor: Any) -> int:
        return int(self._conn.total_changes)


class PostgresStore(SqlStore):
    """PostgreSQL through psycopg 3 (imported only here: SQLite servers need no driver)."""

    paramstyle = "%s"

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.url, connect_timeout=5)

    def _is_db_error(self, exc: BaseException) -> bool:
        import psycopg

        return isinstance(exc, psycopg.Error | OSError)

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to close
                conn.close()

    def _lock_migrations(self, cursor: Any) -> None:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))

    def _insert_many(self, statement: str, rows: list[tuple[Any, ...]]) -> int:
        if not rows:
            return 0

        def insert(cursor: Any) -> int:
            cursor.executemany(statement + " RETURNING 1", rows, returning=True)
            inserted = 0
            while True:
                inserted += len(cursor.fetchall())
                if not cursor.nextset():
                    return inserted

        return self._run(insert)

    @property
    def redacted_url(self) -> str:
        """The URL without its password (it goes into errors and logs)."""
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))


def open_store(url: str | Path) -> OutcomeStore:
    """The store at ``url`` (a PostgreSQL URL, else an SQLite file), schema migrated.

    Raises StoreError when it cannot be opened or migrated."""
    address = store_address(url)
    return PostgresStore(address) if is_postgres_url(address) else SqliteStore(Path(address))
