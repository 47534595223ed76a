"""The overload summary counts per level, and the generator only loads loopback, bounded."""

from __future__ import annotations

import pytest

from perf.overload import Outcome, OverloadResult, run_overload


def test_summary_counts_accepted_and_refused_per_level() -> None:
    result = OverloadResult("dispatch_fused", 512, 2.0, next_request_served=True)
    result.outcomes = [
        Outcome(1, True, 10.0),
        Outcome(1, True, 30.0),
        Outcome(3, True, 20.0),
        Outcome(3, False, 0.5, "StatusCode.UNAVAILABLE"),
        Outcome(3, False, 1.5, "StatusCode.UNAVAILABLE"),
    ]
    summary = result.summary()
    assert summary["next_request_served"] is True
    assert summary["level_1"]["accepted"] == 2 and summary["level_1"]["refused"] == 0
    assert summary["level_1"]["accepted_per_s"] == 1.0
    assert summary["level_1"]["refusal_p99_ms"] is None
    assert summary["level_3"]["refused"] == 2
    assert summary["level_3"]["refusal_p50_ms"] == pytest.approx(1.0)
    assert summary["level_3"]["refusal_statuses"] == ["StatusCode.UNAVAILABLE"]


@pytest.mark.parametrize(
    ("url", "concurrency", "seconds"),
    [("10.0.0.1:8001", 8, 1.0), ("127.0.0.1:8001", 5000, 1.0), ("127.0.0.1:8001", 8, 600.0)],
)
def test_load_goes_only_to_loopback_and_is_bounded(
    url: str, concurrency: int, seconds: float
) -> None:
    with pytest.raises(ValueError):
        run_overload(url, "dispatch_fused", concurrency, seconds)
