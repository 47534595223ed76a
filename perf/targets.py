"""Judging benchmark results: ratios between entry points and the service's targets.

Pure: reads a `perf.results.BenchResults`, measures nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from perf.overload import MIXED_RUN, OVERLOAD_RUN, REFERENCE_RUN
from perf.results import ENSEMBLE_MODEL, FUSED_MODEL, BenchResults, entry_key
from perf.rounds import (
    FASTAPI_RATIO,
    FLOOR_C1_EXTRA_MS,
    FLOOR_C1_GAP,
    FLOOR_RATIO,
    FLOOR_THROUGHPUT_SHARE,
    ROUND_GAPS,
    round_gap,
)
from perf.serving_targets import open_loop_targets, round_spread, single_window_targets
from perf.target import Target, at_level, divide

__all__ = [
    "FLOOR_C1_EXTRA_MS",
    "FLOOR_THROUGHPUT_SHARE",
    "IN_PROCESS_P50_MS",
    "TARGET_CONCURRENCY",
    "OverloadFigures",
    "Ratio",
    "Target",
    "compute_ratios",
    "compute_targets",
    "goal_targets",
    "storm_checks",
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

# Today's goals; older ones are retired from the table (git history keeps them).
# In process, 1 thread, no serving: each size's p50 at most this (ms).
IN_PROCESS_P50_MS: Final = {"small": 0.25, "medium": 2.0, "large": 33.0}


def goal_targets(results: BenchResults) -> list[Target]:
    """Today's goals, each beside the no-work floor measured the same way where one is:
    the library in process per size, small c=64 throughput against the floor's (the median
    over the alternating rounds where they measured the floor) and small c=1 p50 over the
    floor's."""
    fused = entry_key("grpc", FUSED_MODEL)
    fused1 = _at(results, fused, "small", 1)
    fused64 = _at(results, fused, "small", TARGET_CONCURRENCY)
    fast64 = _at(results, "fastapi_json", "small", TARGET_CONCURRENCY)
    floor1, floor64 = (results.floor.get(f"c{c}") for c in (1, TARGET_CONCURRENCY))
    floor1_p50 = floor1.get("p50_ms") if isinstance(floor1, dict) else None
    floor_tput = floor64.get("throughput_per_s") if isinstance(floor64, dict) else None
    fused_tput = fused64.throughput_per_s if fused64 else None
    vs_fastapi = _div(fused_tput, fast64.throughput_per_s if fast64 else None)
    fastapi_rounds = round_spread(results, FASTAPI_RATIO) if results.rounds else None
    fastapi_detail = (
        f"against FastAPI window JSON: {fastapi_rounds.describe()}"
        if fastapi_rounds is not None
        else (f"against FastAPI window JSON: {vs_fastapi:.2f}x" if vs_fastapi is not None else "")
    )
    floor_detail = (
        f"no-work floor: {floor_tput:,.0f} windows/s"
        if floor_tput
        else (f"no-work floor: {floor64}" if floor64 else "")  # why it failed
    )
    small_limit = results.limits.get("small")
    alone_p50 = small_limit.single.p50_ms if small_limit else None
    fused1_p50 = fused1.p50_ms if fused1 else None
    over_floor = (
        fused1_p50 - floor1_p50 if fused1_p50 is not None and floor1_p50 is not None else None
    )
    c1_detail = "; ".join(
        part
        for part in (
            f"p50 {fused1_p50:.2f} ms" if fused1_p50 is not None else "",
            f"no-work floor p50 {floor1_p50:.2f} ms" if floor1_p50 is not None else "",
            f"in process (1 thread, no serving) {alone_p50:.2f} ms" if alone_p50 else "",
        )
        if part
    )
    in_process = []
    for size, goal in IN_PROCESS_P50_MS.items():
        stats = results.limits.get(size)
        in_process.append(
            Target(
                f"{size}, in process, 1 thread: p50",
                FUSED_MODEL,
                stats.single.p50_ms if stats else None,
                goal,
                True,
                " ms",
                "the library with no serving (`perf.limit`); stage by stage: "
                "`python -m perf.window_cost`",
            )
        )
    return [
        *in_process,
        Target(
            "small, gRPC, c=64: throughput / no-work floor",
            FUSED_MODEL,
            *_over_rounds(
                results,
                FLOOR_RATIO,
                _div(fused_tput, floor_tput),
                FLOOR_THROUGHPUT_SHARE,
                "; ".join(part for part in (floor_detail, fastapi_detail) if part),
            ),
        ),
        Target(
            "small, gRPC, c=1: p50 over the no-work floor's",
            FUSED_MODEL,
            *_gap_over_rounds(results, over_floor, c1_detail),
        ),
    ]


def _gap_over_rounds(
    results: BenchResults, single: float | None, detail: str
) -> tuple[float | None, float, bool, str, str]:
    """(measured, limit, at_most, unit, detail) of the c=1 gap over the floor: the median over
    the run's alternating rounds where they measured both sides, else the sweep's c=1 level
    against the floor phase's, said so in the detail."""
    gap = next(g for g in ROUND_GAPS if g.name == FLOOR_C1_GAP)
    found = round_gap(results.rounds, gap.minuend, gap.subtrahend)
    if found is None:
        note = "the sweep's c=1 level and the floor's (not in the alternating rounds)"
        parts = (note if single is not None else "", detail)
        return single, FLOOR_C1_EXTRA_MS, True, " ms", "; ".join(p for p in parts if p)
    sweep = f"the sweep's c=1 level: {single:.2f} ms" if single is not None else ""
    text = "; ".join(p for p in (found.describe(), sweep, detail) if p)
    return found.median, FLOOR_C1_EXTRA_MS, True, " ms", text


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


def storm_checks(results: BenchResults) -> list[Target]:
    """The closed-loop storms (`perf.overload.BENCH_RUNS`): robustness checks reported apart
    from the targets (the server stays up, refuses rather than queues, serves level 1 and
    the next request), each beside the no-work floor under the same runs."""
    fig = OverloadFigures.of(results.overload)
    floor_overload = results.floor.get("overload")
    bare = OverloadFigures.of(floor_overload if isinstance(floor_overload, dict) else {})
    return [
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
        note = (
            "one level of the sweep (not in the alternating rounds)" if single is not None else ""
        )
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
    """Today's targets, all `dispatch_fused`'s: the library in process and against the
    no-work floor (`goal_targets`), single windows against FastAPI and in process, and the
    open-loop overload (`perf.serving_targets`); then the closed-loop storms, robustness
    checks reported apart (`storm_checks`)."""
    return [
        *goal_targets(results),
        *single_window_targets(results),
        *open_loop_targets(results),
        *storm_checks(results),
    ]


def summary(results: BenchResults) -> dict[str, Any]:
    """`summary.json`: the results with their ratios and targets."""
    return results.to_dict(
        ratios=[ratio.to_dict() for ratio in compute_ratios(results)],
        targets=[target.to_dict() for target in compute_targets(results)],
    )
