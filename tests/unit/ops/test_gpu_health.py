"""The GPU health state machine on synthetic readings: one spike does not trip, three in a
row do, recovery needs the stricter thresholds for restore_after_s (hysteresis)."""

from __future__ import annotations

import pytest
from gpu_stand_in import GIB, calm, hot

from dispatch_service.core.settings import SettingsError
from dispatch_service.ops.gpu.health import HealthState, HealthTracker, Reason, over_threshold
from dispatch_service.ops.gpu.sampling import GpuSample
from dispatch_service.ops.gpu.settings import GpuMonitorSettings

SETTINGS = GpuMonitorSettings(restore_after_s=10.0)


def run(tracker: HealthTracker, readings: list[GpuSample], start: float = 0.0) -> list[str]:
    """Feed one reading per second; the state after each, by name."""
    return [
        tracker.update([r], start + t).__getitem__(0).state.name for t, r in enumerate(readings)
    ]


def test_the_thresholds_hold_together_as_in_the_design() -> None:
    assert over_threshold(hot(), 0, SETTINGS) == {Reason.THERMAL_THROTTLE}
    # Any one of the three below its limit: not over (a busy but cool GPU is fine).
    assert not over_threshold(hot(temperature=85.0), 0, SETTINGS)  # "> 85", not ">="
    busy_cool = GpuSample(0, "", 100.0, 79 * GIB, 80 * GIB, 70.0, 0, True)
    assert not over_threshold(busy_cool, 0, SETTINGS)
    assert not over_threshold(calm(), 0, SETTINGS)


def test_ecc_context_and_unreadable_devices_are_reasons() -> None:
    assert over_threshold(calm(ecc=3), 2, SETTINGS) == {Reason.ECC_ERRORS}
    assert not over_threshold(calm(ecc=3), 3, SETTINGS)  # counted before: not rising
    assert not over_threshold(calm(ecc=3), None, SETTINGS)  # first reading: a baseline
    no_context = GpuSample(0, "", 10.0, GIB, 80 * GIB, 50.0, 0, context_ok=False)
    assert over_threshold(no_context, 0, SETTINGS) == {Reason.CONTEXT_FAILURE}
    gone = GpuSample(0, "", error="GPU is lost")
    assert over_threshold(gone, None, SETTINGS) == {Reason.NVML_ERROR}
    unprobed = GpuSample(0, "", 10.0, GIB, 80 * GIB, 50.0, None, context_ok=None)
    assert not over_threshold(unprobed, None, SETTINGS)


def test_one_or_two_spikes_do_not_trip_three_in_a_row_do() -> None:
    tracker = HealthTracker(SETTINGS)
    states = run(tracker, [calm(), hot(), calm(), hot(), hot(), calm(), hot(), hot(), hot()])
    assert states == [
        "HEALTHY", "SUSPECT", "HEALTHY", "SUSPECT", "SUSPECT", "HEALTHY",
        "SUSPECT", "SUSPECT", "UNHEALTHY",
    ]  # fmt: skip
    gpu = tracker.gpus[0]
    assert gpu.consecutive_over == 3 and gpu.samples_over_total == 6 and gpu.samples_total == 9
    assert gpu.trip_reasons == {Reason.THERMAL_THROTTLE}
    assert tracker.serving() == frozenset()


def test_trip_samples_is_a_setting() -> None:
    tracker = HealthTracker(GpuMonitorSettings(trip_samples=5))
    assert run(tracker, [hot()] * 5)[-2:] == ["SUSPECT", "UNHEALTHY"]


def test_recovery_needs_the_stricter_thresholds_for_the_whole_restore_time() -> None:
    tracker = HealthTracker(SETTINGS)
    run(tracker, [hot()] * 3)
    # 88 degC is under the 85 degC trip limit? No: over it. 82 degC is under 85 but above
    # the recovery limit 80 (85 - 5): not clear, it stays unhealthy (no flapping at the edge).
    states = run(tracker, [hot(temperature=82.0)] * 3, start=3)
    assert states == ["UNHEALTHY"] * 3
    # Clear from t=6; it serves again only once 10 s of clear samples have passed (t=16).
    states = run(tracker, [calm()] * 11, start=6)
    assert states == ["RECOVERING"] * 10 + ["HEALTHY"]
    gpu = tracker.gpus[0]
    assert gpu.serving and gpu.trip_reasons == frozenset()


def test_a_relapse_while_recovering_starts_the_wait_again() -> None:
    tracker = HealthTracker(SETTINGS)
    run(tracker, [hot()] * 3)
    assert run(tracker, [calm()] * 5, start=3)[-1] == "RECOVERING"
    assert run(tracker, [hot(temperature=81.0)], start=8) == ["UNHEALTHY"]
    states = run(tracker, [calm()] * 11, start=9)
    assert states[-2:] == ["RECOVERING", "HEALTHY"]  # 10 s from t=9, not from t=3


def test_rising_ecc_keeps_a_gpu_out_until_it_stops() -> None:
    tracker = HealthTracker(SETTINGS)
    readings = [calm(ecc=0), calm(ecc=1), calm(ecc=2), calm(ecc=5), calm(ecc=5)]
    assert run(tracker, readings) == ["HEALTHY", "SUSPECT", "SUSPECT", "UNHEALTHY", "RECOVERING"]
    assert tracker.gpus[0].trip_reasons == {Reason.ECC_ERRORS}


def test_gpus_are_tracked_independently() -> None:
    tracker = HealthTracker(SETTINGS)
    for t in range(3):
        tracker.update([calm(0), hot(1)], float(t))
    assert [g.state for g in tracker.gpus] == [HealthState.HEALTHY, HealthState.UNHEALTHY]
    assert tracker.serving() == frozenset({0})


def test_settings_parse_like_config_parameters_and_refuse_nonsense() -> None:
    parsed = GpuMonitorSettings.from_pairs(["trip_samples=4", "act=false", "restore_after_s=2.5"])
    assert (parsed.trip_samples, parsed.act, parsed.restore_after_s) == (4, False, 2.5)
    assert GpuMonitorSettings.from_parameters(parsed.to_parameters()) == parsed
    with pytest.raises(SettingsError, match=r"unknown config parameter.*trip_sample"):
        GpuMonitorSettings.from_pairs(["trip_sample=4"])
    with pytest.raises(SettingsError, match="trip_samples must be an int >= 1"):
        GpuMonitorSettings.from_pairs(["trip_samples=0"])
    with pytest.raises(SettingsError, match="l1_instance_kind must be one of"):
        GpuMonitorSettings.from_pairs(["l1_instance_kind=KIND_TPU"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        GpuMonitorSettings.from_pairs(["trip_samples"])
