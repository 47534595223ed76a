"""Benchmark results: the data model `summary.json` is written from and read back into.

Pure: nothing here measures. `BenchResults.to_dict()` is `summary.json`;
`BenchResults.from_dict` reads one back (`perf.report` renders it, `perf.targets` judges it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from perf.stats import LevelStats, LimitStats

__all__ = [
    "ENSEMBLE_MODEL",
    "ENTRY_POINTS",
    "FUSED_MODEL",
    "MODELS",
    "SIZE_ORDER",
    "BenchResults",
    "EntryPoint",
    "Series",
    "entry_key",
    "size_key",
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
    # label ("overload", "mixed-priority overload") -> perf.overload's summary
    overload: dict[str, dict[str, Any]] = field(default_factory=dict)
    # perf.floor's figures: the contract's no-work floor at c=1 and c=64
    floor: dict[str, Any] = field(default_factory=dict)
    # perf.geocoding_bench.served_scenarios: windows with addresses vs coordinates
    geocoding: dict[str, Any] = field(default_factory=dict)
    # perf.overload_bench.measure_pinned: open-loop bursts on the server's own cores
    open_loop: dict[str, Any] = field(default_factory=dict)
    # perf.rounds.run_rounds: per round, entry -> its figure (None: failed)
    rounds: list[dict[str, float | None]] = field(default_factory=list)
    # perf.bench_rounds: entry -> per round, part -> CPU ms per small window at c=64
    served_cpu: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    # perf.window_cost.stage_costs: size -> stage -> median thread-CPU us per window
    window_cost: dict[str, dict[str, float]] = field(default_factory=dict)

    def breakdowns(self) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
        """Model -> size -> step -> parts, for both Triton entry points."""
        return {ENSEMBLE_MODEL: self.breakdown, FUSED_MODEL: self.breakdown_fused}

    def find(self, entry: str, size: str) -> Series | None:
        return next((s for s in self.series if s.entry == entry and s.size == size), None)

    def sizes(self) -> list[str]:
        present = {s.size for s in self.series} | set(self.limits)
        return [size for size in SIZE_ORDER if size in present]

    def to_dict(
        self,
        ratios: Sequence[Mapping[str, Any]] = (),
        targets: Sequence[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        """The `summary.json` form; `perf.targets.summary` passes the judged ratios and targets."""
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
            "ratios": list(ratios),
            "targets": list(targets),
            "tuning_log": self.tuning_log,
            "notes": self.notes,
            "server_breakdown": self.breakdown,
            "server_breakdown_fused": self.breakdown_fused,
            "overload": self.overload,
            "floor": self.floor,
            "geocoding": self.geocoding,
            "open_loop": self.open_loop,
            "rounds": self.rounds,
            "window_cost": self.window_cost,
            "served_cpu": self.served_cpu,
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
            overload={str(k): dict(v) for k, v in data.get("overload", {}).items()},
            floor=dict(data.get("floor", {})),
            geocoding=dict(data.get("geocoding", {})),
            open_loop=dict(data.get("open_loop", {})),
            rounds=[
                {str(k): None if v is None else float(v) for k, v in measured.items()}
                for measured in data.get("rounds", [])
            ],
            served_cpu={
                str(entry): [{str(k): float(v) for k, v in part.items()} for part in rounds]
                for entry, rounds in data.get("served_cpu", {}).items()
            },
            window_cost={
                str(size): {str(stage): float(us) for stage, us in stages.items()}
                for size, stages in data.get("window_cost", {}).items()
            },
        )


def _read_breakdown(data: Mapping[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    return {
        size: {step: {k: float(v) for k, v in parts.items()} for step, parts in steps.items()}
        for size, steps in data.items()
    }


def size_key(size: str) -> int:
    """Sort key of a window size: small, medium, large, then any other."""
    return SIZE_ORDER.index(size) if size in SIZE_ORDER else len(SIZE_ORDER)
