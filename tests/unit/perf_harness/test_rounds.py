"""Alternating rounds: median and spread of per-round ratios, and the round order."""

from __future__ import annotations

import pytest

from perf.rounds import (
    FLOOR_C1,
    FUSED_C1,
    LIMIT,
    ROUND_ORDER,
    round_gap,
    round_ratio,
    run_rounds,
    spread,
)


def test_spread_is_the_median_and_min_max_of_the_values_present() -> None:
    found = spread([2.4, None, 1.5, 3.1])
    assert found is not None
    assert (found.median, found.low, found.high, found.count) == (2.4, 1.5, 3.1, 3)
    assert found.describe() == "median 2.40 over 3 rounds (min-max 1.50-3.10)"
    assert spread([None]) is None


def test_a_ratio_is_taken_within_each_round() -> None:
    # The host slowed everything in round 2: within-round ratios stay near 2x although the
    # mixed-round ratio (2000 / 500) would read 4x.
    rounds = [
        {"fused_grpc": 2000.0, "fastapi_json": 1000.0},
        {"fused_grpc": 1000.0, "fastapi_json": 500.0},
        {"fused_grpc": 2100.0, "fastapi_json": 1000.0},
    ]
    found = round_ratio(rounds, "fused_grpc", "fastapi_json")
    assert found is not None
    assert found.median == pytest.approx(2.0)
    assert found.low == pytest.approx(2.0) and found.high == pytest.approx(2.1)


def test_rounds_missing_a_side_are_left_out() -> None:
    rounds: list[dict[str, float | None]] = [
        {"fused_grpc": 1000.0, LIMIT: None},
        {"fused_grpc": 1000.0, LIMIT: 800.0},
        {"fused_grpc": None, LIMIT: 800.0},
        {"fused_grpc": 1000.0, LIMIT: 0.0},
    ]
    found = round_ratio(rounds, "fused_grpc", LIMIT)
    assert found is not None and found.count == 1 and found.median == pytest.approx(1.25)
    assert round_ratio([], "fused_grpc", LIMIT) is None


def test_a_gap_is_taken_within_each_round() -> None:
    # Round 2's host added 0.5 ms to both sides: its gap is still 0.3 ms. A round without
    # one side is left out.
    rounds: list[dict[str, float | None]] = [
        {FUSED_C1: 1.0, FLOOR_C1: 0.7},
        {FUSED_C1: 1.5, FLOOR_C1: 1.2},
        {FUSED_C1: 1.1, FLOOR_C1: 0.7},
        {FUSED_C1: None, FLOOR_C1: 0.7},
    ]
    found = round_gap(rounds, FUSED_C1, FLOOR_C1)
    assert found is not None and found.count == 3
    assert (found.median, found.low, found.high) == pytest.approx((0.3, 0.3, 0.4))
    assert round_gap([{FUSED_C1: 1.0}], FUSED_C1, FLOOR_C1) is None


def test_run_rounds_alternates_in_order_and_survives_a_failure() -> None:
    calls: list[str] = []

    def measure(entry: str) -> float:
        calls.append(entry)
        if entry == "grpc" and calls.count("grpc") == 2:
            raise RuntimeError("perf_analyzer hung")
        return float(len(calls))

    measures = {entry: (lambda e=entry: measure(e)) for entry in ROUND_ORDER}
    rounds = run_rounds(3, measures, say=lambda _: None)
    assert calls == list(ROUND_ORDER) * 3
    assert len(rounds) == 3
    assert rounds[1]["grpc"] is None and rounds[2]["grpc"] is not None


def test_run_rounds_stops_when_told() -> None:
    left = iter([True, False])
    rounds = run_rounds(3, {"fused_grpc": lambda: 1.0}, lambda _: None, lambda: next(left))
    assert rounds == [{"fused_grpc": 1.0}]
