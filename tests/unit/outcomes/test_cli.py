"""``dispatch-admin quality`` over a store with known outcomes."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

from dispatch_contract.outcomes import OutcomeStatus
from dispatch_service.ops import admin
from dispatch_service.outcomes.records import Outcome, decision_records
from dispatch_service.outcomes.sql_store import open_store

from .outcome_helpers import DECIDED_AT, answered_window


def filled_store(path: Path) -> None:
    store = open_store(path)
    store.write_decisions(decision_records(answered_window("req-1", orders=3)), recorded_at=1.0)
    # order o0: predicted 10 min at P(on time) 0.9; delivered 16 min after the decision, late
    # (created 2 min before it, promised 30 min: on time would be within 28)
    late = Outcome("req-1", "o0", OutcomeStatus.DELIVERED, picked_up_at=DECIDED_AT + 60,
                   delivered_at=DECIDED_AT + 16 * 60 + 29 * 60, rider_id="r0")  # fmt: skip
    store.write_outcomes([late], received_at=time.time())
    store.close()


def test_the_table_and_the_json(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    filled_store(path)
    out = io.StringIO()
    assert admin.main(["quality", "--store", str(path), "--json"], out) == 0
    (row,) = json.loads(out.getvalue())["quality"]
    assert row["deliveries"] == 1 and row["late_rate"] == 1.0
    assert row["eta_mae"] == 35.0  # |10 - 45|
    assert abs(row["brier"] - 0.81) < 1e-6  # (0.9 - 0)^2
    table = io.StringIO()
    assert admin.main(["quality", "--store", str(path)], table) == 0
    header, line = table.getvalue().splitlines()
    assert header.split()[:4] == ["version", "city", "level", "deliveries"]
    assert line.split()[:4] == ["1", "shanghai", "0", "1"]


def test_an_unreadable_store_fails(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert admin.main(["quality", "--store", str(blocker / "o.sqlite3")], io.StringIO()) == 1
