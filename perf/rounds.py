"""Ratios that hold: the small-window comparisons repeated in alternating rounds.

One slow minute of a shared host must not decide a target, so `make bench` measures what the
c=64 and c=1 targets compare in rounds, one after the other inside each round (`ROUND_ORDER`:
dispatch_fused at c=64, the no-work floor at c=64, FastAPI, the dispatch ensemble, the
in-process limit, then dispatch_fused's and the floor's c=1 p50; the entries a run
measures), `MIN_ROUNDS` rounds at least. Each round gives one value of each comparison (both
sides measured minutes apart at most): a throughput ratio (`ROUND_RATIOS`) or a latency gap
(`ROUND_GAPS`); the report shows the median over the rounds and the spread (min-max).

Pure except `run_rounds`, which calls the measurements it is given.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "FASTAPI_RATIO",
    "FLOOR",
    "FLOOR_C1",
    "FLOOR_C1_EXTRA_MS",
    "FLOOR_C1_GAP",
    "FLOOR_RATIO",
    "FLOOR_THROUGHPUT_SHARE",
    "FUSED_C1",
    "LATENCY_ENTRIES",
    "LIMIT",
    "MIN_ROUNDS",
    "ROUND_GAPS",
    "ROUND_ORDER",
    "ROUND_RATIOS",
    "RoundGap",
    "RoundRatio",
    "Spread",
    "round_gap",
    "round_ratio",
    "run_rounds",
    "spread",
]

LIMIT: Final = "limit"  # the in-process limit (2 worker processes), beside the series keys
FLOOR: Final = "floor"  # the no-work floor of the contract (`perf.floor`), likewise
FUSED_C1: Final = "fused_grpc_c1"  # dispatch_fused over gRPC at c=1: its p50 in ms
FLOOR_C1: Final = "floor_c1"  # the no-work floor over gRPC at c=1: its p50 in ms
# Within a round, in this order (series keys of perf.results, FLOOR and LIMIT: windows/s at
# c=64; FUSED_C1 and FLOOR_C1: p50 ms at c=1).
ROUND_ORDER: Final = ("fused_grpc", FLOOR, "fastapi_json", "grpc", LIMIT, FUSED_C1, FLOOR_C1)
LATENCY_ENTRIES: Final = frozenset({FUSED_C1, FLOOR_C1})  # the entries in ms, not windows/s
MIN_ROUNDS: Final = 5

# Today's goals against the floor: small c=64 dispatch_fused windows/s at least this share of
# the floor's (at 0.8 of it dispatch_fused is >= 3x FastAPI), and small c=1 p50 at most the
# floor's plus this many ms.
FLOOR_THROUGHPUT_SHARE: Final = 0.8
FLOOR_C1_EXTRA_MS: Final = 0.3

Round = Mapping[str, float | None]  # entry -> its figure in that round (None: failed)


@dataclass(frozen=True)
class RoundRatio:
    name: str
    numerator: str
    denominator: str
    goal: float  # the median must be at least this


FLOOR_RATIO: Final = "dispatch_fused / no-work floor"
FASTAPI_RATIO: Final = "dispatch_fused / FastAPI"
ROUND_RATIOS: Final = (
    RoundRatio(FLOOR_RATIO, "fused_grpc", FLOOR, FLOOR_THROUGHPUT_SHARE),
    RoundRatio(FASTAPI_RATIO, "fused_grpc", "fastapi_json", 3.0),
)


@dataclass(frozen=True)
class RoundGap:
    name: str
    minuend: str
    subtrahend: str
    goal_ms: float  # the median must be at most this


FLOOR_C1_GAP: Final = "dispatch_fused c=1 p50 - no-work floor c=1 p50"
ROUND_GAPS: Final = (RoundGap(FLOOR_C1_GAP, FUSED_C1, FLOOR_C1, FLOOR_C1_EXTRA_MS),)


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    count: int

    def describe(self, digits: int = 2) -> str:
        return (
            f"median {self.median:.{digits}f} over {self.count} rounds "
            f"(min-max {self.low:.{digits}f}-{self.high:.{digits}f})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "low": self.low, "high": self.high, "count": self.count}


def spread(values: Sequence[float | None]) -> Spread | None:
    """Median and min-max of the values present; None when there are none."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return None
    return Spread(statistics.median(present), min(present), max(present), len(present))


def round_ratio(rounds: Sequence[Round], numerator: str, denominator: str) -> Spread | None:
    """The ratio numerator/denominator within each round (rounds missing either side or with
    a zero denominator left out), summarised by `spread`."""
    return _within_rounds(rounds, numerator, denominator, lambda a, b: a / b if b else None)


def round_gap(rounds: Sequence[Round], minuend: str, subtrahend: str) -> Spread | None:
    """The difference minuend - subtrahend within each round (rounds missing either side left
    out), summarised by `spread`."""
    return _within_rounds(rounds, minuend, subtrahend, lambda a, b: a - b)


def _within_rounds(
    rounds: Sequence[Round],
    left: str,
    right: str,
    combine: Callable[[float, float], float | None],
) -> Spread | None:
    """``combine`` of the two entries within each round that measured both."""
    values: list[float | None] = []
    for measured in rounds:
        a, b = measured.get(left), measured.get(right)
        values.append(combine(a, b) if a is not None and b is not None else None)
    return spread(values)


def run_rounds(
    count: int,
    measure: Mapping[str, Callable[[], float | None]],
    say: Callable[[str], None] = print,
    keep_going: Callable[[], bool] = lambda: True,
) -> list[dict[str, float | None]]:
    """`count` rounds of every entry of `ROUND_ORDER` that `measure` has, in that order;
    a measurement that raises counts as None for that round. Stops early (fewer rounds)
    when `keep_going` says so."""
    rounds: list[dict[str, float | None]] = []
    for number in range(1, count + 1):
        if not keep_going():
            break
        measured: dict[str, float | None] = {}
        for entry in ROUND_ORDER:
            if entry not in measure:
                continue
            say(f"round {number}/{count}: {entry}")
            try:
                measured[entry] = measure[entry]()
            except Exception as exc:  # one level's surprise must not end the rounds
                say(f"round {number}: {entry} failed: {type(exc).__name__}: {exc}")
                measured[entry] = None
        rounds.append(measured)
    return rounds
