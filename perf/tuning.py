"""Tuning runs: configuration variants (`perf.variants`) measured against the unchanged one.

`python -m perf.tuning --variant "dispatch_model.queue_delay_us=0" ...` measures the
unchanged configuration and each variant (perf_analyzer, gRPC, short levels) and appends
one entry per variant to perf/tuning_log.json, which the bench report shows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from perf.levels import pa_level
from perf.sessions import TritonSession
from perf.stats import request_budget
from perf.variants import TUNING_LOG, parse_override, patched_repository
from perf.windows import SIZES, optional_inputs
from perf.workload import prepare_workload

__all__ = [
    "METRICS",
    "append_log",
    "main",
    "metric_key",
    "noise_percent",
    "tuning_entry",
]

METRICS = (
    ("small", 1, "p50_ms"),
    ("small", 1, "p99_ms"),
    ("small", 64, "throughput_per_s"),
    ("small", 64, "p99_ms"),
    ("medium", 16, "throughput_per_s"),
)


def metric_key(size: str, concurrency: int, field: str) -> str:
    name = "windows_per_s" if field == "throughput_per_s" else field
    return f"{size}_c{concurrency}_{name}"


def tuning_entry(
    change: str,
    before: Mapping[str, float],
    after: Mapping[str, float],
    conditions: str,
    date: str,
) -> dict[str, Any]:
    return {
        "date": date,
        "change": change,
        "before": dict(before),
        "after": dict(after),
        "conditions": conditions,
        "decision": "",
    }


def noise_percent(first: Mapping[str, float], second: Mapping[str, float]) -> float:
    """Largest relative difference (%) between two measurements of the same configuration."""
    changes = [
        abs(second[key] - value) / value * 100.0
        for key, value in first.items()
        if key in second and value
    ]
    return max(changes, default=0.0)


def append_log(path: Path, entries: Sequence[Mapping[str, Any]]) -> None:
    existing = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps([*existing, *entries], indent=2) + "\n")


def _measure(repository: Path, work: Path, seconds: float) -> dict[str, float]:
    """The METRICS of one configuration: perf_analyzer over gRPC, one level at a time."""
    work.mkdir(parents=True, exist_ok=True)
    pipeline = DispatchPipeline.from_repository(repository)
    levels = sorted({(size, concurrency) for size, concurrency, _ in METRICS})
    optional = optional_inputs(repository)
    workloads = {
        size: prepare_workload(SIZES[size], pipeline, work, optional) for size, _ in levels
    }
    figures: dict[str, float] = {}
    with TritonSession(repository, work / "server.log") as session:
        rate = 100.0
        for size, concurrency in levels:
            count = request_budget(rate, seconds, concurrency)
            row, failure, _ = pa_level(
                session.pa,
                session.endpoints,
                "grpc",
                workloads[size],
                concurrency,
                request_count=count,
                out=work,
                timeout_s=120,
            )
            if row is None:
                print(f"  {failure}", flush=True)
                continue
            rate = row.throughput_per_s
            for m_size, m_concurrency, field in METRICS:
                if (m_size, m_concurrency) == (size, concurrency):
                    figures[metric_key(size, concurrency, field)] = float(getattr(row, field))
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure model-configuration variants")
    parser.add_argument(
        "--variant",
        action="append",
        required=True,
        help="comma-separated overrides, e.g. 'dispatch_model.queue_delay_us=0'",
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="per level")
    parser.add_argument("--log", type=Path, default=TUNING_LOG)
    parser.add_argument("--dry-run", action="store_true", help="print entries, do not append")
    args = parser.parse_args(argv)
    variants = [[parse_override(o) for o in v.split(",") if o.strip()] for v in args.variant]
    entries = []
    with tempfile.TemporaryDirectory(prefix="dispatch-tuning-") as tmp:
        work = Path(tmp)
        base = patched_repository(MODEL_REPOSITORY, work / "repo-base", [])
        before = _measure(base, work / "base", args.seconds)
        print(f"unchanged: {before}", flush=True)
        measured = []
        for number, overrides in enumerate(variants):
            repo = patched_repository(MODEL_REPOSITORY, work / f"repo-{number}", overrides)
            after = _measure(repo, work / f"variant-{number}", args.seconds)
            change = ", ".join(str(o) for o in overrides)
            print(f"{change}: {after}", flush=True)
            load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
            measured.append((change, after, load))
        # The unchanged configuration once more: how far apart two runs of the same thing
        # are on this machine right now, i.e. the noise every entry must be read against.
        repeat = _measure(base, work / "base-repeat", args.seconds)
        print(f"unchanged, again: {repeat}", flush=True)
        noise = noise_percent(before, repeat)
        for change, after, load in measured:
            entries.append(
                tuning_entry(
                    change,
                    before,
                    after,
                    f"{os.cpu_count()} cores, load average {load}; unchanged config re-run "
                    f"differed by up to {noise:.0f}%",
                    time.strftime("%Y-%m-%d"),
                )
            )
    if args.dry_run:
        print(json.dumps(entries, indent=2))
    else:
        append_log(args.log, entries)
        print(f"appended {len(entries)} entries to {args.log}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
