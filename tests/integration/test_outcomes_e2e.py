"""Decisions and outcomes through the launcher (`python -m dispatch_service.ops.server`):
every answered order of every entry point (the `dispatch` ensemble, `dispatch_fused`,
`dispatch_priority`) recorded once, with what the client was answered; outcomes reported
back with `DispatchClient.report_outcomes` behind the outcome key; live quality on the
launcher's /metrics; a store made slow under c=64 load fails no request, and every record
it could not take is counted."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from launcher_helpers import Launcher, free_port
from patience import patience, wait_for

from dispatch_client import DispatchClient, DispatchResult
from dispatch_client.errors import DispatchServerError
from dispatch_client.outcomes import OutcomeReport
from dispatch_contract.outcomes import OUTCOME_KEY_HEADER
from dispatch_service.ops.server import Ports
from dispatch_service.outcomes.records import DecisionId
from dispatch_service.outcomes.sql_store import open_store
from triton_helpers import metric_series, sim_window

ENTRY_POINTS = ("dispatch", "dispatch_fused", "dispatch_priority")


@dataclass
class Served:
    launcher: Launcher
    store: Path
    health_url: str
    key: str
    priority_key: str


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("outcomes")
    store = folder / "outcomes.sqlite3"
    health = free_port()
    ports = Ports.free()
    launcher = Launcher(
        ports, folder / "server.log", folder / "keys",
        "--health-port", str(health), "--outcome-store", str(store),
    )  # fmt: skip
    try:
        assert launcher.read_until("ready:", patience(240)), "\n".join(launcher.lines)
        key = (folder / "keys" / "outcome.key").read_text().strip()
        assert key not in "\n".join(launcher.lines)  # the path is printed, never the key
        priority_key = (folder / "keys" / "priority.key").read_text().strip()
        yield Served(launcher, store, f"http://127.0.0.1:{health}", key, priority_key)
    finally:
        launcher.stop()


def client(served: Served, model: str) -> DispatchClient:
    return DispatchClient.grpc(
        f"127.0.0.1:{served.launcher.ports.grpc}",
        model_name=model,
        priority_lane=None,
        priority_key=served.priority_key,  # the lane serves only windows that carry it
    )


def stored_rows(store: Path, request_ids: list[str]) -> dict[DecisionId, sqlite3.Row]:
    with sqlite3.connect(store) as conn:
        conn.row_factory = sqlite3.Row
        marks = ",".join("?" * len(request_ids))
        rows = conn.execute(f"SELECT * FROM decisions WHERE request_id IN ({marks})", request_ids)
        return {DecisionId(r["request_id"], r["order_id"]): r for r in rows}


def test_every_answered_order_is_recorded_once_as_answered(served: Served) -> None:
    sent: dict[str, tuple[str, DispatchResult, float]] = {}
    users: set[str] = set()
    for model in ENTRY_POINTS:
        with client(served, model) as c:
            for seed in range(4):
                window = sim_window(100 + seed, 12, 8)
                users.update(u.decode() for u in window["ORDER_TEXT"][:, 0])
                request_id = f"{model}-{seed}"
                result = c.dispatch(window, request_id=request_id)
                sent[request_id] = (model, result, float(window["WINDOW_FIELDS"][0]))
                c.dispatch(window, request_id=request_id)  # a resend: still one record each
    orders = sum(len(result.orders) for _, result, _ in sent.values())
    ids = list(sent)

    def all_written() -> bool:
        return len(stored_rows(served.store, ids)) == orders

    wait_for(all_written, f"{orders} decision records", 60)
    rows = stored_rows(served.store, ids)
    assert len(rows) == orders
    for request_id, (model, result, decided_at) in sent.items():
        for order in result.orders:
            row = rows[DecisionId(request_id, order.order_id)]
            assert row["entry_point"] == model
            assert row["decided_at"] == decided_at
            assert row["city"] == "shanghai"
            assert row["assigned_rider"] == order.assigned_rider_id
            assert json.loads(row["topk_riders"]) == [c.rider_id for c in order.top_k]
            assert row["model_version"] == order.model_version
            assert row["fallback_level"] == order.fallback_level
            assert 0 <= row["routing_bucket"] < 100
            if order.assigned_rider_id is not None:
                assert row["eta_minutes"] == pytest.approx(order.assigned_eta_minutes, rel=1e-6)
                assert row["ontime_probability"] == pytest.approx(
                    order.assigned_ontime_probability, rel=1e-6
                )
                assert row["cost"] == pytest.approx(order.assigned_cost, rel=1e-6)
    # no user id nor address in the store: the user's routing bucket only
    with sqlite3.connect(served.store) as conn:
        columns = {r[1] for r in conn.execute("PRAGMA table_info(decisions)")}
    assert not {c for c in columns if re.search(r"user|address|pickup|dropoff|_lat$|_lon$", c)}
    with sqlite3.connect(served.store) as conn:  # nor any of the windows' user ids as a value
        values = {str(v) for row in conn.execute("SELECT * FROM decisions") for v in row}
    assert users and not any(user in value for user in users for value in values)


def test_outcomes_reported_back_join_and_give_live_quality(served: Served) -> None:
    with client(served, "dispatch_fused") as c:
        window = sim_window(7, 20, 10)
        result = c.dispatch(window, request_id="quality-window")
        decided_at = float(window["WINDOW_FIELDS"][0])
        assigned = [o for o in result.orders if o.assigned_rider_id is not None]
        wait_for(
            lambda: len(stored_rows(served.store, ["quality-window"])) == len(result.orders),
            "the window's records",
            60,
        )
        reports = [
            OutcomeReport.delivered(
                "quality-window",
                o.order_id,
                picked_up_at=decided_at + 120,
                delivered_at=decided_at + 25 * 60,
                rider_id=o.assigned_rider_id or "",
            )
            for o in assigned
        ]
        wrong = OutcomeReport.delivered(
            "quality-window", assigned[0].order_id, picked_up_at=decided_at + 1,
            delivered_at=decided_at + 2, rider_id="not-the-rider",
        )  # fmt: skip
        with pytest.raises(DispatchServerError, match="missing_key"):
            c.report_outcomes(reports, url=served.health_url, key="")
        receipt = c.report_outcomes([*reports, wrong], url=served.health_url, key=served.key)
    assert receipt.stored == len(assigned)
    assert [(r.index, r.reason) for r in receipt.refused] == [
        (len(assigned), "duplicate_in_report")
    ]
    assert open_store(served.store).counts().outcomes >= len(assigned)

    # the figures, over exactly these deliveries: every one 25 minutes after the decision
    request = urllib.request.Request(
        f"{served.health_url}/v1/quality?since=0", headers={OUTCOME_KEY_HEADER: served.key}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        quality = json.loads(response.read())["quality"]
    fused = [q for q in quality if q["deliveries"] == len(assigned)]
    assert fused, quality
    predicted = [o.assigned_eta_minutes for o in assigned]
    expected_mae = sum(abs(p - 25.0) for p in predicted if p is not None) / len(assigned)
    assert fused[0]["eta_mae"] == pytest.approx(expected_mae, rel=1e-5)

    def gauges() -> list[tuple[dict[str, str], float]]:
        return metric_series(f"{served.health_url}/metrics", "dispatch_quality_eta_mae")

    wait_for(lambda: gauges(), "the quality gauges on the launcher's /metrics", 60)


def test_a_slow_store_under_load_fails_no_request_and_counts_the_drops(served: Served) -> None:
    metrics_url = f"http://127.0.0.1:{served.launcher.ports.metrics}/metrics"

    def records(result: str) -> float:
        return sum(
            value
            for labels, value in metric_series(metrics_url, "dispatch_decision_records_total")
            if labels.get("result") == result and labels.get("model") == "dispatch_fused"
        )

    before = {r: records(r) for r in ("written", "dropped_store_error", "dropped_queue_full")}
    window = sim_window(11, 6, 6)
    orders = 6
    failures: list[BaseException] = []
    answered = 0
    lock = threading.Lock()
    conn = sqlite3.connect(served.store, timeout=30, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")  # the store now takes no write: each writer waits, then drops

    def send(n: int) -> None:
        nonlocal answered
        with client(served, "dispatch_fused") as c:
            for i in range(4):
                try:
                    c.dispatch(window, request_id=f"slow-{n}-{i}")
                except BaseException as exc:
                    failures.append(exc)
                else:
                    with lock:
                        answered += 1

    try:
        with ThreadPoolExecutor(max_workers=64) as pool:
            list(pool.map(send, range(64)))
        # the lock held until the writers give up on it (their lock timeout) and drop
        wait_for(
            lambda: records("dropped_store_error") > before["dropped_store_error"],
            "records dropped while the store is locked",
            60,
            every_s=1.0,
        )
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    assert failures == []
    assert answered == 256

    def accounted() -> bool:
        gained = {r: records(r) - before[r] for r in before}
        return gained["written"] + gained["dropped_store_error"] + gained["dropped_queue_full"] >= (
            answered * orders
        )

    wait_for(accounted, "every record written or counted as dropped", 90, every_s=1.0)
    dropped = sum(records(r) - before[r] for r in ("dropped_store_error", "dropped_queue_full"))
    assert dropped > 0
