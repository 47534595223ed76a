"""Windows, decisions and outcome records for the outcome tests (no server)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dispatch_service.outcomes.records import AnsweredWindow

DECIDED_AT = 1_709_500_000.0  # a window's DISPATCH_TIME (the simulator's epoch, 2024)
NOW = DECIDED_AT + 7200.0  # the server's clock in these tests: two hours later


def answered_window(
    request_id: str = "req-1",
    *,
    orders: int = 3,
    city: str = "shanghai",
    entry_point: str = "dispatch_fused",
    version: int = 1,
    dispatch_time: float = DECIDED_AT,
) -> AnsweredWindow:
    """``orders`` orders o0..; riders r0.. (as many, at least 4); order i assigned rider ri,
    except the last,
    which stays unassigned; ETA 10 + i minutes, P(on time) 0.9, cost 6 + i."""
    assigned = np.arange(orders, dtype=np.int32)
    assigned[-1] = -1
    objectives = np.array(
        [[10.0 + i, 0.9, 6.0 + i] if i < orders - 1 else [0.0, 0.0, 0.0] for i in range(orders)],
        dtype=np.float32,
    )
    topk = np.full((orders, 2), -1, dtype=np.int32)
    topk[:, 0] = np.arange(orders)
    return AnsweredWindow(
        request_id=request_id,
        entry_point=entry_point,
        city=city,
        dispatch_time=dispatch_time,
        order_ids=np.array([f"o{i}".encode() for i in range(orders)], dtype=object),
        user_ids=np.array([f"user-{i}".encode() for i in range(orders)], dtype=object),
        created_at=np.full(orders, dispatch_time - 120.0),
        promised_minutes=np.full(orders, 30.0, dtype=np.float32),
        rider_ids=np.array([f"r{i}".encode() for i in range(max(orders, 4))], dtype=object),
        weights=None,
        model_version=np.full(orders, version, dtype=np.int32),
        fallback_level=np.zeros(orders, dtype=np.int32),
        topk_rider_index=topk,
        assigned_rider_index=assigned,
        assigned_objectives=objectives,
    )


def delivered(request_id: str, order_id: str, rider: str, minutes: float = 20.0) -> dict[str, Any]:
    return {
        "request_id": request_id,
        "order_id": order_id,
        "status": "delivered",
        "picked_up_at": DECIDED_AT + 300.0,
        "delivered_at": DECIDED_AT + minutes * 60.0,
        "rider_id": rider,
    }
