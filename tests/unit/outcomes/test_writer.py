"""The decision writer: records written off the caller's thread, in batches; a full queue
or a failing store drops records and counts them, and `submit` never waits for the store."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from dispatch_service.core.metrics import DECISION_RECORDS, InMemoryMetrics
from dispatch_service.outcomes.records import DecisionId, DecisionRows
from dispatch_service.outcomes.sql_store import SqliteStore, open_store
from dispatch_service.outcomes.store import OutcomeStore
from dispatch_service.outcomes.writer import (
    REOPEN_AFTER_S,
    DecisionWriter,
    WriterCounts,
    writer_observations,
)

from .outcome_helpers import answered_window


def test_every_submitted_window_is_written_once(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    metrics = InMemoryMetrics()
    writer = DecisionWriter(
        lambda: open_store(path), on_counts=lambda c: metrics.record(writer_observations(c))
    )
    for n in range(50):
        assert writer.submit(answered_window(f"req-{n}", orders=4))
    writer.submit(answered_window("req-0", orders=4))  # the same request again
    assert writer.flush()
    writer.close()
    assert writer.counts == WriterCounts(written=200, duplicate=4)
    assert metrics.counter(DECISION_RECORDS, result="written") == 200
    assert metrics.counter(DECISION_RECORDS, result="duplicate") == 4
    store = open_store(path)
    assert store.counts().decisions == 200
    assert DecisionId("req-49", "o3") in store.decisions([DecisionId("req-49", "o3")])


def test_a_store_that_cannot_open_drops_and_counts(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    errors: list[Exception] = []
    writer = DecisionWriter(lambda: open_store(blocker / "o.sqlite3"), on_error=errors.append)
    for n in range(5):
        assert writer.submit(answered_window(f"req-{n}", orders=3))
    assert writer.flush()
    writer.close()
    assert writer.counts.dropped_store_error == 15
    assert writer.counts.written == 0
    assert errors  # logged by the stub


class GatedStore:
    """A real SQLite store whose writes wait for ``gate``: a store that has become slow."""

    def __init__(self, path: Path, gate: threading.Event) -> None:
        self.inner = SqliteStore(path)
        self.url = self.inner.url
        self.gate = gate
        self.entered = threading.Event()

    def write_decision_rows(self, rows: DecisionRows, *, recorded_at: float) -> int:
        self.entered.set()
        self.gate.wait()
        return self.inner.write_decision_rows(rows, recorded_at=recorded_at)

    def close(self) -> None:
        self.inner.close()


def test_a_slow_store_fills_the_queue_and_submit_does_not_wait(tmp_path: Path) -> None:
    gate = threading.Event()
    store = GatedStore(tmp_path / "o.sqlite3", gate)
    writer = DecisionWriter(lambda: store, max_queued=8, batch_windows=4)  # type: ignore[arg-type,return-value]
    assert writer.submit(answered_window("first", orders=2))
    assert store.entered.wait(10.0)  # the writer now waits inside the store
    accepted = [writer.submit(answered_window(f"req-{n}", orders=2)) for n in range(20)]
    assert accepted == [True] * 8 + [False] * 12  # the bounded queue, then drops
    assert writer.counts.dropped_queue_full == 24
    gate.set()
    assert writer.flush()
    writer.close()
    assert writer.counts.written == 2 + 16
    assert open_store(tmp_path / "o.sqlite3").counts().decisions == 18


def test_flush_waits_for_the_batch_in_the_store(tmp_path: Path) -> None:
    """A window popped from the queue and not yet written is still pending for `flush`."""
    gate = threading.Event()
    store = GatedStore(tmp_path / "o.sqlite3", gate)
    writer = DecisionWriter(lambda: store)  # type: ignore[arg-type,return-value]
    writer.submit(answered_window("held", orders=3))
    assert writer.flush(timeout_s=0.0) is False  # queued, not written
    assert store.entered.wait(10.0)  # the queue is empty now: the batch is in the store
    assert writer.flush(timeout_s=0.2) is False
    assert writer.counts.written == 0
    gate.set()
    assert writer.flush(timeout_s=30.0)
    assert writer.counts == WriterCounts(written=3)
    writer.submit(answered_window("last", orders=1))  # written by close, not lost
    writer.close(timeout_s=30.0)
    assert open_store(tmp_path / "o.sqlite3").counts().decisions == 4


def test_windows_of_different_topk_widths_are_written_in_one_batch(tmp_path: Path) -> None:
    """Windows with fewer riders than K (fewer Top-K columns) beside wider ones: all
    written, none counted unreadable."""
    store = CountingStore(tmp_path / "o.sqlite3")
    # an interval no test waits out: the four gather until the flush
    writer = DecisionWriter(lambda: store, write_interval_s=3600.0)  # type: ignore[arg-type,return-value]
    for n, width in enumerate([2, 1, 0, 2]):
        window = answered_window(f"req-{n}", orders=2)
        object.__setattr__(window, "topk_rider_index", window.topk_rider_index[:, :width])
        writer.submit(window)
    assert writer.flush(timeout_s=30.0)
    writer.close()
    assert store.batches == [8]
    assert writer.counts == WriterCounts(written=8)


def test_a_failure_nobody_foresaw_loses_its_batch_not_the_writer(tmp_path: Path) -> None:
    """The clock fails twice (the write's time, then the failure's): that batch is dropped
    and counted, and the writer's thread goes on writing the next."""
    calls = [0]

    def clock() -> float:
        calls[0] += 1
        if calls[0] <= 2:
            raise RuntimeError("clock failed")
        return 1000.0

    errors: list[Exception] = []
    writer = DecisionWriter(
        lambda: open_store(tmp_path / "o.sqlite3"), clock=clock, on_error=errors.append
    )
    writer.submit(answered_window("lost", orders=2))
    assert writer.flush(timeout_s=30.0)
    writer.submit(answered_window("kept", orders=3))
    assert writer.flush(timeout_s=30.0)
    writer.close()
    assert writer.counts == WriterCounts(written=3, dropped_store_error=2)
    assert [str(e) for e in errors] == ["clock failed"]


class FailingThenWorking:
    """Opens fail until ``healthy`` is set, then a real store opens."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.healthy = False
        self.opens = 0

    def __call__(self) -> OutcomeStore:
        self.opens += 1
        if not self.healthy:
            raise ConnectionError("store down")
        return open_store(self.path)


def test_the_store_is_reopened_after_a_pause(tmp_path: Path) -> None:
    now = [1000.0]
    opener = FailingThenWorking(tmp_path / "o.sqlite3")
    writer = DecisionWriter(opener, clock=lambda: now[0])
    writer.submit(answered_window("a", orders=1))
    assert writer.flush()
    opener.healthy = True
    writer.submit(answered_window("b", orders=1))  # within the pause: dropped, not opened
    assert writer.flush()
    assert opener.opens == 1
    now[0] += REOPEN_AFTER_S
    writer.submit(answered_window("c", orders=1))
    assert writer.flush()
    writer.close()
    assert opener.opens == 2
    assert writer.counts == WriterCounts(written=1, dropped_store_error=2)


def test_a_window_that_cannot_be_read_is_counted_alone(tmp_path: Path) -> None:
    writer = DecisionWriter(lambda: open_store(tmp_path / "o.sqlite3"))
    bad = answered_window("bad", orders=2)
    object.__setattr__(bad, "assigned_objectives", bad.assigned_objectives[:1])  # wrong shape
    writer.submit(bad)
    writer.submit(answered_window("good", orders=2))
    assert writer.flush()
    writer.close()
    assert writer.counts == WriterCounts(written=2, dropped_unreadable=2)


class CountingStore:
    """A real SQLite store that counts its transactions (write_decision_rows calls)."""

    def __init__(self, path: Path) -> None:
        self.inner = SqliteStore(path)
        self.url = self.inner.url
        self.batches: list[int] = []

    def write_decision_rows(self, rows: DecisionRows, *, recorded_at: float) -> int:
        self.batches.append(len(rows))
        return self.inner.write_decision_rows(rows, recorded_at=recorded_at)

    def close(self) -> None:
        self.inner.close()


def test_windows_gather_into_one_transaction_and_flush_does_not_wait_the_interval(
    tmp_path: Path,
) -> None:
    store = CountingStore(tmp_path / "o.sqlite3")
    # an interval far longer than the flush may take: the flush must cut it short
    writer = DecisionWriter(lambda: store, write_interval_s=3600.0)  # type: ignore[arg-type,return-value]
    for n in range(30):
        assert writer.submit(answered_window(f"req-{n}", orders=2))
    assert writer.flush(timeout_s=30.0)
    assert store.batches == [60]  # the burst, one transaction
    writer.submit(answered_window("later", orders=1))
    writer.close(timeout_s=30.0)
    assert store.batches == [60, 1]
    assert writer.counts == WriterCounts(written=61)


def test_records_are_written_after_the_interval_without_a_flush(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    writer = DecisionWriter(lambda: open_store(path), write_interval_s=0.05)
    writer.submit(answered_window("req-1", orders=3))
    deadline = time.monotonic() + 60.0  # a busy host; one interval is 50 ms
    while writer.counts.written < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writer.counts.written == 3
    assert open_store(path).counts().decisions == 3
    writer.close()
