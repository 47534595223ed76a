"""Decision records written off the request path: a bounded queue and a batch writer.

An entry point calls `DecisionWriter.submit` with the `AnsweredWindow` of each answered
window: a non-blocking put of a reference, nothing else on the request's thread. A
thread of the writer lets windows gather for `WRITE_INTERVAL_S` after the first, turns them
into the records' columns together (`records.decision_rows`, a few numpy calls per column
for the whole batch) and writes them in one transaction: a busy stub pays one transaction a
few times a second, not one per window (each costs its lock, its commit and, with several
stubs on one SQLite file, a wait for the others' lock and a re-read of the pages they
changed). Nothing the store does reaches a request: when the queue is full the window's
records are dropped at once, and when the store is down, slow past its lock timeout or
refuses a write, the batch is dropped; both are counted by reason (`WriterCounts`, the
``dispatch_decision_records_total`` metric through ``on_counts``). A store that failed is
opened again after `REOPEN_AFTER_S`.

One writer per process (a Python-backend stub is a process of its own): each opens its
own connection to the store.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from dispatch_service.core.metrics import DECISION_RECORDS, Observation
from dispatch_service.outcomes.records import AnsweredWindow, DecisionRows, decision_rows
from dispatch_service.outcomes.store import OutcomeStore

__all__ = [
    "DEFAULT_BATCH_WINDOWS",
    "DEFAULT_QUEUE_WINDOWS",
    "REOPEN_AFTER_S",
    "WRITE_INTERVAL_S",
    "DecisionWriter",
    "WriterCounts",
    "writer_observations",
]

# Windows the queue holds (a c=64 burst of windows many times over); beyond: dropped.
DEFAULT_QUEUE_WINDOWS: Final = 4096
# Windows per transaction at most.
DEFAULT_BATCH_WINDOWS: Final = 256
# How long windows gather after the first before they are written (`flush` cuts it short):
# what a record waits to be readable, and the reciprocal of the transactions per second.
WRITE_INTERVAL_S: Final = 0.25
# After a failure the store is reopened no sooner than this; batches meanwhile are dropped.
REOPEN_AFTER_S: Final = 1.0


@dataclass(frozen=True)
class WriterCounts:
    """Orders (one decision record each), by what became of them."""

    written: int = 0  # stored now
    duplicate: int = 0  # already stored under the same decision id (a resent request)
    dropped_queue_full: int = 0
    dropped_store_error: int = 0  # the store down, locked past its timeout, or refusing
    dropped_unreadable: int = 0  # the answered window could not be turned into records

    def __add__(self, other: WriterCounts) -> WriterCounts:
        return WriterCounts(
            **{name: value + getattr(other, name) for name, value in vars(self).items()}
        )


class _NotReopenedError(Exception):
    """The store failed less than REOPEN_AFTER_S ago: the batch is dropped unwritten."""


class DecisionWriter:
    """The bounded queue and its writer thread (started at construction)."""

    def __init__(
        self,
        open_store: Callable[[], OutcomeStore],
        *,
        max_queued: int = DEFAULT_QUEUE_WINDOWS,
        batch_windows: int = DEFAULT_BATCH_WINDOWS,
        write_interval_s: float = WRITE_INTERVAL_S,
        on_counts: Callable[[WriterCounts], None] | None = None,
        on_error: Callable[[Exception], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``on_counts`` gets each change of the counts (from the writer's thread, or from
        `submit` for a drop); ``on_error`` each store failure."""
        self._open_store = open_store
        # Appended by `submit`, popped by the writer's thread: a deque's append and popleft
        # hold no lock (the GIL makes each atomic), so a request never waits for the writer.
        self._queue: deque[AnsweredWindow] = deque()
        self.max_queued = max_queued
        self.batch_windows = batch_windows
        self.write_interval_s = write_interval_s
        self.on_counts = on_counts
        self.on_error = on_error
        self.clock = clock
        self._counts = WriterCounts()
        self._counts_lock = threading.Lock()
        self._store: OutcomeStore | None = None
        self._failed_at: float | None = None
        self._wake = threading.Event()  # set by a submit while the writer has not seen it
        self._hurry = threading.Event()  # set while someone waits for the queue to empty
        self._idle = threading.Condition()  # notified after each batch (`flush` waits on it)
        self._writing = False  # the writer holds windows popped and not yet written
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="decision-writer", daemon=True)
        self._thread.start()

    @property
    def thread_id(self) -> int:
        """The writer thread's id in the OS (a benchmark reads its CPU time by it)."""
        native_id = self._thread.native_id
        if native_id is None:  # the thread starts in __init__
            raise RuntimeError("the decision writer's thread has not started")
        return native_id

    @property
    def counts(self) -> WriterCounts:
        with self._counts_lock:
            return self._counts

    def _count(self, change: WriterCounts) -> None:
        with self._counts_lock:
            self._counts = self._counts + change
        if self.on_counts is not None:
            with contextlib.suppress(Exception):  # a metrics failure must not stop the writer
                self.on_counts(change)

    def submit(self, window: AnsweredWindow) -> bool:
        """Queue the window's records; False (and counted) when the queue is full. Takes no
        lock but the first time after the writer woke (`threading.Event.set`)."""
        if len(self._queue) >= self.max_queued:
            self._count(WriterCounts(dropped_queue_full=len(window.order_ids)))
            return False
        self._queue.append(window)
        if not self._wake.is_set():
            self._wake.set()
        return True

    def count_unreadable(self, orders: int = 1) -> None:
        """A window whose records could not be built (by its entry point)."""
        self._count(WriterCounts(dropped_unreadable=orders))

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Write what is queued now (no waiting out the interval) and wait until every
        submitted window is written or dropped; False on timeout."""
        with self._idle:
            if self._queue:
                self._hurry.set()
            return self._idle.wait_for(lambda: not self._queue and not self._writing, timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (up to ``timeout_s``), stop the thread, close the store."""
        self.flush(timeout_s)
        self._closing = True
        self._hurry.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._closing:
            self._wake.wait()
            self._wake.clear()  # before the queue is read: a later submit sets it again
            if 0 < len(self._queue) < self.batch_windows and not self._closing:
                self._hurry.wait(self.write_interval_s)  # let the batch gather
            self._drain()
        self._drain()
        self._close_store()

    def _drain(self) -> None:
        """Write the windows queued now, ``batch_windows`` to a transaction (those queued
        meanwhile gather for the next)."""
        left = len(self._queue)
        while left > 0:
            with self._idle:
                self._writing = True  # before the pop: `flush` sees the batch in one place
            batch = [self._queue.popleft() for _ in range(min(left, self.batch_windows))]
            left -= len(batch)
            try:
                self._write(batch)
            except Exception as exc:  # unforeseen: this batch is lost (counted), not the writer
                self._lost(batch, exc)
            finally:
                with self._idle:
                    self._writing = False
                    if not self._queue:
                        self._hurry.clear()
                    self._idle.notify_all()

    def _write(self, batch: list[AnsweredWindow]) -> None:
        rows = self._rows(batch)
        if not len(rows):
            return
        try:
            store = self._store_now()
            written = store.write_decision_rows(rows, recorded_at=self.clock())
        except Exception as exc:
            if not isinstance(exc, _NotReopenedError):
                self._failed(exc)
            self._count(WriterCounts(dropped_store_error=len(rows)))
        else:
            self._count(WriterCounts(written=written, duplicate=len(rows) - written))

    def _lost(self, batch: list[AnsweredWindow], exc: Exception) -> None:
        with contextlib.suppress(Exception):  # the batch's windows may be what failed
            self._count(WriterCounts(dropped_store_error=sum(w.order_ids.size for w in batch)))
        if self.on_error is not None:
            with contextlib.suppress(Exception):  # a logging failure must not stop the writer
                self.on_error(exc)

    def _rows(self, batch: list[AnsweredWindow]) -> DecisionRows:
        """The batch's records, built together; where a window's arrays cannot be read,
        window by window, so that only that window is lost (and counted)."""
        try:
            return decision_rows(batch)
        except Exception:  # some window's arrays cannot be read: find which
            parts = []
            for window in batch:
                try:
                    parts.append(decision_rows([window]))
                except Exception:
                    self.count_unreadable(len(window.order_ids))
            return DecisionRows.joined(parts)

    def _store_now(self) -> OutcomeStore:
        if self._store is None:
            if self._failed_at is not None and self.clock() - self._failed_at < REOPEN_AFTER_S:
                raise _NotReopenedError()
            self._store = self._open_store()
        return self._store

    def _failed(self, exc: Exception) -> None:
        self._failed_at = self.clock()
        if self.on_error is not None:
            with contextlib.suppress(Exception):  # a logging failure must not stop the writer
                self.on_error(exc)
        self._close_store()

    def _close_store(self) -> None:
        store, self._store = self._store, None
        if store is not None:
            with contextlib.suppress(Exception):  # it failed already
                store.close()


def writer_observations(change: WriterCounts) -> list[Observation]:
    """A change of the counts as `DECISION_RECORDS` observations (the nonzero ones)."""
    return [
        Observation(DECISION_RECORDS, float(value), (("result", name),))
        for name, value in vars(change).items()
        if value
    ]
