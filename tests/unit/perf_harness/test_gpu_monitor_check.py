"""perf/gpu_monitor_check without a GPU: the overhead run on synthetic readings, the report
section, and the probe's cost accounting."""

from __future__ import annotations

from typing import Any

import pytest

import perf.gpu_monitor_check as check
from perf.gpu_monitor_check import (
    DrillResult,
    OverheadResult,
    fallback_drill,
    probe_cpu_seconds,
    render_monitor,
    run_overhead,
)


def test_the_overhead_run_samples_on_its_thread_and_reports_a_share() -> None:
    result = run_overhead(0.3, synthetic=True)
    assert result.source == "synthetic" and result.gpus == 2 and result.rounds >= 1
    assert [s["state"] for s in result.states] == ["healthy", "healthy"]
    assert result.probe_cpu_s is None  # no probe without NVML
    assert 0.0 <= result.share_of_core < 1.0


def test_the_share_adds_the_probe_amortised_over_its_period() -> None:
    result = OverheadResult("nvml", 1, 60, 60.0, 0.06, 0.3, {0: True}, 1.0, 30.0)
    assert result.share_of_core == 0.06 / 60.0 + 0.3 / 30.0


def test_the_report_section_shows_the_figures_and_the_drill() -> None:
    overhead = OverheadResult("nvml", 1, 60, 60.0, 0.06, 0.3, {0: True}, 1.0, 30.0)
    drill = DrillResult(
        steps=[{"level": "L2", "seconds": 2.5, "error": None, "instance_group": []}],
        answered=["L2 after trip: 64 orders answered, fallback levels ['0']"],
    )
    text = "\n".join(render_monitor(overhead, drill))
    assert "| 60.0 ms | 1.00 ms | 300.0 ms | 1.100 % |" in text
    assert '"level": "L2"' in text and "L2 after trip" in text


def test_a_probe_answers_for_every_gpu_asked_and_its_cpu_time_is_counted() -> None:
    spent, answers = probe_cpu_seconds([0])
    assert spent >= 0.0
    assert set(answers) == {0}


def test_the_drill_reloads_with_the_servers_admin_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpu_check's servers lock the model-repository group: without the key every reload of
    the drill answers 403."""
    keys: list[Any] = []

    class Refusing:
        def __init__(self, http_url: str, settings: Any, admin_key: str | None = None) -> None:
            keys.append(admin_key)
            raise RuntimeError("stop here")

    monkeypatch.setattr(check, "FallbackController", Refusing)
    with pytest.raises(RuntimeError, match="stop here"):
        fallback_drill("http://127.0.0.1:1", [0], lambda: "-", admin_key="k-123")
    assert keys == ["k-123"]
