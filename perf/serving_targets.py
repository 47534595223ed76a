"""The serving targets: open-loop overload on separate cores, ratios over alternating
rounds, and single windows against the in-process pipeline and FastAPI.

Pure: reads a `perf.results.BenchResults` (its `open_loop`, `rounds`, series and limits).
Every figure here is `dispatch_fused`'s, the model these targets are set for.
"""

from __future__ import annotations

from typing import Any, Final

from perf.results import FUSED_MODEL, BenchResults, entry_key
from perf.rounds import ROUND_RATIOS, Spread, round_ratio
from perf.target import Target, at_level, divide

__all__ = [
    "LEVEL_1_FACTOR",
    "RECOVERY_S",
    "REFUSAL_P99_MS",
    "open_loop_targets",
    "round_spread",
    "single_window_targets",
]

REFUSAL_P99_MS: Final = 10.0
RECOVERY_S: Final = 1.0
LEVEL_1_FACTOR: Final = 3.0  # level-1 p99 under bulk at most this times its unloaded p99


def round_spread(results: BenchResults, name: str) -> Spread | None:
    """The median and spread of one of `perf.rounds.ROUND_RATIOS` over this run's rounds."""
    ratio = next((r for r in ROUND_RATIOS if r.name == name), None)
    if ratio is None:
        raise KeyError(name)
    return round_ratio(results.rounds, ratio.numerator, ratio.denominator)


def _burst(open_loop: dict[str, Any], key: str) -> dict[str, Any]:
    bursts = open_loop.get("bursts")
    found = bursts.get(key) if isinstance(bursts, dict) else None
    return found if isinstance(found, dict) else {}


def _invalid(burst: dict[str, Any]) -> str:
    generator = burst.get("generator", {})
    if not burst or generator.get("valid", True):
        return ""
    lag = generator.get("send_lag_p99_ms")
    return f"generator fell behind: send-lag p99 {lag:.1f} ms > {generator['lag_limit_ms']:g} ms"


def _counts(figures: dict[str, Any]) -> str:
    if not figures:
        return "not run"
    reasons = ", ".join(f"{k} {v}" for k, v in figures.get("refusal_reasons", {}).items())
    return f"{figures.get('accepted', 0):,} accepted, {figures.get('refused', 0):,} refused" + (
        f" ({reasons})" if reasons else ""
    )


def _lag(burst: dict[str, Any]) -> str:
    generator = burst.get("generator", {})
    p50, p99 = generator.get("send_lag_p50_ms"), generator.get("send_lag_p99_ms")
    if p99 is None:
        return ""
    return f"; send lag p50 {p50:.2f} ms, p99 {p99:.2f} ms"


def _refusal(burst: dict[str, Any], label: str) -> Target:
    probe = burst.get("probe", {})
    measured = probe.get("queue_full_refusal_p99_ms")
    detail = f"the level-2 probe: {_counts(probe)}"
    if probe and measured is None:
        detail += " (never refused for a full queue: nothing to time)"
    generator = burst.get("generator", {}).get("queue_full_refusal_p99_ms")
    if generator is not None:
        detail += f"; the generator's own: {generator:.1f} ms"
    return Target(
        f"open loop {label}: refusal p99 at the probe",
        FUSED_MODEL,
        measured,
        REFUSAL_P99_MS,
        True,
        " ms",
        detail + _lag(burst),
        invalid=_invalid(burst),
    )


def _recovery(burst: dict[str, Any], label: str, tail_s: float) -> Target:
    recovery = burst.get("recovery_s")
    detail = (
        f"first probe answer in normal time (<= {burst['normal_ms']:.1f} ms) after the burst"
        if burst.get("normal_ms") is not None
        else ""
    )
    if burst and recovery is None:  # not seen while the probe watched: at least that long
        recovery = tail_s
        detail = f"not recovered in the {tail_s:g} s the probe watched after the burst"
    return Target(
        f"open loop {label}: recovery after the burst",
        FUSED_MODEL,
        recovery,
        RECOVERY_S,
        True,
        " s",
        detail,
        invalid=_invalid(burst),
    )


def _accepted(open_loop: dict[str, Any], burst: dict[str, Any], label: str) -> Target:
    timeout = open_loop.get("queue_timeout_ms")
    reference = open_loop.get("capacity", {}).get("accepted_p99_ms")
    bound = timeout + reference if timeout is not None and reference is not None else None
    generator = burst.get("generator", {})
    probe = burst.get("probe", {}).get("accepted_p99_ms")
    measured = generator.get("accepted_p99_ms") if bound is not None else None
    detail = (
        f"goal: queue timeout {timeout:,.0f} ms + c=64 p99 {reference:,.1f} ms; "
        if bound is not None
        else ""
    ) + f"generator: {_counts(generator)}"
    if probe is not None:
        detail += f"; the probe's accepted p99: {probe:,.1f} ms"
    return Target(
        f"open loop {label}: accepted p99",
        FUSED_MODEL,
        measured,
        bound if bound is not None else 0.0,
        True,
        " ms",
        detail,
        invalid=_invalid(burst),
    )


def _level_1(open_loop: dict[str, Any]) -> list[Target]:
    """Level 1 where a client sends it (the priority lane, `perf.overload_bench`) under
    level-2 bulk sent to dispatch_fused."""
    burst = _burst(open_loop, "priority")
    probe = burst.get("probe", {})
    model = burst.get("probe_model", FUSED_MODEL)
    unloaded = open_loop.get("unloaded", {}).get("probe_level_1", {}).get("accepted_p99_ms")
    p99 = probe.get("accepted_p99_ms")
    ratio = divide(p99, unloaded)
    return [
        Target(
            "level 1 under level-2 open-loop bulk at 1.5x: refused",
            model,
            float(probe["refused"]) if "refused" in probe else None,
            0.0,
            True,
            "",
            f"the level-1 probe: {_counts(probe)}; bulk ({FUSED_MODEL}): "
            f"{_counts(burst.get('generator', {}))}",
            invalid=_invalid(burst),
        ),
        Target(
            "level 1 under level-2 open-loop bulk at 1.5x: p99 / unloaded p99",
            model,
            ratio,
            LEVEL_1_FACTOR,
            True,
            "x",
            f"p99 {p99:.1f} ms, unloaded {unloaded:.1f} ms" if ratio is not None else "",
            invalid=_invalid(burst),
        ),
    ]


def open_loop_targets(results: BenchResults) -> list[Target]:
    """Open loop at 1.5x and 3x the c=64 capacity, server and load on separate cores."""
    figures = results.open_loop
    tail_s = float(figures.get("tail_s", 0.0))
    one_half, triple = _burst(figures, "1.5x"), _burst(figures, "3x")
    return [
        _refusal(one_half, "1.5x"),
        _accepted(figures, one_half, "1.5x"),
        _recovery(one_half, "1.5x", tail_s),
        _refusal(triple, "3x"),
        _recovery(triple, "3x", tail_s),
        *_level_1(figures),
    ]


def single_window_targets(results: BenchResults) -> list[Target]:
    """One window at a time (c=1): dispatch_fused over gRPC against FastAPI with base64
    arrays (the binary form on both sides) and against the same pipeline in process."""
    grpc = entry_key("grpc", FUSED_MODEL)
    small, large = at_level(results, grpc, "small", 1), at_level(results, grpc, "large", 1)
    arrays_small = at_level(results, "fastapi_arrays", "small", 1)
    arrays_large = at_level(results, "fastapi_arrays", "large", 1)
    limit_large = results.limits.get("large")
    floor = results.floor.get("c1")
    floor_p50 = floor.get("p50_ms") if isinstance(floor, dict) else None

    def p50(row: Any) -> float | None:
        return None if row is None else float(row.p50_ms)

    def both(ours: Any, theirs: float | None, what: str) -> str:
        if ours is None or theirs is None:
            return ""
        return f"p50 {ours.p50_ms:.2f} ms against {theirs:.2f} ms {what}"

    in_process = limit_large.single.p50_ms if limit_large else None
    return [
        Target(
            "small, c=1: gRPC p50 / FastAPI base64 arrays p50",
            FUSED_MODEL,
            divide(p50(small), p50(arrays_small)),
            1.0,
            True,
            "x",
            "; ".join(
                part
                for part in (
                    both(small, p50(arrays_small), "(FastAPI, arrays)"),
                    f"the no-work floor p50: {floor_p50:.2f} ms" if floor_p50 is not None else "",
                )
                if part
            ),
        ),
        Target(
            "large, c=1: gRPC p50 / in-process p50",
            FUSED_MODEL,
            divide(p50(large), in_process),
            1.1,
            True,
            "x",
            both(large, in_process, "(in process, 1 thread)"),
        ),
        Target(
            "large, c=1: gRPC p50 / FastAPI base64 arrays p50",
            FUSED_MODEL,
            divide(p50(large), p50(arrays_large)),
            1.0,
            True,
            "x",
            both(large, p50(arrays_large), "(FastAPI, arrays); goal: below it"),
        ),
    ]
