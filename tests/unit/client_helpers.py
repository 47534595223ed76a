"""Shared by the client's unit tests: an in-memory transport, a window and the server's
answer to it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dispatch_client.window_json import window_from_dict

Array = np.ndarray[Any, Any]


class FakeTransport:
    """Answers every call with canned outputs (or raises `error` every time, or `errors` one
    per call until they run out), remembering what it was sent."""

    def __init__(
        self,
        outputs: dict[str, Array] | None = None,
        error: Exception | None = None,
        errors: Sequence[Exception] = (),
    ):
        self.outputs = outputs or {}
        self.request_ids: list[str] = []
        self.error = error
        self.errors = list(errors)
        self.calls: list[tuple[str, dict[str, Array], tuple[str, ...]]] = []
        self.closed = False

    def infer(
        self,
        model_name: str,
        inputs: dict[str, Array],
        output_names: Sequence[str],
        *,
        request_id: str = "",
    ) -> dict[str, Array]:
        self.request_ids.append(request_id)
        self.calls.append((model_name, inputs, tuple(output_names)))
        if self.error is not None:
            raise self.error
        if self.errors:
            raise self.errors.pop(0)
        return {name: self.outputs[name] for name in output_names if name in self.outputs}

    def close(self) -> None:
        self.closed = True


def window(num_orders: int = 3) -> dict[str, Array]:
    return window_from_dict(
        {
            "dispatch_time": 1764400000,
            "orders": [
                {
                    "id": f"o{i}",
                    "user_id": "u",
                    "pickup": [31.23, 121.47],
                    "dropoff": [31.22, 121.48],
                    "created_at": 1764399700,
                    "promised_minutes": 30,
                }
                for i in range(num_orders)
            ],
            "riders": [
                {"id": r, "position": [31.23, 121.47], "capacity": 2, "vehicle": "EBIKE"}
                for r in ("ra", "rb", "rc")
            ],
        }
    )


def answer() -> dict[str, Array]:
    """Three orders, K = 3: full, padded at the end, and all padding (unassigned); the v2
    answer of one window (indices into the riders ra, rb, rc), without the batch dimension."""
    # TOPK_OBJECTIVE_COLUMNS: score, ETA minutes, on-time probability, cost
    objectives = np.zeros((3, 3, 4), np.float32)
    objectives[0] = [[0.9, 12.5, 0.95, 6.5], [0.8, 14, 0.9, 7], [0.1, 30, 0.2, 9]]
    objectives[1, 0] = [0.7, 20, 0.8, 8.25]
    return {
        "TOPK_RIDER_INDEX": np.array([[1, 0, 2], [2, -1, -1], [-1, -1, -1]], np.int32),
        "TOPK_OBJECTIVES": objectives,
        "ASSIGNED_RIDER_INDEX": np.array([0, 2, -1], np.int32),
        "ASSIGNED_SCORE": np.array([0.8, 0.7, 0.0], np.float32),
        # OBJECTIVES of the assigned pairs: ra for o0, rc for o1, none for o2
        "ASSIGNED_OBJECTIVES": np.array([[14, 0.9, 7], [20, 0.8, 8.25], [0, 0, 0]], np.float32),
    }


def outputs() -> dict[str, Array]:
    """`answer()` as the server sends it: behind the batch dimension of 1."""
    return {name: value[np.newaxis] for name, value in answer().items()}
