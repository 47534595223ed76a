"""perf.deadline_burst: how each answer of a short-deadline burst is classified."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from perf.deadline_burst import BurstSettings, classify, run_burst


@pytest.mark.parametrize(
    ("status", "message", "outcome"),
    [
        ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded", "deadline"),
        (
            "StatusCode.CANCELLED",
            "dispatch_fused: request cancelled before it was served",
            "cancelled",
        ),
        (
            "StatusCode.UNAVAILABLE",
            "in ensemble 'dispatch', Exceeds maximum queue size",
            "queue_full",
        ),
        ("StatusCode.UNAVAILABLE", "Request timeout expired", "expired"),
        ("StatusCode.UNAVAILABLE", "failed to connect to all addresses", "down"),
        (
            "StatusCode.UNAVAILABLE",
            "Stream removed (recvmsg:Connection reset by peer (104))",
            "down",
        ),
        ("StatusCode.INTERNAL", "Stub process 'x' is not healthy.", "other"),
        ("StatusCode.INVALID_ARGUMENT", "ORDER_IDS: must be unique", "other"),
    ],
)
def test_each_answer_has_one_outcome(status: str, message: str, outcome: str) -> None:
    assert classify(InferenceServerException(message, status=status)) == outcome


def test_a_result_is_served() -> None:
    assert classify(None) == "served"


def test_bursts_go_to_loopback_only() -> None:
    with pytest.raises(ValueError, match="loopback"):
        run_burst("10.0.0.1:8001", BurstSettings("dispatch", requests=1))
