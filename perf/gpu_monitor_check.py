"""The GPU monitor's part of the GPU check: overhead on the real NVML, and a fallback drill.

Used by `perf/gpu_check.py` (on a GPU host) and on its own:

    python -m perf.gpu_monitor_check --seconds 20             # NVML if present, else synthetic
    python -m perf.gpu_monitor_check --seconds 20 --synthetic # the monitor's own cost only

Overhead: the monitor runs observe-only on its thread at ``sample_period_s`` (1 s) and its
CPU time (thread time of every round: NVML reads, states, export snapshot) is divided by
the wall time; the CUDA context probe runs in a child process every
``context_probe_period_s``, so its CPU time (measured once, children's rusage) is added as
probe_cpu / period. Target: at most 1 % of one core at a 1 s period.

Fallback drill (a live gpu server): synthetic readings mark every GPU unhealthy for
``trip_samples`` rounds -> L2 (CPU instances), then healthy -> L0 after ``restore_after_s``;
one window is scored after each step, and each load's duration is reported.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dispatch_service.ops.gpu.fallback import FallbackController
from dispatch_service.ops.gpu.monitor import GpuMonitor
from dispatch_service.ops.gpu.sampling import (
    ContextProber,
    GpuSample,
    GpuSampler,
    ScriptedSampler,
    open_nvml_sampler,
    run_context_probe,
)
from dispatch_service.ops.gpu.settings import GpuMonitorSettings

__all__ = [
    "DrillResult",
    "OverheadResult",
    "fallback_drill",
    "main",
    "probe_cpu_seconds",
    "render_monitor",
    "run_overhead",
    "synthetic_sampler",
]

GIB = 1 << 30


@dataclass
class OverheadResult:
    source: str  # "nvml" or "synthetic"
    gpus: int
    rounds: int
    wall_s: float
    monitor_cpu_s: float
    probe_cpu_s: float | None  # one context probe of every GPU (child process)
    probe_ok: dict[int, bool] = field(default_factory=dict)
    period_s: float = 1.0
    probe_period_s: float = 30.0
    states: list[dict[str, Any]] = field(default_factory=list)
    last_samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def share_of_core(self) -> float:
        """Monitor thread CPU per wall second, plus the probe's amortised cost."""
        share = self.monitor_cpu_s / self.wall_s if self.wall_s else 0.0
        if self.probe_cpu_s is not None and self.probe_period_s > 0:
            share += self.probe_cpu_s / self.probe_period_s
        return share


def synthetic_sampler(gpus: int = 2) -> ScriptedSampler:
    return ScriptedSampler(
        [[GpuSample(i, f"GPU-{i}", 40.0, 8 * GIB, 80 * GIB, 60.0, 0, True) for i in range(gpus)]]
    )


def probe_cpu_seconds(
    indices: Sequence[int], timeout_s: float = 30.0
) -> tuple[float, dict[int, bool]]:
    """CPU seconds (user + system) of one context probe child, and its answers."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    answers = run_context_probe(indices, timeout_s)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    spent = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return spent, answers


def run_overhead(
    seconds: float, synthetic: bool = False, settings: GpuMonitorSettings | None = None
) -> OverheadResult:
    """Run the monitor observe-only for `seconds` and measure what it costs."""
    settings = settings or GpuMonitorSettings(act=False, metrics_port=0)
    sampler: GpuSampler | None = None
    source = "synthetic"
    if not synthetic:
        # The probe is measured on its own below; in the run it would add child CPU time
        # that thread time cannot see.
        sampler = open_nvml_sampler(ContextProber(0.0, settings.context_probe_timeout_s))
        source = "nvml" if sampler is not None else "synthetic (no NVML on this host)"
    if sampler is None:
        sampler = synthetic_sampler()
    monitor = GpuMonitor(sampler, settings)
    started = time.monotonic()
    monitor.start()
    time.sleep(seconds)
    monitor.stop()
    wall = time.monotonic() - started
    snap = monitor.snapshot()
    indices = [g.index for g in snap.gpus]
    probe_cpu: float | None = None
    probe_ok: dict[int, bool] = {}
    if source == "nvml" and settings.context_probe_period_s > 0:
        probe_cpu, probe_ok = probe_cpu_seconds(indices, settings.context_probe_timeout_s)
    return OverheadResult(
        source=source,
        gpus=snap.gpu_count,
        rounds=snap.rounds,
        wall_s=wall,
        monitor_cpu_s=snap.cpu_seconds_total,
        probe_cpu_s=probe_cpu,
        probe_ok=probe_ok,
        period_s=settings.sample_period_s,
        probe_period_s=settings.context_probe_period_s,
        states=[
            {"gpu": g.index, "state": g.state.name.lower(), "reasons": sorted(g.reasons)}
            for g in snap.gpus
        ],
        last_samples=[asdict(g.last) for g in snap.gpus if g.last is not None],
    )


@dataclass
class DrillResult:
    steps: list[dict[str, Any]] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)  # one line per window scored
    error: str | None = None


def fallback_drill(
    http_url: str,
    gpus: Sequence[int],
    score_one: Callable[[], str],
    restore_after_s: float = 1.0,
    admin_key: str | None = None,
) -> DrillResult:
    """All GPUs unhealthy (synthetic) -> L2 on the live server -> healthy again -> L0.

    `admin_key`: the server's key for the model-repository group (its reloads answer 403
    without it)."""
    settings = GpuMonitorSettings(restore_after_s=restore_after_s, metrics_port=0)
    hot = [GpuSample(i, f"GPU-{i}", 99.0, 78 * GIB, 80 * GIB, 91.0, 0, True) for i in gpus]
    calm = [GpuSample(i, f"GPU-{i}", 30.0, 4 * GIB, 80 * GIB, 55.0, 0, True) for i in gpus]
    sampler = ScriptedSampler([hot])
    controller = FallbackController(http_url, settings, admin_key=admin_key)
    monitor = GpuMonitor(sampler, settings, controller)
    result = DrillResult()
    try:
        result.answered.append(f"L0 before: {score_one()}")
        for _ in range(settings.trip_samples):
            monitor.step()
        result.answered.append(f"L{int(controller.level)} after trip: {score_one()}")
        sampler.replace([calm])
        monitor.step()
        time.sleep(restore_after_s)
        monitor.step()
        result.answered.append(f"L{int(controller.level)} after recovery: {score_one()}")
    except Exception as exc:  # the report says what broke
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        monitor.stop()
    result.steps = [
        {
            "level": f"L{int(t.level)}",
            "seconds": round(t.seconds, 3),
            "error": t.error,
            "instance_group": None if t.config is None else t.config.get("instance_group"),
        }
        for t in controller.transitions
    ]
    return result


def render_monitor(overhead: OverheadResult | None, drill: DrillResult | None) -> list[str]:
    """The report section (markdown lines)."""
    lines = ["## GPU monitor", ""]
    if overhead is not None:
        probe = "-" if overhead.probe_cpu_s is None else f"{overhead.probe_cpu_s * 1000:.1f} ms"
        lines += [
            f"Source: {overhead.source}; GPUs: {overhead.gpus}; {overhead.rounds} rounds in "
            f"{overhead.wall_s:.1f} s at {overhead.period_s} s.",
            "",
            "| monitor thread CPU | per round | one context probe (CPU) | share of one core |",
            "| ---: | ---: | ---: | ---: |",
            f"| {overhead.monitor_cpu_s * 1000:.1f} ms | "
            f"{overhead.monitor_cpu_s / max(overhead.rounds, 1) * 1000:.2f} ms | {probe} | "
            f"{overhead.share_of_core * 100:.3f} % |",
            "",
            f"Share = thread CPU / wall + probe CPU / {overhead.probe_period_s:.0f} s "
            "(target <= 1 %). States: "
            + json.dumps(overhead.states)
            + (f"; context probe: {json.dumps(overhead.probe_ok)}" if overhead.probe_ok else ""),
            "",
        ]
    if drill is not None:
        lines += ["Fallback drill on the gpu server (synthetic readings, real reloads):", ""]
        lines += [f"- load {json.dumps(step)}" for step in drill.steps]
        lines += [f"- {line}" for line in drill.answered]
        if drill.error:
            lines.append(f"- drill failed: {drill.error}")
        lines.append("")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GPU monitor overhead")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--synthetic", action="store_true", help="never open NVML")
    args = parser.parse_args(argv)
    result = run_overhead(args.seconds, args.synthetic)
    print("\n".join(render_monitor(result, None)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
