"""The report's serving sections: alternating rounds, open-loop overload on separate cores,
and the closed-loop storms (robustness checks, not targets).

Pure: renders a `perf.results.BenchResults`; `perf.report` places these sections.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perf.bench_rounds import CPU_ENTRIES
from perf.results import BenchResults
from perf.rounds import (
    FLOOR,
    FLOOR_C1,
    FUSED_C1,
    LATENCY_ENTRIES,
    LIMIT,
    ROUND_GAPS,
    ROUND_ORDER,
    ROUND_RATIOS,
    Spread,
    round_gap,
    round_ratio,
    spread,
)
from perf.server_cpu import OTHER_STUBS, TRITONSERVER
from perf.target import Target

__all__ = [
    "format_number",
    "markdown_table",
    "open_loop_section",
    "robustness_section",
    "rounds_section",
    "verdict",
]

_ROUND_LABELS = {
    "fused_grpc": "dispatch_fused gRPC (perf_analyzer)",
    FLOOR: "no-work floor gRPC (perf_analyzer)",
    "fastapi_json": "FastAPI window JSON (perf.loadgen)",
    "grpc": "dispatch gRPC (perf_analyzer)",
    LIMIT: "in-process limit (2 processes)",
    FUSED_C1: "dispatch_fused gRPC c=1 p50 ms",
    FLOOR_C1: "no-work floor gRPC c=1 p50 ms",
}


def format_number(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def verdict(target: Target) -> str:
    if target.invalid:
        return f"**INVALID** ({target.invalid})"
    return {True: "met", False: "**not met**", None: "not measured"}[target.met]


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], align: str = ""
) -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    marks = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def rounds_section(results: BenchResults) -> list[str]:
    """Each round's figures and the median comparisons with their spread."""
    if not results.rounds:
        return []
    entries = [e for e in ROUND_ORDER if any(e in r for r in results.rounds)]
    lines = [
        "",
        "## Alternating rounds (small windows: windows/s at c=64, p50 at c=1)",
        "",
        "The small-window comparisons repeated in rounds, each round measuring every entry once "
        "in this order, so a slow minute of the host falls on all of them. Each ratio and gap "
        "is taken within a round; the targets read the median over the rounds.",
        "",
    ]
    digits = {e: 2 if e in LATENCY_ENTRIES else 1 for e in entries}
    lines += markdown_table(
        ["round", *(_ROUND_LABELS.get(e, e) for e in entries)],
        [
            [str(number), *(format_number(measured.get(e), digits[e]) for e in entries)]
            for number, measured in enumerate(results.rounds, 1)
        ],
    )
    lines += [""]
    rows = []
    for ratio in ROUND_RATIOS:
        found = round_ratio(results.rounds, ratio.numerator, ratio.denominator)
        rows.append(_round_row(ratio.name, found, f">= {ratio.goal:g}x"))
    for gap in ROUND_GAPS:
        found = round_gap(results.rounds, gap.minuend, gap.subtrahend)
        rows.append(_round_row(gap.name, found, f"<= {gap.goal_ms:g} ms"))
    lines += markdown_table(["comparison", "median", "min-max", "rounds", "goal"], rows)
    return lines + _served_cpu_lines(results)


def _served_cpu_lines(results: BenchResults) -> list[str]:
    """The c=64 rounds' CPU per window, split between the server and the model's stubs."""
    if not results.served_cpu:
        return []
    rows = []
    for entry, rounds in results.served_cpu.items():
        model = CPU_ENTRIES.get(entry, entry)

        def median(*parts: str, measured: list[dict[str, float]] = rounds) -> float | None:
            found = spread([sum(r.get(p, 0.0) for p in parts) for r in measured])
            return found.median if found else None

        rows.append(
            [
                _ROUND_LABELS.get(entry, entry),
                format_number(median(TRITONSERVER), 3),
                format_number(median(model), 3),
                format_number(median(OTHER_STUBS), 3),
                format_number(median(TRITONSERVER, model, OTHER_STUBS), 3),
                str(len(rounds)),
            ]
        )
    return [
        "",
        "CPU per answered window at c=64, from the server's process tree (median over the "
        "rounds, ms): the floor's is what serving a window costs; dispatch_fused's above it, "
        "what the library costs served. perf_analyzer's own CPU is not in it.",
        "",
        *markdown_table(
            ["c=64 level", "tritonserver", "the model's stubs", "other stubs", "total", "rounds"],
            rows,
        ),
    ]


def _round_row(name: str, found: Spread | None, goal: str) -> list[str]:
    return [
        name,
        format_number(found.median if found else None),
        f"{found.low:.2f}-{found.high:.2f}" if found else "n/a",
        str(found.count if found else 0),
        goal,
    ]


def _burst_row(label: str, burst: dict[str, Any]) -> list[str]:
    generator, probe = burst.get("generator", {}), burst.get("probe", {})
    valid = "VALID" if generator.get("valid") else "**INVALID**"
    recovery = burst.get("recovery_s")
    return [
        label,
        format_number(burst.get("rate_per_s"), 0),
        str(generator.get("sent", 0)),
        str(generator.get("accepted", 0)),
        str(generator.get("refused", 0)),
        format_number(generator.get("accepted_p99_ms"), 1),
        format_number(generator.get("refusal_p99_ms"), 1),
        f"{format_number(generator.get('send_lag_p50_ms'))} / "
        f"{format_number(generator.get('send_lag_p99_ms'))} ({valid})",
        f"L{burst.get('probe_level', '?')} {burst.get('probe_model', '')}: "
        f"{probe.get('accepted', 0)} / {probe.get('refused', 0)}",
        format_number(probe.get("accepted_p99_ms"), 1),
        format_number(probe.get("queue_full_refusal_p99_ms"), 1),
        format_number(recovery) if recovery is not None else "not recovered",
    ]


def open_loop_section(results: BenchResults) -> list[str]:
    """The open-loop bursts: generator, schedule check, probe and recovery, per burst."""
    figures = results.open_loop
    if not figures:
        return []
    capacity = figures.get("capacity", {})
    unloaded = figures.get("unloaded", {})
    lines = [
        "",
        f"## Open-loop overload (`{figures.get('model', '?')}`, server and load on separate cores)",
        "",
        f"Cores: {figures.get('cores', 'n/a')}. Capacity: the closed loop at "
        f"c={capacity.get('concurrency', 64)} accepted "
        f"{format_number(capacity.get('accepted_per_s'), 0)} windows/s "
        f"(p99 {format_number(capacity.get('accepted_p99_ms'), 1)} ms); queue timeout at "
        f"level 2: {format_number(figures.get('queue_timeout_ms'), 0)} ms. Each burst lasts "
        f"{figures.get('seconds', '?')} s at a fixed arrival rate (open loop, latency from the "
        "send); the probe (its own process, 20 windows/s, one at a time) keeps watching "
        f"{figures.get('tail_s', '?')} s after it. A burst whose send-lag p99 exceeds 5 ms is "
        "INVALID: the generator, not the server, set its pace.",
        "",
        "Probes alone (unloaded): "
        + "; ".join(
            f"level {key.removeprefix('probe_level_')[:1]} on {found.get('model', '?')} p50 "
            f"{format_number(found.get('accepted_p50_ms'))} ms, p99 "
            f"{format_number(found.get('accepted_p99_ms'))} ms"
            for key, found in sorted(unloaded.items())
        )
        + ".",
        "",
    ]
    if figures.get("error"):
        lines += [f"Not run: {figures['error']}.", ""]
    names = {
        "1.5x": "1.5x, level 2",
        "3x": "3x, level 2",
        "priority": "1.5x bulk, level-1 probe",
        "priority_same_model": "1.5x bulk, level-1 probe on the bulk's model",
    }
    lines += markdown_table(
        [
            "burst", "rate/s", "sent", "accepted", "refused", "accepted p99 ms",
            "refusal p99 ms", "send lag p50 / p99 ms", "probe accepted / refused",
            "probe p99 ms", "probe refusal p99 ms", "recovery s",
        ],
        [_burst_row(names.get(k, k), b) for k, b in figures.get("bursts", {}).items()],
        "lrrrrrrlrrrr",
    )  # fmt: skip
    return lines


def robustness_section(targets: Sequence[Target]) -> list[str]:
    """The closed-loop storms: a robustness test (the server stays up and answers the next
    request), reported with the goals they once had, but not targets."""
    rows = [t for t in targets if t.robustness]
    if not rows:
        return []
    lines = [
        "",
        "## Closed-loop storms (robustness, not targets)",
        "",
        "512 callers sending again as soon as answered or refused, on the server's own cores: "
        "a storm the host turns into refusals whatever the model does. Kept as a robustness "
        "test; the targets are the open-loop ones above.",
        "",
    ]
    lines += markdown_table(
        ["check", "model", "goal", "measured", "verdict", "detail"],
        [
            [
                t.name,
                f"`{t.model}`",
                t.goal,
                format_number(t.measured) + (t.unit if t.measured is not None else ""),
                verdict(t),
                t.detail,
            ]
            for t in rows
        ],
        "lllrll",
    )
    return lines
