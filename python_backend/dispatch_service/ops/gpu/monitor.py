"""The GPU monitor: samples every period on its own thread (never on the request path),
updates the health states, drives the fallback and exports both to Prometheus.

The launcher (`ops.server`) starts it with one call, `start_gpu_monitor`, after Triton is
ready. It can also run beside a server it did not start (the NGC image's tritonserver):
``python -m dispatch_service.ops.gpu.monitor --url HOST:PORT``.

Metrics (the series are listed in `export.METRIC_NAMES`): under the launcher they join the
launcher's own registry (`RunningMonitor.export_to`), served on its HTTP port (8003) beside
its other series; run alone, the monitor serves them itself with prometheus_client on
``metrics_port`` (default 8004, loopback unless ``metrics_host`` says otherwise). On a host
without NVML it says "no GPU" once (a log line) and samples and exports nothing more.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatch_contract.version import add_version_argument, host_port_argument
from dispatch_service.ops.gpu.fallback import DeviceLevel, FallbackController, Transition
from dispatch_service.ops.gpu.health import HealthTracker, describe
from dispatch_service.ops.gpu.sampling import (
    ContextProber,
    GpuSampler,
    ScriptedSampler,
    open_nvml_sampler,
)
from dispatch_service.ops.gpu.settings import GpuMonitorSettings
from dispatch_service.ops.gpu.snapshot import MonitorSnapshot

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

__all__ = [
    "GpuMonitor",
    "RunningMonitor",
    "add_gpu_monitor_arguments",
    "gpu_monitor_settings",
    "main",
    "start_gpu_monitor",
]

logger = logging.getLogger(__name__)


class GpuMonitor:
    """Samples, tracks, falls back. `step()` is one round (tests call it directly)."""

    def __init__(
        self,
        sampler: GpuSampler | None,
        settings: GpuMonitorSettings,
        controller: FallbackController | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sampler = sampler
        self.settings = settings
        self.controller = controller if settings.act else None
        self.tracker = HealthTracker(settings)
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu_indices: tuple[int, ...] = ()
        self._transitions: dict[int, int] = {}
        self._sample_seconds = 0.0
        self._rounds = 0
        self._cpu_seconds = 0.0
        self.no_gpu = sampler is None
        if self.no_gpu:
            self._say_no_gpu()

    def _say_no_gpu(self) -> None:
        logger.warning(
            json.dumps({"event": "gpu_monitor_no_gpu", "detail": "no NVML device: not sampling"})
        )

    def step(self) -> list[Transition]:
        """One round: sample, update the states, reconcile the model's placement."""
        if self.no_gpu or self.sampler is None:
            return []
        started = time.thread_time()
        samples = self.sampler.sample()
        if samples is None:
            self.no_gpu = True
            self._say_no_gpu()
            return []
        before = {g.index: g.state for g in self.tracker.gpus}
        with self._lock:
            gpus = self.tracker.update(samples, self._clock())
            self._gpu_indices = tuple(g.index for g in gpus)
        changed = [g for g in gpus if before.get(g.index) is not g.state]
        if changed:
            logger.warning(json.dumps({"event": "gpu_health", "gpus": describe(changed)}))
        done: list[Transition] = []
        if self.controller is not None:
            done = self.controller.reconcile(self.tracker.serving(), self._gpu_indices)
        with self._lock:
            for step in done:
                if step.error is None:
                    self._transitions[int(step.level)] = (
                        self._transitions.get(int(step.level), 0) + 1
                    )
            self._sample_seconds = time.thread_time() - started
            self._rounds += 1
            self._cpu_seconds += self._sample_seconds
        return done

    def snapshot(self) -> MonitorSnapshot:
        with self._lock:
            level = self.controller.level if self.controller else DeviceLevel.L0_ALL_GPUS
            return MonitorSnapshot(
                len(self._gpu_indices),
                self.tracker.gpus,
                level,
                dict(self._transitions),
                self._sample_seconds,
                self._rounds,
                self._cpu_seconds,
            )

    # ---- the thread --------------------------------------------------------------------

    def _run(self) -> None:
        period = self.settings.sample_period_s
        next_at = time.monotonic()
        while not self._stop.is_set() and not self.no_gpu:
            try:
                self.step()
            except Exception:  # the monitor must outlive any one bad round
                logger.exception("gpu monitor round failed")
            next_at += period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def start(self) -> GpuMonitor:
        if self._thread is None and not self.no_gpu:
            self._thread = threading.Thread(target=self._run, daemon=True, name="gpu-monitor")
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.sampler is not None:
            self.sampler.close()


@dataclass
class RunningMonitor:
    """A started monitor and its metrics endpoint; `stop()` ends both."""

    monitor: GpuMonitor
    server: Any = None  # the WSGI server of the metrics endpoint

    def export_to(self, registry: CollectorRegistry) -> None:
        """Serve the series through ``registry`` (the launcher's): nothing on a host
        without a GPU, as on the monitor's own endpoint."""
        if not self.monitor.no_gpu:
            from dispatch_service.ops.gpu.export import MonitorCollector

            registry.register(MonitorCollector(self.monitor))

    @property
    def metrics_url(self) -> str | None:
        if self.server is None:
            return None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/metrics"

    def stop(self) -> None:
        self.monitor.stop()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


def start_gpu_monitor(
    http_url: str,
    settings: GpuMonitorSettings,
    admin_key: str | None = None,
    sampler: GpuSampler | None = None,
    act: bool = True,
    *,
    serve: bool = True,
) -> RunningMonitor:
    """Start monitoring the node's GPUs for the server at `http_url` (the launcher's call).

    ``sampler`` None: NVML (None on a CPU host: "no GPU" once, nothing else). ``act``
    False (the cpu profile): observe and export, never reload the model. ``serve`` False:
    no endpoint of its own (the launcher exports through its registry: `export_to`).
    """
    if sampler is None:
        prober = ContextProber(settings.context_probe_period_s, settings.context_probe_timeout_s)
        sampler = open_nvml_sampler(prober)
    controller = None
    if act and settings.act and sampler is not None:
        controller = FallbackController(http_url, settings, admin_key)
    monitor = GpuMonitor(sampler, settings, controller)
    server = None
    if serve and settings.metrics_port and not monitor.no_gpu:
        from dispatch_service.ops.gpu.export import serve_metrics  # prometheus_client: 0.25 s

        try:
            server = serve_metrics(monitor, settings.metrics_host, settings.metrics_port)
        except OSError as exc:  # the port is taken: monitor anyway, say so once
            logger.error(
                json.dumps(
                    {
                        "event": "gpu_monitor_metrics_unavailable",
                        "port": settings.metrics_port,
                        "error": str(exc),
                    }
                )
            )
    running = RunningMonitor(monitor.start(), server)
    logger.info(
        json.dumps(
            {
                "event": "gpu_monitor_started",
                "gpus": not monitor.no_gpu,
                "acting": controller is not None,
                "metrics": running.metrics_url,
                **settings.to_parameters(),
            },
            sort_keys=True,
        )
    )
    return running


def add_gpu_monitor_arguments(parser: argparse.ArgumentParser) -> None:
    """The launcher's ``--gpu-monitor KEY=VALUE`` option (GpuMonitorSettings fields)."""
    parser.add_argument(
        "--gpu-monitor",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="GPU monitor setting (dispatch_service.ops.gpu.settings.GpuMonitorSettings), "
        "repeatable, e.g. --gpu-monitor restore_after_s=120",
    )


def gpu_monitor_settings(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> GpuMonitorSettings:
    """The settings `add_gpu_monitor_arguments` collected; bad ones end the program (exit 2)
    before anything starts."""
    try:
        return GpuMonitorSettings.from_pairs(args.gpu_monitor)
    except ValueError as exc:
        parser.error(f"--gpu-monitor: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the monitor beside a server it did not start, until SIGTERM / Ctrl-C."""
    parser = argparse.ArgumentParser(
        prog="python -m dispatch_service.ops.gpu.monitor",
        description="GPU monitor and device-level fallback",
    )
    add_version_argument(parser)
    parser.add_argument(
        "--url",
        required=True,
        type=host_port_argument,
        help="the launcher's control endpoint (health port), host:port",
    )
    parser.add_argument("--admin-key", default=None, help="model-repository key, if any")
    parser.add_argument("--observe-only", action="store_true", help="never reload the model")
    parser.add_argument(
        "--replay", default=None, help="JSON file of recorded readings instead of NVML"
    )
    add_gpu_monitor_arguments(parser)
    args = parser.parse_args(argv)
    settings = gpu_monitor_settings(parser, args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sampler = None if args.replay is None else ScriptedSampler.from_json(Path(args.replay))
    running = start_gpu_monitor(args.url, settings, args.admin_key, sampler, not args.observe_only)
    if running.monitor.no_gpu:
        return 0
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with contextlib.suppress(KeyboardInterrupt):
        done.wait()
    running.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
