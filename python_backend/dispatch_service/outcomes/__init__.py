"""Decisions that learn how they turned out: every answered order recorded, the platform's
outcomes joined to it, live quality per model version x city.

- `records`: `DecisionRecord` (one per answered order, decision id = request id + order
  id), `Outcome`, and `AnsweredWindow`, what an entry point hands the writer;
- `writer`: `DecisionWriter`, the bounded queue and batch writer that keep the store off
  the request path (drops counted, never a failed or slowed request);
- `store`, `schema`, `sql_store`: the `OutcomeStore` interface, SQLite (default, WAL, in
  the state folder) and PostgreSQL (a fleet), the schema migrated by the store itself;
- `ingest`: an outcome report checked record by record (`dispatch_contract.outcomes`);
- `quality`: ETA error, Brier score, ECE, late rate, delivery minutes, cost per version x
  city x fallback level;
- `service`: ``POST /v1/outcomes`` and ``GET /v1/quality`` (aiohttp routes for the
  launcher's HTTP service) and their Prometheus collector.

Nothing here imports Triton: the serving adapters build `AnsweredWindow`s and submit them.
The names below are re-exported lazily (module `__getattr__`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatch_service.core.lazy import lazy_exports

if TYPE_CHECKING:
    from dispatch_service.outcomes.records import (
        AnsweredWindow,
        DecisionId,
        DecisionRecord,
        Outcome,
    )
    from dispatch_service.outcomes.sql_store import open_store
    from dispatch_service.outcomes.store import OutcomeStore, StoreError, StoreLimits
    from dispatch_service.outcomes.writer import DecisionWriter, WriterCounts

__all__ = [
    "AnsweredWindow",
    "DecisionId",
    "DecisionRecord",
    "DecisionWriter",
    "Outcome",
    "OutcomeStore",
    "StoreError",
    "StoreLimits",
    "WriterCounts",
    "open_store",
]

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "records": ("AnsweredWindow", "DecisionId", "DecisionRecord", "Outcome"),
            "sql_store": ("open_store",),
            "store": ("OutcomeStore", "StoreError", "StoreLimits"),
            "writer": ("DecisionWriter", "WriterCounts"),
        },
    )
