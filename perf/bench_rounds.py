"""`make bench`'s alternating rounds, served: the small-window comparisons of `perf.rounds`
measured against one tritonserver and one FastAPI service, both up for every round.

The tritonserver serves the bench's repository with the no-work floor added (`perf.floor`), so
that the floor is measured the same way as `dispatch_fused`, minutes from it, on the same
server; its two idle stubs cost the other entries nothing measurable. At c=64 each of the two
also gives the CPU a window cost the server's process and the model's stubs
(`perf.server_cpu`): the floor's is what serving costs, dispatch_fused's over it what the
library costs served.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from perf import limit
from perf.floor import FLOOR_MODEL, floor_job, floor_repository
from perf.levels import load_level, pa_level
from perf.results import FUSED_MODEL, BenchResults
from perf.rounds import FLOOR, FLOOR_C1, FUSED_C1, LIMIT, run_rounds
from perf.server_cpu import cpu_by_part, served
from perf.sessions import FastApiSession, TritonSession
from perf.stats import LevelStats, request_budget
from perf.workload import Workload

__all__ = ["CPU_ENTRIES", "Rounds", "RoundsPlan", "alternating_rounds"]

C64 = 64  # the c=64 comparisons' concurrency (perf.targets.TARGET_CONCURRENCY)
# The c=64 entries whose CPU per window is split, with the model each measures.
CPU_ENTRIES: Final = {"fused_grpc": FUSED_MODEL, FLOOR: FLOOR_MODEL}


@dataclass(frozen=True)
class RoundsPlan:
    rounds: int
    round_seconds: float  # each level about this long


@dataclass
class Rounds:
    """Per round, each entry's figure (`perf.rounds.run_rounds`); per `CPU_ENTRIES` entry,
    each round's CPU milliseconds per window by part (`perf.server_cpu.cpu_by_part`)."""

    figures: list[dict[str, float | None]] = field(default_factory=list)
    cpu: dict[str, list[dict[str, float]]] = field(default_factory=dict)


def alternating_rounds(
    plan: RoundsPlan,
    *,
    repository: Path,
    workload: Workload,
    sweep: BenchResults,
    out: Path,
    say: Callable[[str], None],
) -> Rounds:
    """`plan.rounds` rounds of every entry of `perf.rounds.ROUND_ORDER` on small windows;
    `sweep` (the bench's results so far) sizes each level's first request count."""
    with (
        tempfile.TemporaryDirectory(prefix="dispatch-rounds-") as scratch,
        TritonSession(
            floor_repository(Path(scratch) / "repo", repository), out / "tritonserver-rounds.log"
        ) as triton,
        FastApiSession(repository, out / "fastapi-rounds.log") as fastapi,
    ):
        levels = _Levels(plan, workload, sweep, out / "rounds", say)
        measures: dict[str, Callable[[], float | None]] = {
            "fused_grpc": lambda: _throughput(levels.triton(triton, "fused_grpc", C64)),
            FLOOR: lambda: _throughput(levels.floor(triton, C64)),
            "fastapi_json": lambda: _throughput(levels.fastapi(fastapi)),
            "grpc": lambda: _throughput(levels.triton(triton, "grpc", C64)),
            LIMIT: lambda: limit.multi_process_rates(
                ["small"], 5000, plan.round_seconds, repository=repository
            )["small"],
            FUSED_C1: lambda: _p50(levels.triton(triton, "fused_grpc", 1)),
            FLOOR_C1: lambda: _p50(levels.floor(triton, 1)),
        }
        # A round that has not started this long after the servers are up is dropped.
        hard_stop = time.monotonic() + plan.rounds * max(60.0, 15 * plan.round_seconds)
        figures = run_rounds(plan.rounds, measures, say, lambda: time.monotonic() < hard_stop)
        return Rounds(figures, levels.cpu)


def _throughput(row: LevelStats | None) -> float | None:
    return row.throughput_per_s if row else None


def _p50(row: LevelStats | None) -> float | None:
    return row.p50_ms if row else None


class _Levels:
    """One level of an entry at a time; each level's last windows/s sizes its next request
    count (the first: the sweep's figure at that level, or a guess from it)."""

    def __init__(
        self,
        plan: RoundsPlan,
        workload: Workload,
        sweep: BenchResults,
        out: Path,
        say: Callable[[str], None],
    ) -> None:
        self.plan, self.workload, self.sweep, self.out, self.say = plan, workload, sweep, out, say
        self.rates: dict[tuple[str, int], float] = {}
        self.folders = itertools.count(1)
        self.cpu: dict[str, list[dict[str, float]]] = {}

    @contextmanager
    def cpu_watched(self, session: TritonSession, entry: str, concurrency: int) -> Iterator[None]:
        """Around one level: the CPU per answered window of each part, where it is asked."""
        model = CPU_ENTRIES.get(entry)
        if model is None or concurrency != C64:
            yield
            return
        server = session.server
        models = tuple(CPU_ENTRIES.values())
        before, answered = cpu_by_part(server, models), served(server, model)
        yield
        windows = served(server, model) - answered
        if windows > 0:
            after = cpu_by_part(server, models)
            used = {part: 1000 * (after[part] - before[part]) / windows for part in after}
            self.cpu.setdefault(entry, []).append(used)

    def triton(self, session: TritonSession, entry: str, concurrency: int) -> LevelStats | None:
        with self.cpu_watched(session, entry, concurrency):
            row, failure, _ = pa_level(
                session.pa, session.endpoints, entry, self.workload, concurrency,
                request_count=self._requests(entry, concurrency),
                out=self._folder(entry, concurrency), timeout_s=self._timeout_s(),
            )  # fmt: skip
        return self._measured((entry, concurrency), row, failure)

    def floor(self, session: TritonSession, concurrency: int) -> LevelStats | None:
        # no work is faster than dispatch_fused's: twice its rate sizes the first level
        first = 2 * self.rates.get(("fused_grpc", concurrency), self._sweep_rate("fused_grpc", 1))
        rate = self.rates.setdefault((FLOOR, concurrency), first)
        folder = self._folder(FLOOR, concurrency)
        job = floor_job(
            session.endpoints.grpc, self.workload.input_data, concurrency,
            request_count=request_budget(rate, self.plan.round_seconds, concurrency),
            csv_path=folder / f"floor_c{concurrency}.csv",
        )  # fmt: skip
        with self.cpu_watched(session, FLOOR, concurrency):
            outcome = session.pa.run(job, self._timeout_s())
        row = outcome.rows[0] if outcome.ok else None
        return self._measured((FLOOR, concurrency), row, outcome.log_tail[-300:])

    def fastapi(self, session: FastApiSession) -> LevelStats | None:
        row, failure = load_level(
            session.base + "/dispatch", self.workload.bodies["fastapi_json"], C64,
            self._requests("fastapi_json", C64), cap_s=3 * self.plan.round_seconds,
        )  # fmt: skip
        return self._measured(("fastapi_json", C64), row, failure)

    def _requests(self, entry: str, concurrency: int) -> int:
        rate = self.rates.setdefault((entry, concurrency), self._sweep_rate(entry, concurrency))
        return request_budget(rate, self.plan.round_seconds, concurrency)

    def _sweep_rate(self, entry: str, concurrency: int) -> float:
        """The sweep's windows/s at this level, else at its first level, else a guess."""
        found = self.sweep.find(entry, "small")
        row = (found.at(concurrency) or (found.rows[0] if found.rows else None)) if found else None
        if row is not None:
            return row.throughput_per_s
        stats = self.sweep.limits.get("small")  # served, about 0.4x the library's own rate
        return stats.single.throughput_per_s * 0.4 if stats else 20.0

    def _measured(
        self, level: tuple[str, int], row: LevelStats | None, failure: str
    ) -> LevelStats | None:
        if row is None:
            self.say(f"rounds: {level[0]} c={level[1]} failed: {failure}")
        else:
            self.rates[level] = row.throughput_per_s
        return row

    def _folder(self, entry: str, concurrency: int) -> Path:
        folder = self.out / f"{next(self.folders):02d}-{entry}-c{concurrency}"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def _timeout_s(self) -> float:
        return max(60.0, 20 * self.plan.round_seconds)
