"""perf.idle_cost: one window's CPU time after an idle gap."""

from __future__ import annotations

import time

import pytest

from perf.idle_cost import cpu_per_window


def test_each_gap_is_waited_before_every_measured_window() -> None:
    started = time.perf_counter()
    report = cpu_per_window("small", [0.0, 5.0], seconds=0.05)
    elapsed = time.perf_counter() - started
    hot, idle = report["runs"]
    assert (hot["gap_ms"], idle["gap_ms"]) == (0.0, 5.0)
    assert hot["windows"] >= 1 and idle["windows"] >= 1
    assert hot["cpu_us_per_window"] > 0 and idle["cpu_us_per_window"] > 0
    assert elapsed >= idle["windows"] * 0.005  # slept 5 ms before each window


def test_a_negative_gap_is_refused() -> None:
    with pytest.raises(ValueError, match="idle gap"):
        cpu_per_window("small", [-1.0], seconds=0.01)
