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
import queue
import threading
import time
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
        self._queue: queue.Queue[AnsweredWindow | None] = queue.Queue(maxsize=max_queued)
        self.batch_windows = batch_windows
        self.write_interval_s = write_interval_s
        self.on_counts = on_counts
        self.on_error = on_error
        self.clock = clock
        self._counts = WriterCounts()
        self._counts_lock = threading.Lock()
        self._store: OutcomeStore | None = None
        self._failed_at: float | None = None
        self._idle = threading.Condition()
        self._pending = 0  # windows submitted and not yet written or dropped
        self._hurry = threading.Event()  # set while someone waits for the queue to empty
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
        """Queue the window's records; False (and counted) when the queue is full."""
        with self._idle:
            self._pending += 1
        try:
            self._queue.put_nowait(window)
        except queue.Full:
            self._done(1)
            self._count(WriterCounts(dropped_queue_full=len(window.order_ids)))
            return False
        return True

    def count_unreadable(self, orders: int = 1) -> None:
        """A window whose records could not be built (by its entry point)."""
        self._count(WriterCounts(dropped_unreadable=orders))

    def _done(self, windows: int) -> None:
        with self._idle:
            self._pending -= windows
            if self._pending <= 0:
                self._hurry.clear()
                self._idle.notify_all()

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Write what is queued now (no waiting out the interval) and wait until every
        submitted window is written or dropped; False on timeout."""
        with self._idle:
            if self._pending > 0:
                self._hurry.set()
            return self._idle.wait_for(lambda: self._pending <= 0, timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (up to ``timeout_s``), stop the thread, close the store."""
        self.flush(timeout_s)
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=1.0)
        self._hurry.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                break
            if self._queue.qsize() < self.batch_windows:
                self._hurry.wait(self.write_interval_s)  # let the batch gather
            batch = [first]
            while len(batch) < self.batch_windows:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._write(batch)
                    self._close_store()
                    return
                batch.append(item)
            self._write(batch)
        self._close_store()

    def _write(self, batch: list[AnsweredWindow]) -> None:
        try:
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
        finally:
            self._done(len(batch))

    def _rows(self, batch: list[AnsweredWindow]) -> DecisionRows:
        """The batch's records, built together; where a window's arrays cannot be read,
        the readable windows', so that only that window is lost (and counted)."""
        try:
            return decision_rows(batch)
        except Exception:  # some window's arrays cannot be read: find which
            readable = []
            for window in batch:
                try:
                    decision_rows([window])
                except Exception:
                    self.count_unreadable(len(window.order_ids))
                else:
                    readable.append(window)
            return decision_rows(readable)

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
