"""Prometheus export of the GPU monitor, read at each scrape from the monitor's snapshot, so
nothing is recorded on the request path: a collector for the launcher's registry
(`MonitorCollector`), or an endpoint of its own for a monitor run alone (`serve_metrics`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from prometheus_client import start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from dispatch_service.ops.gpu.fallback import DeviceLevel
from dispatch_service.ops.gpu.health import Reason
from dispatch_service.ops.gpu.snapshot import SnapshotSource

__all__ = ["METRIC_NAMES", "MonitorCollector", "serve_metrics"]

METRIC_NAMES: Final = (
    "dispatch_gpu_monitor_gpus",
    "dispatch_gpu_health_state",
    "dispatch_gpu_unhealthy_reason",
    "dispatch_gpu_samples_over_threshold",
    "dispatch_gpu_samples_over_threshold_total",
    "dispatch_gpu_samples_total",
    "dispatch_gpu_utilization_percent",
    "dispatch_gpu_memory_used_percent",
    "dispatch_gpu_temperature_celsius",
    "dispatch_gpu_ecc_uncorrected_errors",
    "dispatch_device_fallback_level",
    "dispatch_device_fallback_transitions_total",
    "dispatch_gpu_monitor_sample_seconds",
    "dispatch_gpu_monitor_cpu_seconds_total",
)


class MonitorCollector(Collector):
    """prometheus_client collector reading the monitor's snapshot at each scrape."""

    def __init__(self, monitor: SnapshotSource) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        snap = self.monitor.snapshot()
        gpus = GaugeMetricFamily(
            "dispatch_gpu_monitor_gpus", "GPUs the monitor samples (0: no NVML device)"
        )
        gpus.add_metric([], snap.gpu_count)
        yield gpus
        labels = ["gpu", "uuid"]
        state = GaugeMetricFamily(
            "dispatch_gpu_health_state",
            "0 healthy, 1 suspect, 2 unhealthy, 3 recovering (2 and 3 take no traffic)",
            labels=labels,
        )
        reason = GaugeMetricFamily(
            "dispatch_gpu_unhealthy_reason",
            "1 while the reason holds in the latest sample or made the GPU unhealthy",
            labels=[*labels, "reason"],
        )
        over = GaugeMetricFamily(
            "dispatch_gpu_samples_over_threshold",
            "samples over threshold in a row (trip_samples of them mark the GPU unhealthy)",
            labels=labels,
        )
        over_total = CounterMetricFamily(
            "dispatch_gpu_samples_over_threshold",
            "samples over threshold",
            labels=labels,
        )
        total = CounterMetricFamily("dispatch_gpu_samples", "samples taken", labels=labels)
        util = GaugeMetricFamily(
            "dispatch_gpu_utilization_percent", "GPU utilisation (NVML)", labels=labels
        )
        memory = GaugeMetricFamily(
            "dispatch_gpu_memory_used_percent", "GPU memory used / total", labels=labels
        )
        temperature = GaugeMetricFamily(
            "dispatch_gpu_temperature_celsius", "GPU temperature", labels=labels
        )
        ecc = GaugeMetricFamily(
            "dispatch_gpu_ecc_uncorrected_errors",
            "volatile uncorrected ECC errors since the driver loaded",
            labels=labels,
        )
        for gpu in snap.gpus:
            values = [str(gpu.index), gpu.uuid]
            state.add_metric(values, int(gpu.state))
            active = gpu.reasons | gpu.trip_reasons
            for name in Reason:
                reason.add_metric([*values, name.value], 1.0 if name in active else 0.0)
            over.add_metric(values, gpu.consecutive_over)
            over_total.add_metric(values, gpu.samples_over_total)
            total.add_metric(values, gpu.samples_total)
            last = gpu.last
            if last is None:
                continue
            for family, value in (
                (util, last.utilization_percent),
                (memory, last.memory_percent),
                (temperature, last.temperature_c),
                (ecc, last.ecc_uncorrected),
            ):
                if value is not None:
                    family.add_metric(values, float(value))
        yield from (state, reason, over, over_total, total, util, memory, temperature, ecc)
        level = GaugeMetricFamily(
            "dispatch_device_fallback_level",
            "device-level fallback of the scoring model: 0 all GPUs, 1 other GPUs, 2 CPU, "
            "3 rule-based",
        )
        level.add_metric([], int(snap.level))
        yield level
        moves = CounterMetricFamily(
            "dispatch_device_fallback_transitions",
            "successful changes of the device-level fallback, by the level entered",
            labels=["level"],
        )
        for value in DeviceLevel:
            moves.add_metric([str(int(value))], snap.transitions.get(int(value), 0))
        yield moves
        cost = GaugeMetricFamily(
            "dispatch_gpu_monitor_sample_seconds",
            "CPU time of the latest monitor round (sampling, states, fallback)",
        )
        cost.add_metric([], snap.sample_seconds)
        yield cost
        spent = CounterMetricFamily(
            "dispatch_gpu_monitor_cpu_seconds",
            "CPU time of the monitor's rounds (its overhead: rate() is the share of one core)",
        )
        spent.add_metric([], snap.cpu_seconds_total)
        yield spent


def serve_metrics(monitor: SnapshotSource, host: str, port: int) -> Any:
    """Start the monitor's Prometheus endpoint; returns its server (port 0: a free one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(monitor))
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server
