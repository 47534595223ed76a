"""Where dispatch_model spends its time: ONNX Runtime's profiler over simulated windows.

`make profile` runs the served model file with the served session settings (the
`dispatch_model` config's ONNX Runtime parameters) and profiling on, one window per run, the
windows made by the simulator and encoded by the encoder's own code and settings. It
prints a per-operator table (op type, node runs, total and mean microseconds, share of
operator time) and writes the Chrome-trace JSON (open it in chrome://tracing or Perfetto),
the table and a summary under `perf/reports/profile-<stamp>/`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from dispatch_contract import MODEL_INPUTS
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.core.repository_layout import ENCODER_MODEL, SCORING_MODEL, model_layout
from dispatch_service.core.settings import load_settings
from dispatch_service.domain.features import EncoderSettings, encode_window
from dispatch_service.offline.simulator import DEFAULT_CITY, generate_window
from dispatch_service.pipeline.onnx_runner import OrtSettings, execution_providers, session_options

__all__ = [
    "KERNEL_SUFFIX",
    "OperatorTime",
    "Profile",
    "RunTime",
    "format_table",
    "main",
    "operator_table",
    "profile_model",
    "run_time",
]

KERNEL_SUFFIX = "_kernel_time"


@dataclass(frozen=True)
class OperatorTime:
    """One operator type's time over the profiled runs."""

    op_type: str
    count: int  # node executions
    total_us: int
    share: float  # of all operator time, 0..1

    @property
    def mean_us(self) -> float:
        return self.total_us / self.count if self.count else 0.0


@dataclass(frozen=True)
class RunTime:
    """Whole `model_run` calls over the profiled runs."""

    runs: int
    total_us: int

    @property
    def mean_us(self) -> float:
        return self.total_us / self.runs if self.runs else 0.0


def _runs(events: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    return sorted(runs, key=lambda e: int(e["ts"]))


def _cutoff(events: Sequence[Mapping[str, Any]], skip_runs: int) -> int:
    """Start time of the first run that counts (after `skip_runs` warm-up runs)."""
    runs = _runs(events)
    if skip_runs <= 0 or not runs:
        return -1
    if skip_runs >= len(runs):
        return int(runs[-1]["ts"]) + int(runs[-1]["dur"]) + 1
    return int(runs[skip_runs]["ts"])


def operator_table(events: Sequence[Mapping[str, Any]], skip_runs: int = 0) -> list[OperatorTime]:
    """Kernel time per operator type, most expensive first (ties by name).

    `events` is ONNX Runtime's profile (a Chrome trace): node events are named
    `<node>_kernel_time` and carry the operator type in `args.op_name`; the first
    `skip_runs` `model_run` calls (warm-up) are left out.
    """
    cutoff = _cutoff(events, skip_runs)
    totals: dict[str, list[int]] = {}
    for event in events:
        if event.get("cat") != "Node" or not str(event.get("name", "")).endswith(KERNEL_SUFFIX):
            continue
        if int(event["ts"]) < cutoff:
            continue
        op_type = str(event.get("args", {}).get("op_name", "?"))
        entry = totals.setdefault(op_type, [0, 0])
        entry[0] += 1
        entry[1] += int(event["dur"])
    grand = sum(total for _, total in totals.values())
    rows = [
        OperatorTime(op, count, total, total / grand if grand else 0.0)
        for op, (count, total) in totals.items()
    ]
    return sorted(rows, key=lambda row: (-row.total_us, row.op_type))


def run_time(events: Sequence[Mapping[str, Any]], skip_runs: int = 0) -> RunTime:
    counted = _runs(events)[max(skip_runs, 0) :]
    return RunTime(len(counted), sum(int(e["dur"]) for e in counted))


def format_table(rows: Sequence[OperatorTime], runs: RunTime) -> str:
    """The operator table as Markdown, with the whole-run time underneath."""
    lines = [
        "| op type | count | total us | mean us | share |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {row.op_type} | {row.count} | {row.total_us} | {row.mean_us:.1f} | "
        f"{100.0 * row.share:.1f} % |"
        for row in rows
    ]
    operators = sum(row.total_us for row in rows)
    lines.append(
        f"\n{runs.runs} runs, model_run {runs.total_us} us in all "
        f"(mean {runs.mean_us:.1f} us); operators {operators} us"
    )
    return "\n".join(lines)


@dataclass(frozen=True)
class Profile:
    trace: Path
    rows: list[OperatorTime]
    runs: RunTime
    pairs_per_run: float


def profile_model(
    model_path: Path,
    out_dir: Path,
    *,
    windows: int = 32,
    orders: int = 64,
    riders: int = 200,
    seed: int = 7,
    warmup: int = 3,
    ort_settings: OrtSettings | None = None,
    encoder: EncoderSettings | None = None,
) -> Profile:
    """Profile `windows` scored runs (after `warmup` unprofiled-in-the-table runs)."""
    rng = np.random.default_rng(seed)
    batches = [
        encode_window(generate_window(rng, orders, riders), DEFAULT_CITY.map, encoder).pair_features
        for _ in range(windows)
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    settings = ort_settings or OrtSettings()
    options = session_options(settings)
    options.enable_profiling = True
    options.profile_file_prefix = str(out_dir / "ort_profile")
    session = ort.InferenceSession(
        str(model_path), sess_options=options, providers=execution_providers(settings)
    )
    input_name = MODEL_INPUTS[0].name
    for features in batches[: min(warmup, len(batches))] + batches:
        session.run(None, {input_name: features})
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())
    return Profile(
        trace=trace,
        rows=operator_table(events, skip_runs=warmup),
        runs=run_time(events, skip_runs=warmup),
        pairs_per_run=float(np.mean([len(b) for b in batches])) if batches else 0.0,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """`make profile`."""
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,  # every option has a default
    )
    parser.add_argument("--repository", type=Path, default=MODEL_REPOSITORY, help="models")
    parser.add_argument("--version", default="1", help="dispatch_model version folder")
    parser.add_argument("--windows", type=int, default=32, help="simulator windows scored")
    parser.add_argument("--orders", type=int, default=64, help="orders per window")
    parser.add_argument("--riders", type=int, default=200, help="riders per window")
    parser.add_argument("--seed", type=int, default=7, help="simulator seed")
    parser.add_argument("--warmup", type=int, default=3, help="runs left out of the table")
    parser.add_argument(
        "--reports",
        type=Path,
        default=REPO_ROOT / "perf" / "reports",
        help="writes profile-<stamp>/ here (ignored by git unless added with -f)",
    )
    args = parser.parse_args(argv)
    if args.windows < 1 or args.orders < 1 or args.riders < 1 or args.warmup < 0:
        parser.error("--windows, --orders and --riders must be >= 1, --warmup >= 0")

    scoring = model_layout(args.repository, SCORING_MODEL)
    model_path = scoring.onnx(args.version)
    if not model_path.is_file():
        print(f"error: no model file {model_path}", file=sys.stderr)
        return 1
    ort_settings = load_settings(OrtSettings, config_parameters(scoring.config))
    encoder = load_settings(
        EncoderSettings, config_parameters(model_layout(args.repository, ENCODER_MODEL).config)
    )
    out_dir = args.reports / f"profile-{time.strftime('%Y%m%d-%H%M%S')}"
    result = profile_model(
        model_path,
        out_dir,
        windows=args.windows,
        orders=args.orders,
        riders=args.riders,
        seed=args.seed,
        warmup=args.warmup,
        ort_settings=ort_settings,
        encoder=encoder,
    )
    table = format_table(result.rows, result.runs)
    heading = (
        f"# dispatch_model v{args.version}: ONNX Runtime {ort.__version__} profile\n\n"
        f"{args.windows} simulator windows of {args.orders} orders x {args.riders} riders "
        f"(seed {args.seed}), one window per run, {result.pairs_per_run:.0f} pairs per run; "
        f"{args.warmup} warm-up runs left out. Session: {ort_settings}.\n"
        f"Trace: {result.trace.name}\n"
    )
    (out_dir / "operators.md").write_text(f"{heading}\n{table}\n")
    summary = {
        "model": str(model_path),
        "onnxruntime": ort.__version__,
        "windows": args.windows,
        "orders": args.orders,
        "riders": args.riders,
        "seed": args.seed,
        "warmup": args.warmup,
        "pairs_per_run": result.pairs_per_run,
        "runs": asdict(result.runs),
        "operators": [asdict(row) for row in result.rows],
        "trace": result.trace.name,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{heading}\n{table}\n\nwritten to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
