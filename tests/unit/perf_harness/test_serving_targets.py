"""The serving targets (open loop, rounds, single windows) and how the report shows them."""

from __future__ import annotations

from typing import Any

import pytest

from perf.report import render_report
from perf.results import BenchResults, Series
from perf.rounds import FLOOR_C1, FUSED_C1
from perf.serving_targets import open_loop_targets, single_window_targets
from perf.stats import LevelStats, LimitStats
from perf.targets import compute_targets, goal_targets


def _figures(accepted: int, refused: int, p99: float | None, full_p99: float | None) -> Any:
    return {
        "sent": accepted + refused,
        "accepted": accepted,
        "refused": refused,
        "accepted_per_s": accepted / 2,
        "accepted_p50_ms": None if p99 is None else p99 / 2,
        "accepted_p99_ms": p99,
        "refusal_p50_ms": full_p99,
        "refusal_p99_ms": full_p99,
        "queue_full_refusal_p99_ms": full_p99,
        "refusal_reasons": {"queue full": refused} if refused else {},
    }


def _burst(
    lag_p99: float,
    recovery: float | None,
    probe: Any,
    level: int = 2,
    model: str = "dispatch_fused",
) -> Any:
    return {
        "rate_per_s": 1500.0,
        "burst_s": 2.0,
        "generator": {
            **_figures(1000, 2000, 1100.0, 3.0),
            "send_lag_p50_ms": 0.4,
            "send_lag_p99_ms": lag_p99,
            "lag_limit_ms": 5.0,
            "valid": lag_p99 <= 5.0,
        },
        "probe_model": model,
        "probe_level": level,
        "probe": probe,
        "normal_ms": 6.0,
        "recovery_s": recovery,
        "recovered": recovery is not None,
    }


def _open_loop() -> dict[str, Any]:
    return {
        "model": "dispatch_fused",
        "lane": "dispatch_priority",
        "seconds": 2.0,
        "tail_s": 1.5,
        "queue_timeout_ms": 1000.0,
        "cores": "server on cores 1, load on cores 0",
        "unloaded": {
            "probe_level_1": {"model": "dispatch_priority", **_figures(40, 0, 3.0, None)},
            "probe_level_2": {"model": "dispatch_fused", **_figures(40, 0, 2.5, None)},
            "probe_level_1_same_model": {"model": "dispatch_fused", **_figures(40, 0, 2.8, None)},
        },
        "capacity": {"concurrency": 64, "accepted_per_s": 1000.0, "accepted_p99_ms": 80.0},
        "bursts": {
            "1.5x": _burst(2.0, 0.3, _figures(5, 30, 900.0, 4.0)),
            "3x": _burst(12.0, None, _figures(2, 30, 950.0, 2.0)),
            "priority": _burst(
                1.0, 0.2, _figures(40, 1, 12.0, None), level=1, model="dispatch_priority"
            ),
            "priority_same_model": _burst(1.0, 0.2, _figures(40, 0, 90.0, None), level=1),
        },
    }


def test_open_loop_targets_read_the_probe_the_generator_and_recovery() -> None:
    results = BenchResults("s", "quick")
    results.open_loop = _open_loop()
    by_name = {t.name: t for t in open_loop_targets(results)}
    refusal = by_name["open loop 1.5x: refusal p99 at the probe"]
    assert (refusal.measured, refusal.met) == (4.0, True)
    assert "send lag p50 0.40 ms, p99 2.00 ms" in refusal.detail
    accepted = by_name["open loop 1.5x: accepted p99"]
    assert accepted.limit == 1080.0  # the queue timeout plus the c=64 p99
    assert (accepted.measured, accepted.met) == (1100.0, False)
    assert by_name["open loop 1.5x: recovery after the burst"].met is True
    level_1 = by_name["level 1 under level-2 open-loop bulk at 1.5x: refused"]
    assert (level_1.measured, level_1.met) == (1.0, False)
    ratio = by_name["level 1 under level-2 open-loop bulk at 1.5x: p99 / unloaded p99"]
    assert ratio.measured == pytest.approx(4.0) and ratio.met is False  # the lane's, 12 / 3
    assert level_1.model == ratio.model == "dispatch_priority"


def test_a_burst_whose_generator_fell_behind_has_no_verdict() -> None:
    results = BenchResults("s", "quick")
    results.open_loop = _open_loop()
    by_name = {t.name: t for t in open_loop_targets(results)}
    for name in (
        "open loop 3x: refusal p99 at the probe",
        "open loop 3x: recovery after the burst",
    ):
        target = by_name[name]
        assert target.measured is not None and target.met is None
        assert target.invalid.startswith("generator fell behind: send-lag p99 12.0 ms")
    # not recovered while the probe watched: reported as at least that long
    assert by_name["open loop 3x: recovery after the burst"].measured == 1.5
    assert all(t.met is None for t in open_loop_targets(BenchResults("s", "quick")))


def _row(concurrency: int, tput: float, p50: float) -> LevelStats:
    return LevelStats(concurrency, tput, p50, p50, p50, p50 * 2, requests=100)


def test_single_window_targets_compare_binary_forms_and_the_pipeline_in_process() -> None:
    results = BenchResults("s", "quick")
    results.limits = {"large": LimitStats("large", 1000, _row(1, 13.0, 77.0), 2, 25.0)}
    results.series = [
        Series("fused_grpc", "small", [_row(1, 500.0, 2.3)]),
        Series("fused_grpc", "large", [_row(1, 9.0, 113.7)]),
        Series("fastapi_arrays", "small", [_row(1, 580.0, 1.7)]),
        Series("fastapi_arrays", "large", [_row(1, 11.0, 88.0)]),
    ]
    by_name = {t.name: t for t in single_window_targets(results)}
    small = by_name["small, c=1: gRPC p50 / FastAPI base64 arrays p50"]
    assert small.measured == pytest.approx(2.3 / 1.7) and small.met is False
    assert small.detail == "p50 2.30 ms against 1.70 ms (FastAPI, arrays)"
    results.floor = {"c1": _row(1, 1500.0, 0.6).to_dict()}
    alone = single_window_targets(BenchResults("s", "quick", floor=results.floor))[0]
    assert alone.detail == "the no-work floor p50: 0.60 ms"  # nothing else measured
    in_process = by_name["large, c=1: gRPC p50 / in-process p50"]
    assert in_process.measured == pytest.approx(113.7 / 77.0) and in_process.goal == "<= 1.1x"
    assert by_name["large, c=1: gRPC p50 / FastAPI base64 arrays p50"].met is False


def test_the_c64_target_reads_the_median_of_the_alternating_rounds() -> None:
    results = BenchResults("s", "quick")
    results.series = [
        Series("fused_grpc", "small", [_row(64, 3000.0, 20.0)]),
        Series("fastapi_json", "small", [_row(64, 1000.0, 60.0)]),
    ]
    results.floor = {"c64": _row(64, 3200.0, 19.0).to_dict()}
    results.rounds = [
        {"fused_grpc": 1900.0, "floor": 2000.0, "fastapi_json": 1000.0},
        {"fused_grpc": 1500.0, "floor": 2500.0, "fastapi_json": 1000.0},
        {"fused_grpc": 2400.0, "floor": 3000.0, "fastapi_json": 1000.0},
        {"fused_grpc": 2000.0, "floor": 2000.0, "fastapi_json": 1000.0},
        {"fused_grpc": 1600.0, "floor": 2000.0, "fastapi_json": 800.0},
    ]
    by_name = {t.name: t for t in goal_targets(results)}
    fused = by_name["small, gRPC, c=64: throughput / no-work floor"]
    # per round 0.95, 0.6, 0.8, 1.0, 0.8: the median, not the sweep's 3000 / 3200
    assert fused.measured == pytest.approx(0.8) and fused.met is True
    assert fused.detail == (
        "median 0.80 over 5 rounds (min-max 0.60-1.00); the sweep's one level: 0.94x; "
        "no-work floor: 3,200 windows/s; against FastAPI window JSON: median 2.00 over 5 "
        "rounds (min-max 1.50-2.40)"
    )


def test_the_c1_target_reads_the_median_gap_of_the_alternating_rounds() -> None:
    results = BenchResults("s", "quick")
    results.series = [Series("fused_grpc", "small", [_row(1, 500.0, 2.0)])]
    results.floor = {"c1": _row(1, 1500.0, 0.6).to_dict()}
    # per round 0.4, 0.2, 0.25 (the second round's host was slower on both sides), one
    # round without the floor: the median of the three, not the sweep's 2.0 - 0.6
    results.rounds = [
        {FUSED_C1: 1.0, FLOOR_C1: 0.6},
        {FUSED_C1: 1.5, FLOOR_C1: 1.3},
        {FUSED_C1: 0.85, FLOOR_C1: 0.6},
        {FUSED_C1: 0.9, FLOOR_C1: None},
    ]
    c1 = {t.name: t for t in goal_targets(results)}[
        "small, gRPC, c=1: p50 over the no-work floor's"
    ]
    assert c1.measured == pytest.approx(0.25) and c1.met is True
    assert c1.detail.startswith(
        "median 0.25 over 3 rounds (min-max 0.20-0.40); the sweep's c=1 level: 1.40 ms; p50 2.00 ms"
    )


def test_the_report_shows_rounds_open_loop_and_storms_apart_from_the_targets() -> None:
    results = BenchResults("s", "quick")
    results.open_loop = _open_loop()
    results.rounds = [
        {
            "fused_grpc": 2000.0,
            "floor": 2500.0,
            "fastapi_json": 1000.0,
            FUSED_C1: 0.9,
            FLOOR_C1: 0.7,
        }
    ] * 5
    text = render_report(results)
    assert "## Alternating rounds (small windows: windows/s at c=64, p50 at c=1)" in text
    assert "| 1 | 2,000.0 | 2,500.0 | 1,000.0 | 0.90 | 0.70 |" in text
    assert "| dispatch_fused / no-work floor | 0.80 | 0.80-0.80 | 5 | >= 0.8x |" in text
    assert "| dispatch_fused / FastAPI | 2.00 | 2.00-2.00 | 5 | >= 3x |" in text
    gap = "| dispatch_fused c=1 p50 - no-work floor c=1 p50 | 0.20 | 0.20-0.20 | 5 | <= 0.3 ms |"
    assert gap in text
    assert "CPU per answered window at c=64" not in text  # not measured in this run
    results.served_cpu = {
        "fused_grpc": [
            {
                "tritonserver": 0.25,
                "dispatch_fused": 0.6,
                "dispatch_floor": 0.0,
                "other processes": 0.01,
            },
            {
                "tritonserver": 0.3,
                "dispatch_fused": 0.7,
                "dispatch_floor": 0.0,
                "other processes": 0.0,
            },
            {
                "tritonserver": 0.28,
                "dispatch_fused": 0.5,
                "dispatch_floor": 0.0,
                "other processes": 0.0,
            },
        ],
        "floor": [
            {
                "tritonserver": 0.2,
                "dispatch_fused": 0.0,
                "dispatch_floor": 0.17,
                "other processes": 0.0,
            }
        ],
    }
    text = render_report(results)
    assert "CPU per answered window at c=64" in text
    # medians per part, and of the rounds' totals (0.86, 1.0, 0.78)
    assert "| dispatch_fused gRPC (perf_analyzer) | 0.280 | 0.600 | 0.000 | 0.860 | 3 |" in text
    assert "| no-work floor gRPC (perf_analyzer) | 0.200 | 0.170 | 0.000 | 0.370 | 1 |" in text
    assert "## Open-loop overload (`dispatch_fused`, server and load on separate cores)" in text
    assert "Cores: server on cores 1, load on cores 0." in text
    assert "0.40 / 12.00 (**INVALID**)" in text
    assert "| 3x, level 2 | 1,500 |" in text and "not recovered" in text
    assert "level 1 on dispatch_priority p50" in text and "level 1 on dispatch_fused p50" in text
    assert "| 1.5x bulk, level-1 probe on the bulk's model | 1,500 |" in text
    assert "L1 dispatch_priority: 40 / 1" in text
    assert "**INVALID** (generator fell behind" in text
    targets_part, storms_part = text.split("## Closed-loop storms (robustness, not targets)")
    storm = "overload c=512: refusal p99"
    assert storm in storms_part.split("## Ratios")[0] and storm not in targets_part
    robustness = [t for t in compute_targets(results) if t.robustness]
    assert {t.name for t in robustness} >= {storm, "overload: next request after each burst served"}
