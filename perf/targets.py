"""Judging benchmark results: ratios between entry points and the service's targets.

Pure: reads a `perf.results.BenchResults`, measures nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perf.overload import MIXED_RUN, OVERLOAD_RUN, REFERENCE_RUN
from perf.results import ENSEMBLE_MODEL, FUSED_MODEL, MODELS, BenchResults, entry_key
from perf.serving_targets import open_loop_targets, round_spread, single_window_targets
from perf.target import Target, at_level, divide

__all__ = [
    "TARGET_CONCURRENCY",
    "OverloadFigures",
    "Ratio",
    "Target",
    "compute_ratios",
    "compute_targets",
    "model_targets",
    "scheduler_targets",
    "summary",
]


# ---- ratios ---------------------------------------------------------------------------------


_div = divide


def _peak(results: BenchResults, entry: str, size: str) -> float | None:
    series = results.find(entry, size)
    best = series.peak() if series else None
    return best.throughput_per_s if best else None


_at = at_level


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


# ---- the service's targets -------------------------------------------------------------------


TARGET_CONCURRENCY = 64


def model_targets(results: BenchResults, model: str) -> list[Target]:
    """The targets for one Triton model (same goals for both entry points)."""
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


def _overload_level(overload: dict[str, Any], label: str, key: str) -> dict[str, Any]:
    """One level's figures of one overload run: `key` "level_2" (the generator's callers)
    or "probe_level_2" (the probe outside it)."""
    summary = overload.get(label, {})
    figures = summary.get(key) if isinstance(summary, dict) else None
    return dict(figures) if isinstance(figures, dict) else {}


@dataclass(frozen=True)
class OverloadFigures:
    """What the overload targets read from one model's three runs (`perf.overload.BENCH_RUNS`).

    Each ratio reads both sides from the same client: the generator at 512 callers against
    the same generator at 64 (REFERENCE_RUN); the probes likewise.
    """

    reference_p99: float | None
    reference_probe_p99: float | None
    standard: dict[str, Any]
    standard_probe: dict[str, Any]
    urgent: dict[str, Any]
    urgent_probe: dict[str, Any]
    bulk: dict[str, Any]
    # a full-queue refusal (immediate by design; one for an expired deadline waits the
    # deadline out) as a probe outside the generator saw it (the slower of the all-standard
    # run and the mixed run's bulk), and as the generator did
    refusal_p99: float | None
    generator_refusal_p99: float | None
    urgent_refused: float | None
    served_after: list[bool]

    @classmethod
    def of(cls, overload: dict[str, Any]) -> OverloadFigures:
        level = _overload_level
        reference = level(overload, REFERENCE_RUN, "level_2")
        reference_probe = level(overload, REFERENCE_RUN, "probe_level_2")
        standard = level(overload, OVERLOAD_RUN, "level_2")
        standard_probe = level(overload, OVERLOAD_RUN, "probe_level_2")
        urgent = level(overload, MIXED_RUN, "level_1")
        urgent_probe = level(overload, MIXED_RUN, "probe_level_1")
        bulk = level(overload, MIXED_RUN, "level_3")
        bulk_probe = level(overload, MIXED_RUN, "probe_level_3")
        return cls(
            reference_p99=reference.get("accepted_p99_ms"),
            reference_probe_p99=reference_probe.get("accepted_p99_ms"),
            standard=standard,
            standard_probe=standard_probe,
            urgent=urgent,
            urgent_probe=urgent_probe,
            bulk=bulk,
            refusal_p99=_slowest(
                standard_probe.get("queue_full_refusal_p99_ms"),
                bulk_probe.get("queue_full_refusal_p99_ms"),
            ),
            generator_refusal_p99=_slowest(
                standard.get("queue_full_refusal_p99_ms"), bulk.get("queue_full_refusal_p99_ms")
            ),
            urgent_refused=(
                urgent["refused"] + urgent_probe.get("refused", 0) if "refused" in urgent else None
            ),
            served_after=[
                bool(run.get("next_request_served"))
                for run in overload.values()
                if isinstance(run, dict)
            ],
        )

    @property
    def accepted_ratio(self) -> float | None:
        return _div(self.standard.get("accepted_p99_ms"), self.reference_p99)

    @property
    def urgent_ratio(self) -> float | None:
        return _div(self.urgent.get("accepted_p99_ms"), self.reference_p99)


def _slowest(*values: Any) -> float | None:
    return max((float(v) for v in values if v is not None), default=None)


def _idle_detail(idle: dict[str, Any]) -> str:
    """perf.idle_cost's figures: one window's CPU in process, hot and after each idle gap."""
    runs = ", ".join(
        f"{run['cpu_us_per_window']:,.0f} us after {run['gap_ms']:g} ms idle"
        for run in idle.get("runs", [])
    )
    return f"one window in process (perf.idle_cost), CPU: {runs}" if runs else ""


def scheduler_targets(results: BenchResults) -> list[Target]:
    """The scheduler's targets: batching, latency at c=1 and behaviour under overload."""
    grpc_fused, grpc_ensemble = entry_key("grpc", FUSED_MODEL), entry_key("grpc", ENSEMBLE_MODEL)
    fused1 = _at(results, grpc_fused, "small", 1)
    fused64 = _at(results, grpc_fused, "small", TARGET_CONCURRENCY)
    ensemble64 = _at(results, grpc_ensemble, "small", TARGET_CONCURRENCY)
    fast64 = _at(results, "fastapi_json", "small", TARGET_CONCURRENCY)
    limit = results.limits.get("small")
    floor64 = results.floor.get(f"c{TARGET_CONCURRENCY}")
    floor_tput = floor64.get("throughput_per_s") if isinstance(floor64, dict) else None
    fused_tput = fused64.throughput_per_s if fused64 else None
    fast_tput = fast64.throughput_per_s if fast64 else None
    fig = OverloadFigures.of(results.overload)
    # The no-work floor under the same runs: what this host allows a model that does nothing.
    floor_overload = results.floor.get("overload")
    bare = OverloadFigures.of(floor_overload if isinstance(floor_overload, dict) else {})
    floor_detail = (
        f"no-work floor of the contract: {floor_tput:,.0f} windows/s"
        if floor_tput
        else (f"no-work floor of the contract: {floor64}" if floor64 else "")  # why it failed
    )
    floor1 = results.floor.get("c1")
    floor1_p50 = floor1.get("p50_ms") if isinstance(floor1, dict) else None
    alone_p50 = limit.single.p50_ms if limit else None
    idle = results.floor.get("idle_cost")
    # Serving a window costs at least the floor's serving plus the window's own work, which
    # runs no faster in the stub than in a hot loop in process: their sum bounds c=1 below.
    c1_detail = "; ".join(
        part
        for part in (
            f"no-work floor p50: {floor1_p50:.2f} ms" if floor1_p50 is not None else "",
            f"in-process p50 (1 thread, no serving): {alone_p50:.2f} ms" if alone_p50 else "",
            f"their sum, a lower bound: {floor1_p50 + alone_p50:.2f} ms"
            if floor1_p50 is not None and alone_p50
            else "",
            _idle_detail(idle) if isinstance(idle, dict) else "",
        )
        if part
    )
    vs_fastapi = _over_rounds(
        results, "dispatch_fused / FastAPI", _div(fused_tput, fast_tput), 2.0, floor_detail
    )
    vs_limit = _over_rounds(
        results,
        "dispatch_fused / in-process limit",
        _div(fused_tput, limit.multi_windows_per_s if limit else None),
        1.0,
        "limit: DispatchPipeline in 2 worker processes, no serving",
    )
    ensemble_vs_fastapi = _over_rounds(
        results,
        "dispatch / FastAPI",
        _div(ensemble64.throughput_per_s if ensemble64 else None, fast_tput),
        1.0,
        "",
    )
    return [
        Target(
            "small, gRPC, c=64: throughput / FastAPI",
            FUSED_MODEL,
            *vs_fastapi,
        ),
        Target(
            "small, gRPC, c=64: throughput / in-process limit",
            FUSED_MODEL,
            *vs_limit,
        ),
        Target(
            "small, gRPC, c=64: throughput / FastAPI",
            ENSEMBLE_MODEL,
            *ensemble_vs_fastapi,
        ),
        Target(
            "small, gRPC, c=1: p50",
            FUSED_MODEL,
            fused1.p50_ms if fused1 else None,
            1.2,
            True,
            " ms",
            c1_detail,
        ),
        Target(
            "small, gRPC, c=1: p99",
            FUSED_MODEL,
            fused1.p99_ms if fused1 else None,
            3.0,
            True,
            " ms",
        ),
        Target(
            "overload c=512: accepted p99 / p99 at c=64",
            FUSED_MODEL,
            fig.accepted_ratio,
            3.0,
            True,
            "x",
            _overload_detail(fig.standard)
            + _reference_detail(fig.reference_p99)
            + _probe_ratio(fig.standard_probe, fig.reference_probe_p99)
            + _floor_figure(bare.accepted_ratio, "x"),
            robustness=True,
        ),
        Target(
            "overload c=512: refusal p99",
            FUSED_MODEL,
            fig.refusal_p99,
            10.0,
            True,
            " ms",
            "full-queue refusals as a probe outside the generator saw them (the slower of the "
            "all-standard run and the mixed run's bulk); the generator's own: "
            + (
                f"{fig.generator_refusal_p99:.1f} ms"
                if fig.generator_refusal_p99 is not None
                else "n/a"
            )
            + _floor_figure(bare.refusal_p99, " ms"),
            robustness=True,
        ),
        Target(
            "overload: next request after each burst served",
            FUSED_MODEL,
            float(all(fig.served_after)) if fig.served_after else None,
            1.0,
            False,
            "",
            "1 = served",
            robustness=True,
        ),
        Target(
            "mixed overload (10 % level-1 callers): level-1 refusals",
            FUSED_MODEL,
            fig.urgent_refused,
            0.0,
            True,
            "",
            _overload_detail(fig.urgent)
            + "; its probe: "
            + _overload_detail(fig.urgent_probe)
            + _floor_figure(bare.urgent_refused, ""),
            robustness=True,
        ),
        Target(
            "mixed overload: level-1 p99 / p99 at c=64",
            FUSED_MODEL,
            fig.urgent_ratio,
            2.0,
            True,
            "x",
            _reference_detail(fig.reference_p99).lstrip("; ")
            + _probe_ratio(fig.urgent_probe, fig.reference_probe_p99)
            + "; bulk (level 3): "
            + _overload_detail(fig.bulk)
            + _floor_figure(bare.urgent_ratio, "x"),
            robustness=True,
        ),
    ]


def _over_rounds(
    results: BenchResults, ratio: str, single: float | None, goal: float, detail: str
) -> tuple[float | None, float, bool, str, str]:
    """(measured, limit, at_most, unit, detail) of a c=64 throughput ratio: the median over
    the run's alternating rounds (`perf.rounds`) where there are any, else the sweep's one
    level, said so in the detail."""
    found = round_spread(results, ratio) if results.rounds else None
    if found is None:
        note = "one level of the sweep (no alternating rounds)" if single is not None else ""
        return single, goal, False, "x", "; ".join(part for part in (note, detail) if part)
    sweep = f"the sweep's one level: {single:.2f}x" if single is not None else ""
    text = "; ".join(part for part in (found.describe(), sweep, detail) if part)
    return found.median, goal, False, "x", text


def _floor_figure(value: float | None, unit: str) -> str:
    """The same figure for the no-work floor under the same runs, where it was measured."""
    if value is None:
        return ""
    shown = f"{value:,.0f}" if unit == "" else f"{value:.2f}{unit}"
    return f"; the no-work floor under the same load: {shown}"


def _reference_detail(p99: Any) -> str:
    return f"; the same generator at c=64: p99 {p99:.1f} ms" if p99 is not None else ""


def _probe_ratio(probe: dict[str, Any], reference_p99: Any) -> str:
    ratio = _div(probe.get("accepted_p99_ms"), reference_p99)
    return f"; a probe outside the generator: {ratio:.2f}x" if ratio is not None else ""


def _overload_detail(level: dict[str, Any]) -> str:
    if not level:
        return "not run"
    p99 = level.get("accepted_p99_ms")
    return (
        f"{level.get('accepted', 0):,} accepted ({level.get('accepted_per_s', 0):,.0f}/s"
        + (f", p99 {p99:.1f} ms" if p99 is not None else "")
        + f"), {level.get('refused', 0):,} refused"
    )


def compute_targets(results: BenchResults) -> list[Target]:
    """Every target for both models: the ensemble's row, then dispatch_fused's, per target;
    then the scheduler's (its closed-loop storm rows are robustness checks, not targets),
    the single-window comparisons and the open-loop overload (`perf.serving_targets`)."""
    ensemble, fused = (model_targets(results, model) for model in MODELS)
    paired = [target for pair in zip(ensemble, fused, strict=True) for target in pair]
    return [
        *paired,
        *scheduler_targets(results),
        *single_window_targets(results),
        *open_loop_targets(results),
    ]


def summary(results: BenchResults) -> dict[str, Any]:
    """`summary.json`: the results with their ratios and targets."""
    return results.to_dict(
        ratios=[ratio.to_dict() for ratio in compute_ratios(results)],
        targets=[target.to_dict() for target in compute_targets(results)],
    )
