"""Outcome ingestion: reports checked and stored per second, SQLite and PostgreSQL.

What the launcher does for each ``POST /v1/outcomes`` body, in process and on one core
(the process pinned to one CPU): `ingest.ingest_report` on a JSON report of
``--report-size`` outcomes (UTF-8 and JSON read, each record's shape checked, its decision
and any stored outcome looked up, the good ones inserted in one transaction), over a store
already holding ``--decisions`` decision records. Every outcome is a delivery by the
assigned rider with valid times, so every one is stored: nothing is refused early.

    python -m perf.outcomes_bench [--decisions 200000] [--report-size 1000] [--rounds 3]
                                  [--backend sqlite,postgres] [--out FILE]

PostgreSQL runs on a throwaway server on this host (`perf.postgres_server`), so it shares
the machine's cores with the benchmark (its server processes are not pinned). Each round is
timed by the wall clock and by this process's CPU time (on a busy host the pinned core is
shared, and the CPU-time rate is what a core of its own would give SQLite). The report
(JSON, `perf/reports/outcomes-<time>.json`) has, per backend, outcomes/s per round and the
median, and the decision-write rate of the set-up (the `DecisionWriter`'s batches of 256
windows x 8 orders). Not a test: it asserts nothing; `--min-rate` only makes the exit code
say whether SQLite met a target.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from dispatch_service.core.paths import REPO_ROOT
from dispatch_service.outcomes.ingest import ingest_report
from dispatch_service.outcomes.records import AnsweredWindow, decision_records
from dispatch_service.outcomes.sql_store import open_store
from dispatch_service.outcomes.store import OutcomeStore
from perf.postgres_server import throwaway_postgres

__all__ = ["main", "measure", "report_path"]

DECIDED_AT = 1_709_500_000.0
ORDERS_PER_WINDOW = 8


def report_path(kind: str) -> Path:
    """``perf/reports/<kind>-<UTC time>.json``: run outputs stay out of git."""
    folder = REPO_ROOT / "perf" / "reports"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{kind}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"


def window(request_id: str) -> AnsweredWindow:
    """A window of ORDERS_PER_WINDOW orders, order i assigned rider i."""
    n = ORDERS_PER_WINDOW
    return AnsweredWindow(
        request_id=request_id,
        entry_point="dispatch_fused",
        city="shanghai",
        dispatch_time=DECIDED_AT,
        order_ids=np.array([f"o{i}".encode() for i in range(n)], dtype=object),
        user_ids=np.array([f"u{i}".encode() for i in range(n)], dtype=object),
        created_at=np.full(n, DECIDED_AT - 60),
        promised_minutes=np.full(n, 30.0, dtype=np.float32),
        rider_ids=np.array([f"r{i}".encode() for i in range(n)], dtype=object),
        weights=None,
        model_version=np.ones(n, dtype=np.int32),
        fallback_level=np.zeros(n, dtype=np.int32),
        topk_rider_index=np.arange(n, dtype=np.int32).reshape(n, 1),
        assigned_rider_index=np.arange(n, dtype=np.int32),
        assigned_objectives=np.tile(np.array([[20.0, 0.8, 6.0]], dtype=np.float32), (n, 1)),
    )


def fill(store: OutcomeStore, windows: int) -> float:
    """``windows`` windows' decisions written as the writer writes them; returns records/s."""
    started = time.perf_counter()
    batch: list[Any] = []
    for w in range(windows):
        batch.extend(decision_records(window(f"req-{w}")))
        if len(batch) >= 256 * ORDERS_PER_WINDOW:
            store.write_decisions(batch, recorded_at=time.time())
            batch = []
    if batch:
        store.write_decisions(batch, recorded_at=time.time())
    return windows * ORDERS_PER_WINDOW / (time.perf_counter() - started)


def reports(windows: int, size: int, offset: int) -> list[bytes]:
    """Delivery reports for every order of windows [offset, offset + windows), ``size`` a body."""
    records = [
        {
            "request_id": f"req-{w}",
            "order_id": f"o{i}",
            "status": "delivered",
            "picked_up_at": DECIDED_AT + 120.0,
            "delivered_at": DECIDED_AT + 1500.0 + i,
            "rider_id": f"r{i}",
        }
        for w in range(offset, offset + windows)
        for i in range(ORDERS_PER_WINDOW)
    ]
    return [
        json.dumps({"outcomes": records[s : s + size]}).encode()
        for s in range(0, len(records), size)
    ]


def measure(
    open_: Callable[[], OutcomeStore], *, decisions: int, report_size: int, rounds: int
) -> dict[str, Any]:
    """Fill a store, then ingest ``rounds`` disjoint slices of its decisions' outcomes."""
    windows = decisions // ORDERS_PER_WINDOW
    per_round = windows // rounds
    store = open_()
    try:
        write_rate = fill(store, windows)
        rates, cpu_rates = [], []
        for r in range(rounds):
            bodies = reports(per_round, report_size, r * per_round)
            started, cpu_started = time.perf_counter(), time.process_time()
            stored = sum(
                ingest_report(b, store, clock=lambda: DECIDED_AT + 7200).stored for b in bodies
            )
            elapsed = time.perf_counter() - started
            cpu = time.process_time() - cpu_started
            assert stored == per_round * ORDERS_PER_WINDOW, "every outcome is stored"
            rates.append(stored / elapsed)
            cpu_rates.append(stored / cpu)
    finally:
        store.close()
    return {
        "decision_records_per_s": round(write_rate),
        "outcomes_per_s": [round(rate) for rate in rates],
        "median_outcomes_per_s": round(statistics.median(rates)),
        # per second of this process's CPU time: the rate of a core of its own (SQLite runs
        # in this process; PostgreSQL's server work is in its own processes, not counted)
        "outcomes_per_cpu_s": [round(rate) for rate in cpu_rates],
        "median_outcomes_per_cpu_s": round(statistics.median(cpu_rates)),
        "outcomes_per_round": per_round * ORDERS_PER_WINDOW,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, default=200_000)
    parser.add_argument("--report-size", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="sqlite,postgres")
    parser.add_argument("--out", type=Path, default=None, help="default: perf/reports/")
    parser.add_argument("--min-rate", type=float, default=10_000.0, help="SQLite's target")
    args = parser.parse_args(argv)
    cpu = sorted(os.sched_getaffinity(0))[-1]
    os.sched_setaffinity(0, {cpu})  # one core
    result: dict[str, Any] = {
        "command": "python -m perf.outcomes_bench " + " ".join(argv or []),
        "host": {
            "cpus": os.cpu_count(),
            "pinned_to_cpu": cpu,
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
        },
        "decisions": args.decisions,
        "report_size": args.report_size,
    }
    backends = args.backend.split(",")
    with ExitStack() as stack:
        if "sqlite" in backends:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            result["sqlite"] = measure(
                lambda: open_store(folder / "outcomes.sqlite3"),
                decisions=args.decisions, report_size=args.report_size, rounds=args.rounds,
            )  # fmt: skip
            print("sqlite", result["sqlite"], flush=True)
        if "postgres" in backends:
            url = stack.enter_context(throwaway_postgres())
            result["postgres"] = measure(
                lambda: open_store(url),
                decisions=args.decisions, report_size=args.report_size, rounds=args.rounds,
            )  # fmt: skip
            print("postgres", result["postgres"], flush=True)
    result["host"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    out = args.out or report_path("outcomes")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"report: {out}")
    sqlite = result.get("sqlite")
    return 0 if sqlite is None or sqlite["median_outcomes_per_s"] >= args.min_rate else 1


if __name__ == "__main__":
    raise SystemExit(main())
