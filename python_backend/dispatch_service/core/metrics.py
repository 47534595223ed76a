"""The project's own Prometheus metrics: what they are and how a request is turned into them.

Triton already counts requests, queue and compute time per model; these add what only the
library knows. Computing an observation is a plain function of a step's outputs
(`pipeline.step_metrics`, unit tested without Triton); recording goes to a `MetricsSink`:

- `serving.triton_metrics.TritonMetrics` over `pb_utils.MetricFamily`, so the values appear
  on Triton's metrics port next to its own `nv_*` metrics;
- `InMemoryMetrics` for tests and in-process runs, `NullMetrics` to record nothing;
- `BackgroundMetrics` in front of another sink, to record off the request path.

Every recorded value is one IPC call from the Python-backend stub to the server (about
20 us), so a request records a handful of values, never one per order or pair, and under
load the histograms keep a uniform sample of at most `HISTOGRAM_SAMPLES_PER_FLUSH` values per
series per flush (`BackgroundMetrics`): counters stay exact, histogram quantiles unbiased.

| metric | kind | labels (besides model, version) | one observation per |
| --- | --- | --- | --- |
| dispatch_encoder_latency_ms | histogram | | window the encoder answered |
| dispatch_resolver_latency_ms | histogram | | window the resolver answered |
| dispatch_candidates_per_order | histogram | | window: its mean feasible candidates per order |
| dispatch_capacity_conflicts_total | counter | | order not given its top-1 rider |
| dispatch_validation_rejections_total | counter | tensor, rule | rejected request |
| dispatch_decision_records_total | counter | result | order's decision record (`outcomes.writer`) |
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final, Protocol

from numpy.typing import NDArray

from dispatch_service.core.errors import DispatchInputError

__all__ = [
    "ALL_METRICS",
    "CANDIDATES_PER_ORDER",
    "CANDIDATE_BUCKETS",
    "CAPACITY_CONFLICTS",
    "CONSTANT_LABELS",
    "DECISION_RECORDS",
    "ENCODER_LATENCY",
    "FLUSH_INTERVAL_S",
    "HISTOGRAM_SAMPLES_PER_FLUSH",
    "LATENCY_BUCKETS_MS",
    "RESOLVER_LATENCY",
    "VALIDATION_REJECTIONS",
    "BackgroundMetrics",
    "InMemoryMetrics",
    "MetricKind",
    "MetricSpec",
    "MetricsSink",
    "NullMetrics",
    "Observation",
    "StepObserver",
    "coalesce_counters",
    "rejection_observation",
    "sample_histograms",
]


class MetricKind(Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class MetricSpec:
    """One metric family: its Prometheus name, meaning and variable label names."""

    name: str
    kind: MetricKind
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if (self.kind is MetricKind.HISTOGRAM) != bool(self.buckets):
            raise ValueError(f"{self.name}: buckets go with histograms, and only with them")
        if list(self.buckets) != sorted(set(self.buckets)):
            raise ValueError(f"{self.name}: buckets must be strictly increasing")


# Latency of a Python step, milliseconds: sub-ms for tiny windows to ~1 s for the largest.
LATENCY_BUCKETS_MS: Final = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)
# Feasible candidates per order: 0 up to the contract's MAX_CANDIDATES (32).
CANDIDATE_BUCKETS: Final = (0.0, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0)

ENCODER_LATENCY: Final = MetricSpec(
    "dispatch_encoder_latency_ms",
    MetricKind.HISTOGRAM,
    "feature_encoder time per answered window (validation, candidates, pair features), ms",
    buckets=LATENCY_BUCKETS_MS,
)
RESOLVER_LATENCY: Final = MetricSpec(
    "dispatch_resolver_latency_ms",
    MetricKind.HISTOGRAM,
    "topk_resolver time per answered window (scoring, Top-K, assignment), ms",
    buckets=LATENCY_BUCKETS_MS,
)
CANDIDATES_PER_ORDER: Final = MetricSpec(
    "dispatch_candidates_per_order",
    MetricKind.HISTOGRAM,
    "mean number of feasible candidate riders per order, one observation per window",
    buckets=CANDIDATE_BUCKETS,
)
CAPACITY_CONFLICTS: Final = MetricSpec(
    "dispatch_capacity_conflicts_total",
    MetricKind.COUNTER,
    "orders that did not get their top-1 rider because of rider capacity",
)
VALIDATION_REJECTIONS: Final = MetricSpec(
    "dispatch_validation_rejections_total",
    MetricKind.COUNTER,
    "requests rejected as invalid, by tensor and broken rule",
    labels=("tensor", "rule"),
)
# Recorded by the entry points' decision writers (`outcomes.writer`), from their thread.
DECISION_RECORDS: Final = MetricSpec(
    "dispatch_decision_records_total",
    MetricKind.COUNTER,
    "decision records of answered orders, by result: written, duplicate (already stored), "
    "dropped_queue_full, dropped_store_error, dropped_unreadable",
    labels=("result",),
)
ALL_METRICS: Final = (
    ENCODER_LATENCY,
    RESOLVER_LATENCY,
    CANDIDATES_PER_ORDER,
    CAPACITY_CONFLICTS,
    VALIDATION_REJECTIONS,
)
# Labels every series carries, set once per model instance.
CONSTANT_LABELS: Final = ("model", "version")


@dataclass(frozen=True)
class Observation:
    """One value for one metric: observed (histogram), added (counter) or set (gauge)."""

    metric: MetricSpec
    value: float
    labels: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.labels or self.metric.labels:  # (most observations carry none)
            names = tuple(name for name, _ in self.labels)
            if names != self.metric.labels:
                raise ValueError(
                    f"{self.metric.name} takes labels {self.metric.labels}, got {names}"
                )
        if self.metric.kind is MetricKind.COUNTER and self.value < 0:
            raise ValueError(f"{self.metric.name}: a counter only goes up, got {self.value}")


def rejection_observation(error: DispatchInputError) -> Observation:
    """A rejected request, labelled by tensor and the rule's stable code (never the text)."""
    return Observation(VALIDATION_REJECTIONS, 1.0, (("tensor", error.tensor), ("rule", error.code)))


StepObserver = Callable[[Mapping[str, NDArray[Any]], float], list[Observation]]


# ---- sinks ---------------------------------------------------------------------------------


class MetricsSink(Protocol):
    def record(self, observations: Iterable[Observation]) -> None: ...


class NullMetrics:
    """Records nothing."""

    def record(self, observations: Iterable[Observation]) -> None:
        return None


@dataclass
class InMemoryMetrics:
    """Keeps every observation; sums counters, keeps histogram values, the last gauge value."""

    counters: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    histograms: dict[tuple[str, tuple[tuple[str, str], ...]], list[float]] = field(
        default_factory=dict
    )
    gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)

    def record(self, observations: Iterable[Observation]) -> None:
        for obs in observations:
            key = (obs.metric.name, obs.labels)
            if obs.metric.kind is MetricKind.COUNTER:
                self.counters[key] = self.counters.get(key, 0.0) + obs.value
            elif obs.metric.kind is MetricKind.HISTOGRAM:
                self.histograms.setdefault(key, []).append(obs.value)
            else:
                self.gauges[key] = obs.value

    def counter(self, metric: MetricSpec, **labels: str) -> float:
        return self.counters.get((metric.name, _label_key(metric, labels)), 0.0)

    def observed(self, metric: MetricSpec, **labels: str) -> list[float]:
        return list(self.histograms.get((metric.name, _label_key(metric, labels)), []))


# At most this many values of one histogram series are recorded per flush: 100 a second per
# series and process at one flush every `FLUSH_INTERVAL_S`. dispatch_fused, small windows,
# 2 cores, gRPC c=64 (alternating runs): 776 -> 980 and 683 -> 843 windows/s against
# recording every value (four histograms per window, one round trip to the server each).
HISTOGRAM_SAMPLES_PER_FLUSH: Final = 5
# How often a stub records what it queued. Each flush is a round trip to the server per
# counter series and per kept histogram value, a visible share of a busy stub's CPU; a
# longer interval costs less, but tests that read metric deltas must then wait for the
# counts to settle first.
FLUSH_INTERVAL_S: Final = 0.05


class BackgroundMetrics:
    """Records into another sink from a thread of its own, off the request path.

    Each value recorded into Triton costs the stub a round trip to the server; here a request
    only queues its observations, and a daemon thread drains the queue `interval_s` after the
    first observation it has not yet recorded (an idle stub's thread sleeps until one comes),
    adding up the counters of the batch (one update per series instead of one per request)
    and keeping at most `histogram_samples` values per histogram series, a uniform random
    choice (`sample_histograms`), before recording: the cost of metrics stays bounded however
    many windows a second the model answers. Histograms are then a sample (their `_count` is
    the number of values kept, not of windows; counters count every window). Values reach
    the metrics port at most about `interval_s` late; `close` stops the thread and records
    what is left (model unload). A failing sink never stops the thread: the batch is dropped
    and `on_error` told. The queue holds at most `max_queued` observations (the oldest go
    first), so a stuck sink cannot eat the memory. Checked on Triton 2.51: the stub's metric
    calls work from a Python thread while requests are served.
    """

    def __init__(
        self,
        inner: MetricsSink,
        *,
        interval_s: float = FLUSH_INTERVAL_S,
        on_error: Callable[[Exception], None] | None = None,
        max_queued: int = 100_000,
        histogram_samples: int = HISTOGRAM_SAMPLES_PER_FLUSH,
        seed: int | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        if histogram_samples < 1:
            raise ValueError(f"histogram_samples must be >= 1, got {histogram_samples}")
        self.inner = inner
        self.histogram_samples = histogram_samples
        self._rng = random.Random(seed)
        self.interval_s = interval_s
        self.on_error = on_error
        self._queue: deque[Observation] = deque(maxlen=max_queued)
        self._stop = threading.Event()
        self._queued = threading.Event()  # set by `record`, cleared before each flush
        self._thread = threading.Thread(target=self._run, name="metrics", daemon=True)
        self._thread.start()

    def record(self, observations: Iterable[Observation]) -> None:
        self._queue.extend(observations)  # deque.extend is atomic under the GIL
        # Set only when clear: `Event.set` takes the event's lock and notifies every time,
        # once per window on the request path. Correct either way: the flush thread clears
        # the event before it drains, and these observations were queued before the look.
        if not self._queued.is_set():
            self._queued.set()

    def _run(self) -> None:
        while True:
            self._queued.wait()
            if self._stop.wait(self.interval_s):
                return
            # Cleared before draining: what a request queues from here on sets it again.
            self._queued.clear()
            self.flush()

    def flush(self) -> None:
        """Record what is queued so far: counters summed per series, histograms sampled."""
        batch: list[Observation] = []
        while self._queue:
            batch.append(self._queue.popleft())
        if not batch:
            return
        try:
            kept = sample_histograms(coalesce_counters(batch), self.histogram_samples, self._rng)
            self.inner.record(kept)
        except Exception as exc:
            if self.on_error is not None:
                self.on_error(exc)

    def close(self) -> None:
        self._stop.set()
        self._queued.set()
        self._thread.join()
        self.flush()
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


def coalesce_counters(observations: Iterable[Observation]) -> list[Observation]:
    """The same observations with each counter series' increments added into one."""
    totals: dict[tuple[MetricSpec, tuple[tuple[str, str], ...]], float] = {}
    others: list[Observation] = []
    for obs in observations:
        if obs.metric.kind is MetricKind.COUNTER:
            key = (obs.metric, obs.labels)
            totals[key] = totals.get(key, 0.0) + obs.value
        else:
            others.append(obs)
    return [Observation(m, v, labels) for (m, labels), v in totals.items()] + others


def sample_histograms(
    observations: Sequence[Observation], per_series: int, rng: random.Random
) -> list[Observation]:
    """The observations with at most ``per_series`` values of each histogram series left, a
    uniform random choice of them (so quantiles stay unbiased); order and every counter and
    gauge kept."""
    positions: dict[tuple[str, tuple[tuple[str, str], ...]], list[int]] = {}
    for i, obs in enumerate(observations):
        if obs.metric.kind is MetricKind.HISTOGRAM:
            positions.setdefault((obs.metric.name, obs.labels), []).append(i)
    dropped: set[int] = set()
    for series in positions.values():
        if len(series) > per_series:
            dropped.update(series)
            dropped.difference_update(rng.sample(series, per_series))
    if not dropped:
        return list(observations)
    return [obs for i, obs in enumerate(observations) if i not in dropped]


def _label_key(metric: MetricSpec, labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple((name, labels[name]) for name in metric.labels)
