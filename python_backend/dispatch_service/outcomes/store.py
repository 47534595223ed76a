"""The outcome store: one small interface (`OutcomeStore`), two databases behind it.

- SQLite (WAL) in the state folder, the default: nothing to set up, one file
  (`DEFAULT_STORE_FILE` under ``.triton/``). Every Python-backend stub and the launcher
  open the same file; WAL lets them write while the analysis reads.
- PostgreSQL for a fleet: every replica writes its decisions, one analysis reads them all
  (``postgresql://user@host:5432/db``; the driver is psycopg 3).

`sql_store.open_store` picks by the address: a ``postgresql://`` (or ``postgres://``) URL, else a
file path (``sqlite:///abs/path`` also reads). Each store creates and migrates its own
schema when opened (`schema.SCHEMA_VERSION`, a versioned ``outcome_schema`` table), never
by hand. The interface is synchronous and thread-confined (one store per thread): the
decision writer and the outcome service each run it on a thread of their own.

Bounded: `OutcomeStore.prune` drops the decisions (and their outcomes) recorded before the
retention period and, past the size bound, the oldest ones (`StoreLimits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from dispatch_contract.outcomes import OutcomeStatus
from dispatch_service.core.paths import REPO_ROOT
from dispatch_service.outcomes.records import DecisionId, DecisionRecord, DecisionRows, Outcome

__all__ = [
    "DEFAULT_STORE_FILE",
    "DEFAULT_STORE_PATH",
    "OUTCOME_STORE_ENV",
    "DecisionFacts",
    "JoinedRow",
    "OutcomeStore",
    "StoreCounts",
    "StoreError",
    "StoreLimits",
    "is_postgres_url",
    "store_address",
]

DEFAULT_STORE_FILE: Final = "outcomes.sqlite3"
# The launcher's and `dispatch-admin quality`'s default: the checkout's state folder.
DEFAULT_STORE_PATH: Final = REPO_ROOT / ".triton" / DEFAULT_STORE_FILE
_POSTGRES_SCHEMES: Final = ("postgresql://", "postgres://")
# Where the launcher tells the server's stubs to write decision records (a path or URL);
# unset: the entry points record none.
OUTCOME_STORE_ENV: Final = "DISPATCH_OUTCOME_STORE"


class StoreError(RuntimeError):
    """The store cannot be opened, migrated, read or written (down, locked, full)."""


@dataclass(frozen=True)
class StoreLimits:
    """How long and how much the store keeps: decisions recorded more than `retention_s`
    ago go, then the oldest beyond `max_decisions` (their outcomes with them)."""

    retention_s: float = 30 * 86_400.0
    max_decisions: int = 10_000_000

    def __post_init__(self) -> None:
        if not self.retention_s > 0:
            raise ValueError(f"retention_s must be > 0, got {self.retention_s}")
        if self.max_decisions < 1:
            raise ValueError(f"max_decisions must be >= 1, got {self.max_decisions}")


@dataclass(frozen=True)
class DecisionFacts:
    """What checking an outcome needs of its decision."""

    decided_at: float
    assigned_rider: str | None


@dataclass(frozen=True)
class StoreCounts:
    decisions: int
    outcomes: int


@dataclass(frozen=True)
class JoinedRow:
    """One decision with its outcome: what the quality figures read (`quality`)."""

    model_version: int
    city: str
    fallback_level: int
    entry_point: str
    decided_at: float
    created_at: float
    promised_minutes: float
    assigned_rider: str | None
    eta_minutes: float | None
    ontime_probability: float | None
    cost: float | None
    status: OutcomeStatus
    picked_up_at: float | None
    delivered_at: float | None
    rider_id: str | None
    # when the store recorded the decision (the writer's clock, seconds after the answer):
    # what splits decisions by when they were made on the server's clock, whatever
    # DISPATCH_TIME the client sent (a rollout's steps)
    recorded_at: float = 0.0


class OutcomeStore(Protocol):
    """Decisions in, outcomes in, joined rows out. Writes are idempotent: a decision or an
    outcome already stored under its id is left as it is (and not counted)."""

    url: str

    def write_decisions(self, records: Sequence[DecisionRecord], *, recorded_at: float) -> int:
        """Store the records (one transaction); returns how many were new."""
        ...

    def write_decision_rows(self, rows: DecisionRows, *, recorded_at: float) -> int:
        """`write_decisions` for records as columns (the decision writer's batches)."""
        ...

    def decisions(self, ids: Sequence[DecisionId]) -> dict[DecisionId, DecisionFacts]:
        """The stored decisions among ``ids``."""
        ...

    def outcomes(self, ids: Sequence[DecisionId]) -> dict[DecisionId, Outcome]:
        """The stored outcomes among ``ids``."""
        ...

    def write_outcomes(self, outcomes: Sequence[Outcome], *, received_at: float) -> int:
        """Store checked outcomes (one transaction); returns how many were new."""
        ...

    def joined(self, *, since: float = 0.0) -> list[JoinedRow]:
        """Every decision with an outcome received at or after ``since`` (unix seconds)."""
        ...

    def counts(self) -> StoreCounts: ...

    def prune(self, limits: StoreLimits, *, now: float) -> int:
        """Apply the retention period and size bound; returns the decisions dropped."""
        ...

    def close(self) -> None: ...


def is_postgres_url(address: str | Path) -> bool:
    return str(address).startswith(_POSTGRES_SCHEMES)


def store_address(address: str | Path) -> str:
    """A store's address as every process reads it alike: a PostgreSQL URL as given, an
    SQLite file (``sqlite://`` optional) as an absolute path."""
    text = str(address)
    if is_postgres_url(text):
        return text
    return str(Path(text.removeprefix("sqlite://")).resolve())
