"""The overload summary counts per level, and the generator only loads loopback, bounded."""

from __future__ import annotations

import pytest

from perf.overload import Outcome, OverloadResult, refusal_reason, run_overload


def test_summary_counts_accepted_and_refused_per_level() -> None:
    result = OverloadResult("dispatch_fused", 512, 2.0, next_request_served=True)
    result.outcomes = [
        Outcome(1, True, 10.0),
        Outcome(1, True, 30.0),
        Outcome(3, True, 20.0),
        Outcome(3, False, 0.5, "StatusCode.UNAVAILABLE", "queue full"),
        Outcome(3, False, 1.5, "StatusCode.UNAVAILABLE", "queue full"),
        Outcome(3, False, 250.0, "StatusCode.UNAVAILABLE", "deadline"),
    ]
    result.probes = {1: [Outcome(1, True, 4.0), Outcome(1, False, 2.0, "s", "queue full")]}
    summary = result.summary()
    assert summary["next_request_served"] is True
    assert summary["level_1"]["accepted"] == 2 and summary["level_1"]["refused"] == 0
    assert summary["level_1"]["accepted_per_s"] == 1.0
    assert summary["level_1"]["refusal_p99_ms"] is None
    assert summary["level_3"]["refused"] == 3
    assert summary["level_3"]["refusal_p50_ms"] == pytest.approx(1.5)
    # A deadline refusal waits its deadline out: the full-queue figure leaves it aside.
    assert summary["level_3"]["queue_full_refusal_p99_ms"] == pytest.approx(1.5, abs=0.02)
    assert summary["level_3"]["refusal_reasons"] == {"deadline": 1, "queue full": 2}
    assert summary["level_3"]["refusal_statuses"] == ["StatusCode.UNAVAILABLE"]
    probe = summary["probe_level_1"]
    assert (probe["accepted"], probe["refused"], probe["accepted_p99_ms"]) == (1, 1, 4.0)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        ("[StatusCode.UNAVAILABLE] Exceeds maximum queue size", "queue full"),
        ("[StatusCode.UNAVAILABLE] Request timeout expired", "deadline"),
        ("[StatusCode.INTERNAL] stub died", "other"),
    ],
)
def test_refusal_reason_reads_triton_queue_policy_messages(message: str, reason: str) -> None:
    assert refusal_reason(message) == reason


@pytest.mark.parametrize(
    ("url", "concurrency", "seconds"),
    [("10.0.0.1:8001", 8, 1.0), ("127.0.0.1:8001", 5000, 1.0), ("127.0.0.1:8001", 8, 600.0)],
)
def test_load_goes_only_to_loopback_and_is_bounded(
    url: str, concurrency: int, seconds: float
) -> None:
    with pytest.raises(ValueError):
        run_overload(url, "dispatch_fused", concurrency, seconds)


def test_probe_levels_are_priority_levels() -> None:
    with pytest.raises(ValueError, match="probe levels"):
        run_overload("127.0.0.1:8001", "dispatch_fused", 8, 1.0, probe_levels=(0,))
