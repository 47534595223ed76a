"""Benchmark results: the data model, ratios, the issue's targets and the Markdown report.

Pure: nothing here measures. `BenchResults.to_dict()` is `summary.json`; `render_report`
turns a results object (or a summary.json read back) into `report.md`.

Re-render a report: `python -m perf.report perf/reports/bench-<stamp>/summary.json`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perf.stats import LevelStats, LimitStats

__all__ = [
    "ENSEMBLE_MODEL",
    "ENTRY_POINTS",
    "FUSED_MODEL",
    "MODELS",
    "SIZE_ORDER",
    "TARGET_CONCURRENCY",
    "BenchResults",
    "EntryPoint",
    "Ratio",
    "Series",
    "Target",
    "compute_ratios",
    "compute_targets",
    "entry_key",
    "main",
    "model_targets",
    "render_report",
]

SIZE_ORDER = ("small", "medium", "large")

# The two Triton models that answer a dispatch window: the four-step ensemble and the same
# pipeline in one Python model (dispatch_service.routing.settings.FUSED_MODEL_NAME; a unit
# test keeps the two names equal, this module does not import the service).
ENSEMBLE_MODEL = "dispatch"
FUSED_MODEL = "dispatch_fused"
MODELS = (ENSEMBLE_MODEL, FUSED_MODEL)


@dataclass(frozen=True)
class EntryPoint:
    key: str
    label: str
    tool: str
    model: str  # the Triton model measured; "" for the FastAPI baseline
    transport: str  # grpc, grpc_shm, http_binary, http_json; the key for the baseline

    @property
    def ours(self) -> bool:
        return bool(self.model)


def entry_key(transport: str, model: str) -> str:
    """The series key of a Triton transport ("grpc", "grpc_shm", ...) for one model."""
    return transport if model == ENSEMBLE_MODEL else f"fused_{transport}"


def _triton_entries(transport: str, label: str, tool: str) -> tuple[EntryPoint, EntryPoint]:
    return (
        EntryPoint(transport, f"{label}, {ENSEMBLE_MODEL}", tool, ENSEMBLE_MODEL, transport),
        EntryPoint(
            entry_key(transport, FUSED_MODEL),
            f"{label}, {FUSED_MODEL}",
            tool,
            FUSED_MODEL,
            transport,
        ),
    )


# Report order: each transport with the ensemble first, then the fused model.
ENTRY_POINTS: dict[str, EntryPoint] = {
    entry.key: entry
    for entry in (
        *_triton_entries("grpc", "Triton gRPC", "perf_analyzer"),
        *_triton_entries("grpc_shm", "Triton gRPC + system shm", "perf_analyzer"),
        *_triton_entries("http_binary", "Triton HTTP binary", "perf_analyzer"),
        *_triton_entries("http_json", "Triton HTTP JSON", "perf.loadgen"),
        EntryPoint("fastapi_json", "FastAPI, window JSON", "perf.loadgen", "", "fastapi_json"),
        EntryPoint(
            "fastapi_arrays", "FastAPI, base64 arrays", "perf.loadgen", "", "fastapi_arrays"
        ),
    )
}


@dataclass
class Series:
    """One entry point at one window size over a concurrency sweep."""

    entry: str
    size: str
    rows: list[LevelStats] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    command: str = ""

    def at(self, concurrency: int) -> LevelStats | None:
        return next((row for row in self.rows if row.concurrency == concurrency), None)

    def peak(self) -> LevelStats | None:
        return max(self.rows, key=lambda row: row.throughput_per_s, default=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "entry": self.entry,
            "label": ENTRY_POINTS[self.entry].label,
            "tool": ENTRY_POINTS[self.entry].tool,
            "model": ENTRY_POINTS[self.entry].model,
            "size": self.size,
            "rows": [row.to_dict() for row in self.rows],
            "failures": list(self.failures),
            "command": self.command,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Series:
        return cls(
            entry=str(data["entry"]),
            size=str(data["size"]),
            rows=[LevelStats.from_dict(row) for row in data.get("rows", [])],
            failures=[str(f) for f in data.get("failures", [])],
            command=str(data.get("command", "")),
        )


@dataclass
class BenchResults:
    stamp: str
    mode: str  # "full" or "quick"
    host: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    windows: dict[str, dict[str, Any]] = field(default_factory=dict)
    limits: dict[str, LimitStats] = field(default_factory=dict)
    series: list[Series] = field(default_factory=list)
    locust: dict[str, Any] | None = None
    tuning_log: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    duration_s: float = 0.0
    # size -> "model vN" -> Triton's server-side ms per ensemble step (gRPC, concurrency 1)
    breakdown: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    # size -> "dispatch_fused" -> the same parts for the fused model (its one step)
    breakdown_fused: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)

    def breakdowns(self) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
        """Model -> size -> step -> parts, for both Triton entry points."""
        return {ENSEMBLE_MODEL: self.breakdown, FUSED_MODEL: self.breakdown_fused}

    def find(self, entry: str, size: str) -> Series | None:
        return next((s for s in self.series if s.entry == entry and s.size == size), None)

    def sizes(self) -> list[str]:
        present = {s.size for s in self.series} | set(self.limits)
        return [size for size in SIZE_ORDER if size in present]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": 2,
            "stamp": self.stamp,
            "mode": self.mode,
            "duration_s": round(self.duration_s, 1),
            "host": self.host,
            "server": self.server,
            "windows": self.windows,
            "limit": {size: stats.to_dict() for size, stats in self.limits.items()},
            "series": [s.to_dict() for s in self.series],
            "locust": self.locust,
            "ratios": [ratio.to_dict() for ratio in compute_ratios(self)],
            "targets": [target.to_dict() for target in compute_targets(self)],
            "tuning_log": self.tuning_log,
            "notes": self.notes,
            "server_breakdown": self.breakdown,
            "server_breakdown_fused": self.breakdown_fused,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchResults:
        return cls(
            stamp=str(data["stamp"]),
            mode=str(data["mode"]),
            host=dict(data.get("host", {})),
            server=dict(data.get("server", {})),
            windows={k: dict(v) for k, v in data.get("windows", {}).items()},
            limits={k: LimitStats.from_dict(v) for k, v in data.get("limit", {}).items()},
            series=[Series.from_dict(s) for s in data.get("series", [])],
            locust=data.get("locust"),
            tuning_log=list(data.get("tuning_log", [])),
            notes=[str(n) for n in data.get("notes", [])],
            duration_s=float(data.get("duration_s", 0.0)),
            breakdown=_read_breakdown(data.get("server_breakdown", {})),
            breakdown_fused=_read_breakdown(data.get("server_breakdown_fused", {})),
        )


def _read_breakdown(data: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    return {
        size: {step: {k: float(v) for k, v in parts.items()} for step, parts in steps.items()}
        for size, steps in data.items()
    }


# ---- ratios ---------------------------------------------------------------------------------


def _div(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _peak(results: BenchResults, entry: str, size: str) -> float | None:
    series = results.find(entry, size)
    best = series.peak() if series else None
    return best.throughput_per_s if best else None


def _at(results: BenchResults, entry: str, size: str, concurrency: int) -> LevelStats | None:
    series = results.find(entry, size)
    return series.at(concurrency) if series else None


def _p50_at_1(results: BenchResults, entry: str, size: str) -> float | None:
    row = _at(results, entry, size, 1)
    return row.p50_ms if row else None


@dataclass(frozen=True)
class Ratio:
    name: str
    model: str  # the Triton model the ratio is about ("dispatch_fused / dispatch": both)
    how: str
    values: dict[str, float | None]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "how": self.how, "values": self.values}


def compute_ratios(results: BenchResults) -> list[Ratio]:
    """Per model, the same ratios (one row each, ensemble first), then fused / ensemble."""
    sizes = results.sizes()

    def per_size(fn: Any) -> dict[str, float | None]:
        return {size: fn(size) for size in sizes}

    def limit_multi(size: str) -> float | None:
        stats = results.limits.get(size)
        return stats.multi_windows_per_s if stats else None

    def limit_p50(size: str) -> float | None:
        stats = results.limits.get(size)
        return stats.single.p50_ms if stats else None

    def for_model(model: str) -> list[Ratio]:
        grpc, shm, json_ = (entry_key(t, model) for t in ("grpc", "grpc_shm", "http_json"))
        return [
            Ratio(
                "ours / limit, throughput",
                model,
                "peak gRPC windows/s over the sweep / in-process limit with 2 worker processes",
                per_size(lambda s: _div(_peak(results, grpc, s), limit_multi(s))),
            ),
            Ratio(
                "ours / limit, latency",
                model,
                "gRPC p50 at concurrency 1 / in-process single-thread p50 (above 1 = slower)",
                per_size(lambda s: _div(_p50_at_1(results, grpc, s), limit_p50(s))),
            ),
            Ratio(
                "ours / FastAPI (window JSON), throughput",
                model,
                "peak gRPC windows/s / peak FastAPI window-JSON windows/s",
                per_size(
                    lambda s: _div(_peak(results, grpc, s), _peak(results, "fastapi_json", s))
                ),
            ),
            Ratio(
                "ours / FastAPI (arrays), throughput",
                model,
                "peak gRPC windows/s / peak FastAPI base64-arrays windows/s",
                per_size(
                    lambda s: _div(_peak(results, grpc, s), _peak(results, "fastapi_arrays", s))
                ),
            ),
            Ratio(
                "Triton HTTP JSON / FastAPI (window JSON), throughput",
                model,
                "same load generator and JSON bodies on both sides: peak / peak",
                per_size(
                    lambda s: _div(_peak(results, json_, s), _peak(results, "fastapi_json", s))
                ),
            ),
            Ratio(
                "shm / plain gRPC, latency",
                model,
                "gRPC + system shared memory p50 / plain gRPC p50, concurrency 1",
                per_size(lambda s: _div(_p50_at_1(results, shm, s), _p50_at_1(results, grpc, s))),
            ),
            Ratio(
                "shm / plain gRPC, throughput",
                model,
                "peak windows/s with system shared memory / plain gRPC",
                per_size(lambda s: _div(_peak(results, shm, s), _peak(results, grpc, s))),
            ),
        ]

    ensemble, fused = for_model(ENSEMBLE_MODEL), for_model(FUSED_MODEL)
    both = f"{FUSED_MODEL} / {ENSEMBLE_MODEL}"
    fused_grpc = entry_key("grpc", FUSED_MODEL)
    return [
        *(row for pair in zip(ensemble, fused, strict=True) for row in pair),
        Ratio(
            "fused / ensemble, latency",
            both,
            "gRPC p50 at concurrency 1, dispatch_fused / dispatch (below 1 = fused faster)",
            per_size(
                lambda s: _div(_p50_at_1(results, fused_grpc, s), _p50_at_1(results, "grpc", s))
            ),
        ),
        Ratio(
            "fused / ensemble, throughput",
            both,
            "peak gRPC windows/s, dispatch_fused / dispatch (above 1 = fused faster)",
            per_size(lambda s: _div(_peak(results, fused_grpc, s), _peak(results, "grpc", s))),
        ),
    ]


# ---- the targets ---------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    model: str  # the Triton model measured: "dispatch" (ensemble) or "dispatch_fused"
    measured: float | None
    limit: float
    at_most: bool  # True: measured <= limit passes; False: measured >= limit passes
    unit: str
    detail: str = ""

    @property
    def met(self) -> bool | None:
        if self.measured is None:
            return None
        return self.measured <= self.limit if self.at_most else self.measured >= self.limit

    @property
    def goal(self) -> str:
        return f"{'<=' if self.at_most else '>='} {self.limit:g}{self.unit}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "goal": self.goal,
            "measured": self.measured,
            "unit": self.unit,
            "met": self.met,
            "detail": self.detail,
        }


TARGET_CONCURRENCY = 64


def model_targets(results: BenchResults, model: str) -> list[Target]:
    """The issue's targets for one Triton model (same goals for both entry points)."""
    grpc, shm = entry_key("grpc", model), entry_key("grpc_shm", model)
    c1 = _at(results, grpc, "small", 1)
    c64 = _at(results, grpc, "small", TARGET_CONCURRENCY)
    fast64 = _at(results, "fastapi_json", "small", TARGET_CONCURRENCY)
    arrays64 = _at(results, "fastapi_arrays", "small", TARGET_CONCURRENCY)
    limit = results.limits.get("small")
    large = _at(results, grpc, "large", 1)
    large_shm = _at(results, shm, "large", 1)
    tput64 = c64.throughput_per_s if c64 else None
    vs_arrays = _div(tput64, arrays64.throughput_per_s if arrays64 else None)
    return [
        Target("small, gRPC, c=1: p50", model, c1.p50_ms if c1 else None, 2.0, True, " ms"),
        Target("small, gRPC, c=1: p99", model, c1.p99_ms if c1 else None, 5.0, True, " ms"),
        Target(
            "small, gRPC, c=64: throughput / FastAPI",
            model,
            _div(tput64, fast64.throughput_per_s if fast64 else None),
            3.0,
            False,
            "x",
            "FastAPI with window JSON at c=64 (same windows)"
            + (f"; vs FastAPI base64 arrays: {vs_arrays:.2f}x" if vs_arrays is not None else ""),
        ),
        Target(
            "small, gRPC, c=64: throughput / in-process limit",
            model,
            _div(tput64, limit.multi_windows_per_s if limit else None),
            0.6,
            False,
            "x",
            "limit: DispatchPipeline in 2 worker processes, no serving",
        ),
        Target(
            "small, gRPC, c=64: p99 / p50",
            model,
            _div(c64.p99_ms, c64.p50_ms) if c64 else None,
            3.0,
            True,
            "x",
        ),
        Target(
            "large, gRPC, c=1: p99",
            model,
            large.p99_ms if large else None,
            100.0,
            True,
            " ms",
            "one 1,000 x 5,000 window at a time",
        ),
        Target(
            "large, c=1: gRPC + system shm p50 / plain gRPC p50",
            model,
            _div(large_shm.p50_ms if large_shm else None, large.p50_ms if large else None),
            0.7,
            True,
            "x",
        ),
    ]


def compute_targets(results: BenchResults) -> list[Target]:
    """Every target for both models: the ensemble's row, then dispatch_fused's, per target."""
    ensemble, fused = (model_targets(results, model) for model in MODELS)
    return [target for pair in zip(ensemble, fused, strict=True) for target in pair]


# ---- Markdown --------------------------------------------------------------------------------


def _num(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _verdict(met: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "not measured"}[met]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    marks = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


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


def render_report(results: BenchResults, plots: Mapping[str, str] | None = None) -> str:
    """The Markdown report; `plots` maps a size to its PNG file name (beside report.md)."""
    plots = plots or {}
    host = results.host
    lines = [
        f"# Benchmark: dispatch service ({results.stamp}, {results.mode} run)",
        "",
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
        "",
        "## Targets",
        "",
    ]
    lines += _table(
        ["target", "model", "goal", "measured", "verdict", "detail"],
        [
            [
                t.name,
                f"`{t.model}`",
                t.goal,
                _num(t.measured) + (t.unit if t.measured is not None else ""),
                _verdict(t.met),
                t.detail,
            ]
            for t in compute_targets(results)
        ],
        "lllrll",
    )
    sizes = results.sizes()
    lines += ["", "## Ratios", ""]
    lines += _table(
        ["ratio", "model", *sizes, "how"],
        [
            [r.name, f"`{r.model}`", *(_num(r.values.get(s)) for s in sizes), r.how]
            for r in compute_ratios(results)
        ],
        "ll" + "r" * len(sizes) + "l",
    )
    lines += ["", "## In-process limit (DispatchPipeline, no serving)", ""]
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
            for size, stats in sorted(results.limits.items(), key=lambda kv: _size_key(kv[0]))
        ],
    )
    if results.breakdown or results.breakdown_fused:
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
    for size in sizes:
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
            rows += [
                [entry.label, "-", failure, "", "", "", "", "", ""] for failure in series.failures
            ]
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
    if results.locust:
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
    if results.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in results.notes]
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
        "- In-process limit: `DispatchPipeline.from_repository()` in the benchmark process "
        "(1 thread) and in 2 spawned worker processes started behind a barrier.",
        "- FastAPI baseline: `perf/baselines/fastapi_service.py`, uvicorn with 2 workers "
        "(httptools, uvloop), the same library and model, on loopback.",
        "- Client, server and references run one after another on the same host; the load "
        "generator and the service under test share its cores.",
    ]
    return "\n".join(lines) + "\n"


def _size_key(size: str) -> int:
    return SIZE_ORDER.index(size) if size in SIZE_ORDER else len(SIZE_ORDER)


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
