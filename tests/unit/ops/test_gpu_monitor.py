"""The monitor end to end without a GPU: scripted NVML readings in, fallback loads and
Prometheus series out; NVML itself through a stand-in of the pynvml module."""

from __future__ import annotations

import logging
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
from gpu_stand_in import GPU_CONFIG, Clock, FakeRepository, calm, hot
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dispatch_service.ops.gpu.export import METRIC_NAMES, MonitorCollector, serve_metrics
from dispatch_service.ops.gpu.fallback import DeviceLevel
from dispatch_service.ops.gpu.health import HealthState
from dispatch_service.ops.gpu.monitor import GpuMonitor, RunningMonitor, start_gpu_monitor
from dispatch_service.ops.gpu.sampling import (
    ContextProber,
    GpuSample,
    NvmlSampler,
    ScriptedSampler,
    run_context_probe,
)
from dispatch_service.ops.gpu.settings import GpuMonitorSettings


def scrape(monitor: GpuMonitor) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(monitor))
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_three_hot_samples_move_traffic_off_that_gpu_and_recovery_brings_it_back() -> None:
    settings = GpuMonitorSettings(restore_after_s=3.0)
    repo = FakeRepository(GPU_CONFIG)
    sampler = ScriptedSampler(
        [[calm(0), calm(1)], [calm(0), hot(1)], [calm(0), hot(1)], [calm(0), hot(1)]]
        + [[calm(0), calm(1)]] * 4
    )
    clock = Clock()
    monitor = GpuMonitor(sampler, settings, repo.controller(settings), clock)
    levels = []
    for t in range(8):
        clock.now = float(t)
        monitor.step()
        levels.append(monitor.snapshot().level)
    l0, l1 = DeviceLevel.L0_ALL_GPUS, DeviceLevel.L1_OTHER_GPUS
    # Tripped on the 3rd hot sample (t=3): the override leaves GPU 1 out in that same round.
    assert levels == [l0, l0, l0, l1, l1, l1, l1, l0]
    assert repo.config == GPU_CONFIG
    loads = [config for action, config in repo.sent if action == "load"]
    assert len(loads) == 2 and '"gpus": [0]' in loads[0]


def test_the_exported_series_describe_each_gpu() -> None:
    settings = GpuMonitorSettings()
    repo = FakeRepository(GPU_CONFIG)
    sampler = ScriptedSampler([[calm(0), hot(1)]])
    monitor = GpuMonitor(sampler, settings, repo.controller(settings), Clock())
    for _ in range(3):
        monitor.step()
    series = scrape(monitor)
    gpu1 = (("gpu", "1"), ("uuid", "GPU-1"))
    assert series[("dispatch_gpu_monitor_gpus", ())] == 2
    assert series[("dispatch_gpu_health_state", gpu1)] == int(HealthState.UNHEALTHY)
    assert series[("dispatch_gpu_health_state", (("gpu", "0"), ("uuid", "GPU-0")))] == 0
    assert series[("dispatch_gpu_samples_over_threshold", gpu1)] == 3
    assert series[("dispatch_gpu_samples_over_threshold_total", gpu1)] == 3
    assert (
        series[
            (
                "dispatch_gpu_unhealthy_reason",
                (("gpu", "1"), ("reason", "thermal_throttle"), ("uuid", "GPU-1")),
            )
        ]
        == 1
    )
    assert (
        series[
            (
                "dispatch_gpu_unhealthy_reason",
                (("gpu", "1"), ("reason", "ecc_errors"), ("uuid", "GPU-1")),
            )
        ]
        == 0
    )
    assert series[("dispatch_gpu_temperature_celsius", gpu1)] == 90.0
    assert series[("dispatch_gpu_memory_used_percent", gpu1)] == pytest.approx(95.0)
    assert series[("dispatch_device_fallback_level", ())] == 1
    assert series[("dispatch_device_fallback_transitions_total", (("level", "1"),))] == 1
    names = {name.removesuffix("_total") for name, _ in series}
    assert names == {name.removesuffix("_total") for name in METRIC_NAMES}


def test_the_endpoint_serves_the_series_on_its_own_port() -> None:
    monitor = GpuMonitor(ScriptedSampler([[calm(0)]]), GpuMonitorSettings(act=False))
    monitor.step()
    server = serve_metrics(monitor, "127.0.0.1", 0)
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'dispatch_gpu_health_state{gpu="0",uuid="GPU-0"} 0.0' in text


def test_observe_only_never_reloads() -> None:
    repo = FakeRepository(GPU_CONFIG)
    settings = GpuMonitorSettings(act=False)
    monitor = GpuMonitor(ScriptedSampler([[hot(0), hot(1)]]), settings, repo.controller(settings))
    for _ in range(5):
        monitor.step()
    assert repo.sent == [] and monitor.snapshot().level is DeviceLevel.L0_ALL_GPUS
    assert monitor.tracker.serving() == frozenset()


def test_no_gpu_is_reported_once_and_nothing_runs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "dispatch_service.ops.gpu.monitor")
    sampler = ScriptedSampler([None])
    monitor = GpuMonitor(sampler, GpuMonitorSettings())
    assert monitor.step() == [] and monitor.step() == []
    assert sampler.calls == 1  # it stopped asking
    assert sum("gpu_monitor_no_gpu" in r.message for r in caplog.records) == 1
    # On this host (no NVML) the launcher's call does the same and starts no thread or port.
    running = start_gpu_monitor("127.0.0.1:1", GpuMonitorSettings())
    try:
        assert running.monitor.no_gpu and running.metrics_url is None
        assert running.monitor.snapshot().gpu_count == 0
    finally:
        running.stop()


def test_the_thread_samples_until_stopped() -> None:
    repo = FakeRepository(GPU_CONFIG)
    settings = GpuMonitorSettings(sample_period_s=0.01)
    sampler = ScriptedSampler([[calm(0), hot(1)]])
    monitor = GpuMonitor(sampler, settings, repo.controller(settings)).start()
    try:
        for _ in range(500):
            if monitor.snapshot().level is DeviceLevel.L1_OTHER_GPUS:
                break
            monitor._stop.wait(0.01)
    finally:
        monitor.stop()
    assert monitor.snapshot().level is DeviceLevel.L1_OTHER_GPUS
    calls = sampler.calls
    monitor._stop.wait(0.05)
    assert sampler.calls == calls


# ---- NVML and the context probe -------------------------------------------------------------


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801, N818 (pynvml's name)
    pass


def fake_pynvml(broken: set[int], ecc_supported: bool = True, mig: bool = False) -> Any:
    """The few pynvml calls the sampler makes, for two GPUs."""

    def handle(i: int) -> int:
        return i

    def utilization(h: int) -> Any:
        if h in broken:
            raise NVMLError("GPU is lost")
        if mig:
            raise NVMLError_NotSupported("Not Supported")
        return SimpleNamespace(gpu=97 if h else 12, memory=0)

    def ecc(h: int, kind: int, counter: int) -> int:
        if not ecc_supported:
            raise NVMLError_NotSupported("Not Supported")
        assert (kind, counter) == (1, 0)
        return 4

    return SimpleNamespace(
        NVMLError=NVMLError,
        NVMLError_NotSupported=NVMLError_NotSupported,
        NVML_TEMPERATURE_GPU=0,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}".encode(),
        nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=30, total=40, free=10),
        nvmlDeviceGetTemperature=lambda h, sensor: 70 + h,
        nvmlDeviceGetTotalEccErrors=ecc,
        nvmlShutdown=lambda: None,
    )


def test_nvml_readings_become_samples_and_an_unreadable_gpu_an_error() -> None:
    sampler = NvmlSampler(fake_pynvml(broken={1}))
    first, second = sampler.sample() or []
    assert first == GpuSample(0, "GPU-0", 12.0, 30, 40, 70.0, 4, None)
    assert first.memory_percent == 75.0
    assert GpuSample(0, memory_total_bytes=40).memory_percent is None
    assert second.index == 1 and second.error == "GPU is lost" and second.uuid == "GPU-1"
    no_ecc = NvmlSampler(fake_pynvml(broken=set(), ecc_supported=False)).sample() or []
    assert [s.ecc_uncorrected for s in no_ecc] == [None, None]
    # MIG: no utilisation figure, which is no reason to take the GPU out.
    mig = NvmlSampler(fake_pynvml(broken=set(), mig=True)).sample() or []
    assert [(s.utilization_percent, s.error) for s in mig] == [(None, None), (None, None)]
    assert [s.temperature_c for s in mig] == [70.0, 71.0]


def test_context_answers_come_from_the_probe_in_the_background() -> None:
    asked: list[tuple[int, ...]] = []

    def probe(indices: Any, timeout_s: float) -> dict[int, bool]:
        asked.append(tuple(indices))
        return {0: True, 1: False}

    clock = Clock()
    prober = ContextProber(30.0, 5.0, probe, clock)
    sampler = NvmlSampler(fake_pynvml(broken=set()), prober)
    assert [s.context_ok for s in sampler.sample() or []] == [None, None]  # first probe runs
    prober.wait(10)
    assert [s.context_ok for s in sampler.sample() or []] == [True, False]
    assert asked == [(0, 1)]  # not again before 30 s
    clock.now = 30.0
    sampler.sample()
    prober.wait(10)
    assert asked == [(0, 1), (0, 1)]


def test_the_real_probe_reports_failure_on_a_host_without_a_cuda_driver() -> None:
    try:
        import ctypes

        ctypes.CDLL("libcuda.so.1")
    except OSError:
        assert run_context_probe([0, 1], 30.0) == {0: False, 1: False}
    else:
        pytest.skip("this host has a CUDA driver: perf/gpu_check.sh covers the probe")


def test_the_launcher_refuses_bad_monitor_settings_before_starting_anything(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dispatch_service.ops.server_cli import main as serve

    with pytest.raises(SystemExit) as stopped:
        serve(["--gpu-monitor", "trip_samples=0", "--tritonserver", "/nonexistent"])
    assert stopped.value.code == 2
    assert "--gpu-monitor" in capsys.readouterr().err


def test_recorded_readings_replay_from_json(tmp_path: Any) -> None:
    path = tmp_path / "readings.json"
    path.write_text('[[{"index": 0, "utilization_percent": 99, "temperature_c": 90}], null]')
    sampler = ScriptedSampler.from_json(path)
    (first,) = sampler.sample() or []
    assert (first.index, first.utilization_percent, first.temperature_c) == (0, 99, 90)
    assert sampler.sample() is None
    path.write_text('[[{"index": 0, "utilisation": 99}]]')
    with pytest.raises(ValueError, match="unknown GPU sample field"):
        ScriptedSampler.from_json(path)


def test_a_taken_metrics_port_does_not_stop_the_monitor(caplog: pytest.LogCaptureFixture) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = GpuMonitorSettings(metrics_port=port, act=False, sample_period_s=0.01)
        running = start_gpu_monitor("127.0.0.1:1", settings, sampler=ScriptedSampler([[calm(0)]]))
        try:
            assert running.metrics_url is None and not running.monitor.no_gpu
        finally:
            running.stop()
    assert any("gpu_monitor_metrics_unavailable" in r.message for r in caplog.records)


def test_under_the_launcher_the_series_are_served_on_its_health_port(supervisor: Any) -> None:
    """The launcher starts its monitor without an endpoint of its own (`serve=False`) and
    adds the collector to its registry: every series is on the health port's /metrics."""
    settings = GpuMonitorSettings(act=False, sample_period_s=0.01)
    running = start_gpu_monitor(
        "127.0.0.1:1", settings, sampler=ScriptedSampler([[calm(0)]]), serve=False
    )
    try:
        assert running.metrics_url is None  # no port 8004
        running.export_to(supervisor.registry)
        with urllib.request.urlopen(f"{supervisor.health_url}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        running.stop()
    families = {family.name for family in text_string_to_metric_families(text)}
    counters = {name.removesuffix("_total") for name in METRIC_NAMES}
    assert counters <= families
    assert {"dispatch_launcher_ready", "dispatch_build_info"} <= families


def test_a_host_without_a_gpu_adds_no_series() -> None:
    registry = CollectorRegistry()
    RunningMonitor(GpuMonitor(None, GpuMonitorSettings(act=False))).export_to(registry)
    assert generate_latest(registry) == b""


def test_run_alone_it_takes_host_port_and_says_its_version(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dispatch_contract.version import product_version
    from dispatch_service.ops.gpu.monitor import main

    with pytest.raises(SystemExit) as refused:
        main(["--url", "127.0.0.1"])  # no port
    assert refused.value.code == 2
    assert "expected host:port" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.endswith(f" {product_version()}\n")
