"""The Markdown benchmark report (`report.md`), one function per section.

Pure: nothing here measures. `render_report` turns a `perf.results.BenchResults` (or a
summary.json read back) into `report.md`; the figures it judges come from `perf.targets`.

Re-render a report: `python -m perf.report perf/reports/bench-<stamp>/summary.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from perf.report_serving import (
    format_number,
    markdown_table,
    open_loop_section,
    robustness_section,
    rounds_section,
    verdict,
)
from perf.results import ENSEMBLE_MODEL, ENTRY_POINTS, FUSED_MODEL, BenchResults, size_key
from perf.targets import compute_ratios, compute_targets
from perf.window_cost import STAGES

__all__ = [
    "main",
    "render_report",
]


_num = format_number


_table = markdown_table


def _tuning_effects(entry: Mapping[str, Any]) -> str:
    before, after = entry.get("before", {}), entry.get("after", {})
    parts = []
    for key, old in before.items():
        new = after.get(key)
        if new is None or not old:
            continue
        change = (float(new) - float(old)) / float(old) * 100.0
        parts.append(f"{key} {float(old):.2f} -> {float(new):.2f} ({change:+.0f}%)")
    return "; ".join(parts) or str(entry.get("effect", ""))


def _tools_used(results: BenchResults) -> list[str]:
    """The server and only the client tools this run's series (and locust run) used."""
    used = {ENTRY_POINTS[s.entry].tool for s in results.series if s.entry in ENTRY_POINTS}
    host = results.host
    tools = [
        f"Triton {host.get('triton', '2.51')} ({results.server.get('profile', 'cpu')} profile)"
    ]
    if "perf_analyzer" in used:
        tools.append(str(host.get("perf_analyzer", "perf_analyzer")))
    if "perf.loadgen" in used:
        tools.append("load generator perf.loadgen (aiohttp, closed loop)")
    if results.locust:
        tools.append(f"locust {host.get('locust', '')}".strip())
    return tools


def _header(results: BenchResults) -> list[str]:
    """Title, host, tools, server configuration and how to read the figures."""
    lines: list[str] = []
    host = results.host
    lines = [
        f"# Benchmark: dispatch service ({results.stamp}, {results.mode} run)",
        "",
        f"Source: {host.get('source', 'unknown')}. "
        f"Host: {host.get('cpus', '?')} CPU cores, {host.get('platform', '')}; load average "
        f"before {host.get('loadavg_before', 'n/a')}, after {host.get('loadavg_after', 'n/a')}"
        " (a busy host makes every figure noisy). "
        f"Duration {results.duration_s:.0f} s.",
        f"Tools: {'; '.join(_tools_used(results))}.",
    ]
    if results.server.get("models"):
        models = ", ".join(
            f"{name}: {', '.join(f'{k} {v}' for k, v in cfg.items())}"
            for name, cfg in results.server["models"].items()
        )
        lines.append(f"Server configuration: {models}.")
    if results.server.get("overrides"):
        lines.append(f"Config overrides for this run: {', '.join(results.server['overrides'])}.")
    lines += [
        "",
        "Every request is a simulator window (fixed seeds, the same windows for every entry "
        "point and both references). Throughput is windows (requests) per second; orders/s = "
        "windows/s x orders per window. Latency is measured at the client, per window.",
        f"Triton answers through two models, measured side by side: `{ENSEMBLE_MODEL}` (the "
        f"four-step ensemble) and `{FUSED_MODEL}` (the same pipeline in one Python model); "
        "every target is computed for each.",
    ]
    return lines


def _targets_section(results: BenchResults) -> list[str]:
    """The targets, per model, with a verdict each."""
    lines = ["", "## Targets", ""]
    lines += _table(
        ["target", "model", "goal", "measured", "verdict", "detail"],
        [
            [
                t.name,
                f"`{t.model}`",
                t.goal,
                _num(t.measured) + (t.unit if t.measured is not None else ""),
                verdict(t),
                t.detail,
            ]
            for t in compute_targets(results)
            if not t.robustness
        ],
        "lllrll",
    )
    return lines


def _ratios_section(results: BenchResults) -> list[str]:
    """Ratios between entry points and against the references, per size."""
    sizes = results.sizes()
    lines: list[str] = []
    lines += ["", "## Ratios", ""]
    lines += _table(
        ["ratio", "model", *sizes, "how"],
        [
            [r.name, f"`{r.model}`", *(_num(r.values.get(s)) for s in sizes), r.how]
            for r in compute_ratios(results)
        ],
        "ll" + "r" * len(sizes) + "l",
    )
    return lines


def _limit_section(results: BenchResults) -> list[str]:
    """The in-process limit: the pipeline without serving."""
    lines: list[str] = []
    lines += ["", "## In-process limit (FusedDispatch, no serving)", ""]
    lines += _table(
        [
            "size",
            "1 thread windows/s",
            "1 thread orders/s",
            "p50 ms",
            "p99 ms",
            "N processes windows/s",
            "N processes orders/s",
        ],
        [
            [
                f"{size} ({stats.orders} orders)",
                _num(stats.single.throughput_per_s, 1),
                _num(stats.single_orders_per_s, 0),
                _num(stats.single.p50_ms),
                _num(stats.single.p99_ms),
                f"{_num(stats.multi_windows_per_s, 1)} (N={stats.processes})",
                _num(stats.multi_orders_per_s, 0),
            ]
            for size, stats in sorted(results.limits.items(), key=lambda kv: size_key(kv[0]))
        ],
    )
    return lines


def _window_cost_section(results: BenchResults) -> list[str]:
    """Where one window's CPU goes in process, stage by stage (`perf.window_cost`)."""
    costs = results.window_cost
    if not costs:
        return []
    sizes = sorted(costs, key=size_key)
    rows: list[list[str]] = []
    path: list[str] = []
    for name, depth in STAGES:
        path[depth:] = [name]
        if any(name in costs[size] for size in sizes):
            rows.append([" / ".join(path), *(_num(costs[size].get(name), 1) for size in sizes)])
    return [
        "",
        "## Where a window's CPU goes (in process, 1 thread)",
        "",
        "Median thread-CPU microseconds per window of each stage, each timed on its own over "
        "the same windows in turn (`python -m perf.window_cost`; its docstring says what each "
        "stage holds). `fused` is `FusedDispatch.run` as dispatch_fused runs a window alone "
        "(a one-order window takes the straight path); `fused_general` the same with that "
        "path off, whose steps the rows below it split. Work handed to other threads (a large "
        "window's candidate ranking) is not on this clock.",
        "",
        *_table(["stage", *(f"{size} us" for size in sizes)], rows),
    ]


def _breakdown_section(results: BenchResults) -> list[str]:
    """Where the time goes inside Triton, per model and step (when measured)."""
    sizes = results.sizes()
    lines: list[str] = []
    if not (results.breakdown or results.breakdown_fused):
        return lines
    lines += [
        "",
        "## Where the time goes (Triton, gRPC, concurrency 1)",
        "",
        f"Server-side averages from perf_analyzer's server statistics: for `{ENSEMBLE_MODEL}` "
        "one row per ensemble step (a BLS call a step makes is inside that step's time), "
        f"for `{FUSED_MODEL}` the one model's own split. The last column is the in-process "
        "p50 of the whole pipeline for comparison.",
        "",
    ]
    rows = []
    for size in sizes:
        limit = results.limits.get(size)
        for model, breakdown in results.breakdowns().items():
            for step, parts in breakdown.get(size, {}).items():
                rows.append(
                    [
                        size,
                        f"`{model}`",
                        step,
                        _num(parts.get("total_ms")),
                        _num(parts.get("queue_ms")),
                        _num(parts.get("compute_infer_ms")),
                        _num(parts.get("compute_io_ms")),
                        _num(limit.single.p50_ms) if limit else "n/a",
                    ]
                )
    lines += _table(
        [
            "size",
            "model",
            "step",
            "total ms",
            "queue ms",
            "compute ms",
            "input+output ms",
            "in-process",
        ],
        rows,
        "lllrrrrr",
    )
    return lines


def _size_section(results: BenchResults, size: str, plots: Mapping[str, str]) -> list[str]:
    """One window size: its plot and every entry point's sweep."""
    lines: list[str] = []
    info = results.windows.get(size, {})
    lines += [
        "",
        f"## {size}: {info.get('orders', '?')} orders x {info.get('riders', '?')} riders",
        "",
    ]
    if size in plots:
        lines += [f"![{size}]({plots[size]})", ""]
    rows = []
    for entry in ENTRY_POINTS.values():
        series = results.find(entry.key, size)
        if series is None:
            continue
        for row in series.rows:
            rows.append(
                [
                    entry.label,
                    str(row.concurrency),
                    _num(row.throughput_per_s, 1),
                    _num(row.throughput_per_s * int(info.get("orders", 1)), 0),
                    _num(row.p50_ms),
                    _num(row.p95_ms),
                    _num(row.p99_ms),
                    str(row.requests),
                    str(row.errors),
                ]
            )
        rows += [[entry.label, "-", failure, "", "", "", "", "", ""] for failure in series.failures]
    lines += _table(
        [
            "entry point",
            "conc.",
            "windows/s",
            "orders/s",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "requests",
            "errors",
        ],
        rows,
        "lrrrrrrrr",
    )
    if info:
        lines += [
            "",
            f"{info.get('count', '?')} distinct windows "
            f"(seeds from {info.get('first_seed', '?')}); "
            f"perf_analyzer input file {info.get('input_data_bytes', 0) / 1e6:.2f} MB; "
            f"--output-shared-memory-size {info.get('output_shm_size', 'n/a')} bytes.",
        ]
    return lines


def _locust_section(results: BenchResults) -> list[str]:
    """The locust scenario (when run)."""
    lines: list[str] = []
    if not results.locust:
        return lines
    loc = results.locust
    lines += [
        "",
        "## Locust scenario",
        "",
        f"`perf/locustfile.py`: {loc.get('users')} users, {loc.get('size')} windows, "
        f"{loc.get('body')} bodies to Triton HTTP, {loc.get('run_time')}, at most "
        f"{loc.get('max_requests')} requests.",
        "",
    ]
    lines += _table(
        ["requests", "failures", "req/s", "p50 ms", "p95 ms", "p99 ms"],
        [
            [
                str(loc.get("requests", "n/a")),
                str(loc.get("failures", "n/a")),
                _num(loc.get("rps"), 1),
                _num(loc.get("p50_ms"), 1),
                _num(loc.get("p95_ms"), 1),
                _num(loc.get("p99_ms"), 1),
            ]
        ],
        "rrrrrr",
    )
    return lines


_GEOCODING_SCENARIOS = (
    ("coordinates", "coordinates", "-"),
    ("provider_20ms_cold", "addresses", "20 ms, cold cache"),
    ("provider_20ms_warm", "addresses", "20 ms, warm cache"),
    ("coordinates_again", "coordinates", "-"),
    ("provider_400ms_cold", "addresses", "400 ms, cold cache"),
)


def _geocoding_section(results: BenchResults) -> list[str]:
    """Windows with addresses against the same windows with coordinates."""
    geo = results.geocoding
    if not geo:
        return []
    lines = [
        "",
        "## Orders with addresses",
        "",
        f"`perf.geocoding_bench --served`: {geo.get('orders')} x {geo.get('riders')} windows, "
        f"one request at a time over gRPC to `{geo.get('model')}`, every pickup and drop-off "
        "an address (loopback geocoding server as both providers), against the same windows "
        "with coordinates. Sources from `ORDER_LOCATION_SOURCE`.",
        "",
    ]
    rows = []
    for key, points, providers in _GEOCODING_SCENARIOS:
        found = geo.get(key)
        if not found:
            continue
        share = ", ".join(f"{name} {100 * v:.3g} %" for name, v in found["share"].items())
        rows.append(
            [
                points,
                providers,
                str(found["windows"]),
                str(found["errors"]),
                _num(found["p50_ms"], 1),
                _num(found["p99_ms"], 1),
                _num(found["max_ms"], 1),
                str(found["over_320ms"]),
                share,
            ]
        )
    lines += _table(
        ["points", "providers", "windows", "errors", "p50 ms", "p99 ms", "max ms", "> 320 ms",
         "answered by"],
        rows,
        "llrrrrrrl",
    )  # fmt: skip
    ratio = geo.get("warm_over_coordinates_p50")
    if ratio is not None:
        lines += ["", f"Warm-cache p50 over the coordinates p50 (the lower of the two runs): "
                  f"{ratio:.2f}x (the target: at most 1.2x)."]  # fmt: skip
    return lines


def _tuning_section(results: BenchResults) -> list[str]:
    """The tuning log: changes tried and what each did."""
    lines: list[str] = []
    lines += ["", "## Tuning log", ""]
    if results.tuning_log:
        lines += [
            "Changes tried, each measured against what came before it with perf_analyzer over "
            "gRPC on the same windows: configuration variants with `python -m perf.tuning` (the "
            "unchanged configuration is measured again at the end, and that difference is the "
            "noise to read every entry against), code changes by serving each commit with its "
            "own code (the conditions column says how, and how far repeated runs differed). "
            "Source: `perf/tuning_log.json`.",
            "",
        ]
        lines += _table(
            ["date", "change", "measured effect (before -> after)", "decision", "conditions"],
            [
                [
                    str(e.get("date", "")),
                    str(e.get("change", "")),
                    _tuning_effects(e),
                    str(e.get("decision", "")),
                    str(e.get("conditions", "")),
                ]
                for e in results.tuning_log
            ],
            "lllll",
        )
    else:
        lines.append("No tuning entries recorded.")
    return lines


def _notes_section(results: BenchResults) -> list[str]:
    """The run's notes (when any)."""
    lines: list[str] = []
    if results.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in results.notes]
    return lines


def _method_section(results: BenchResults) -> list[str]:
    """How every figure was measured."""
    lines: list[str] = []
    lines += [
        "",
        "## Method",
        "",
        "- perf_analyzer 2.51 (tritonclient 2.51.0): `-i grpc`, `-i http` (binary tensors), "
        "`-i grpc --shared-memory system --output-shared-memory-size <largest output x 1.25>`; "
        "`--measurement-mode count_windows`: windows of at least a third of the level's "
        "requests (whole seconds) until 3 in a row agree within 2x, at most 6; figures from "
        "its CSV (`--request-count` runs sometimes hang over HTTP in 2.51, and rate its "
        "throughput in whole seconds).",
        "- HTTP JSON (Triton) and both FastAPI variants: `perf.loadgen`, a closed-loop aiohttp "
        "generator, one warm-up request per stream, then a fixed request count or time limit. "
        "perf_analyzer 2.51 cannot measure HTTP JSON here: with `--input-tensor-format json` it "
        "puts only the first element of each input tensor in the body and Triton refuses the "
        "request (\"Shape does not match true shape of 'data' field\").",
        "- Every window carries the ensemble's optional inputs with neutral values (default "
        "weights, tag `stable`): perf_analyzer's shared-memory mode cannot omit an optional "
        "input, and all entry points send the same requests.",
        f"- `{FUSED_MODEL}`: the same inputs, outputs and answer as the `{ENSEMBLE_MODEL}` "
        "ensemble, but encoding, routed ONNX scoring and Top-K resolution run in one Python "
        "model (one process hop instead of four). Same server, windows and client; each "
        "transport is measured for the ensemble, then for the fused model, whose sweep may "
        "have fewer levels (see the tables).",
        "- In-process limit: `FusedDispatch.run` (what `dispatch_fused` runs for a window, "
        "configured by its config.pbtxt) in the benchmark process (1 thread) and in 2 spawned "
        "worker processes started behind a barrier.",
        "- FastAPI baseline: `perf/baselines/fastapi_service.py`, uvicorn with 2 workers "
        "(httptools, uvloop), the same library and model, on loopback.",
        "- Client, server and references run one after another on the same host; the load "
        "generator and the service under test share its cores, except in the open-loop "
        "overload, where `taskset` puts the server (tritonserver and its stubs) on one set of "
        "cores and the generator and probes on the other (two cores: server on core 1, load "
        "on core 0; more: the upper half for the server, the lower half for the load).",
    ]
    return lines


def render_report(results: BenchResults, plots: Mapping[str, str] | None = None) -> str:
    """The Markdown report; `plots` maps a size to its PNG file name (beside report.md)."""
    plots = plots or {}
    lines = [
        *_header(results),
        *_targets_section(results),
        *rounds_section(results),
        *open_loop_section(results),
        *robustness_section(compute_targets(results)),
        *_ratios_section(results),
        *_limit_section(results),
        *_window_cost_section(results),
        *_breakdown_section(results),
    ]
    for size in results.sizes():
        lines += _size_section(results, size, plots)
    lines += [
        *_locust_section(results),
        *_geocoding_section(results),
        *_tuning_section(results),
        *_notes_section(results),
        *_method_section(results),
    ]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Re-render report.md from a summary.json")
    parser.add_argument("summary", type=Path)
    args = parser.parse_args(argv)
    results = BenchResults.from_dict(json.loads(args.summary.read_text()))
    plots = {
        size: f"{size}.png"
        for size in results.sizes()
        if (args.summary.parent / f"{size}.png").exists()
    }
    (args.summary.parent / "report.md").write_text(render_report(results, plots))
    print(args.summary.parent / "report.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
