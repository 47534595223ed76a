"""The store's schema, as numbered migrations the store applies itself when opened.

``outcome_schema`` holds the version the database is at; opening a store applies, in one
transaction each, every migration above it (PostgreSQL under an advisory lock, so replicas
starting together migrate once; SQLite under ``BEGIN IMMEDIATE``). A database at a newer
version than this code knows is refused (`StoreError` in `sql_store`): an old replica must
not write into a schema it does not understand. A change to the schema is a new entry at
the end of `MIGRATIONS`, never an edit of a shipped one.

The SQL is the common subset of SQLite and PostgreSQL (``DOUBLE PRECISION`` is REAL in
SQLite). ``decisions`` keeps no address, coordinate or user id (`records`).
"""

from __future__ import annotations

from typing import Final

__all__ = ["MIGRATIONS", "SCHEMA_TABLE", "SCHEMA_VERSION"]

SCHEMA_TABLE: Final = "outcome_schema"

MIGRATIONS: Final[tuple[tuple[str, ...], ...]] = (
    # 1: decisions and outcomes, keyed by the decision id
    (
        """CREATE TABLE decisions (
            request_id TEXT NOT NULL,
            order_id TEXT NOT NULL,
            decided_at DOUBLE PRECISION NOT NULL,
            recorded_at DOUBLE PRECISION NOT NULL,
            entry_point TEXT NOT NULL,
            city TEXT NOT NULL,
            routing_bucket INTEGER NOT NULL,
            model_version INTEGER NOT NULL,
            fallback_level INTEGER NOT NULL,
            assigned_rider TEXT,
            topk_riders TEXT NOT NULL,
            eta_minutes DOUBLE PRECISION,
            ontime_probability DOUBLE PRECISION,
            cost DOUBLE PRECISION,
            created_at DOUBLE PRECISION NOT NULL,
            promised_minutes DOUBLE PRECISION NOT NULL,
            weight_latency DOUBLE PRECISION NOT NULL,
            weight_ontime DOUBLE PRECISION NOT NULL,
            weight_cost DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (request_id, order_id)
        )""",
        "CREATE INDEX decisions_recorded_at ON decisions (recorded_at)",
        """CREATE TABLE outcomes (
            request_id TEXT NOT NULL,
            order_id TEXT NOT NULL,
            status TEXT NOT NULL,
            picked_up_at DOUBLE PRECISION,
            delivered_at DOUBLE PRECISION,
            ended_at DOUBLE PRECISION,
            rider_id TEXT,
            received_at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (request_id, order_id)
        )""",
        "CREATE INDEX outcomes_received_at ON outcomes (received_at)",
    ),
)
SCHEMA_VERSION: Final = len(MIGRATIONS)
