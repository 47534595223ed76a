"""Behaviour of dispatch_service.core.metrics: the metric definitions, observations and sinks."""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np
import pytest

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.metrics import (
    ALL_METRICS,
    CANDIDATES_PER_ORDER,
    CAPACITY_CONFLICTS,
    ENCODER_LATENCY,
    RESOLVER_LATENCY,
    VALIDATION_REJECTIONS,
    BackgroundMetrics,
    InMemoryMetrics,
    MetricKind,
    MetricSpec,
    NullMetrics,
    Observation,
    coalesce_counters,
    rejection_observation,
    sample_histograms,
)
from dispatch_service.pipeline.step_metrics import (
    encoder_observations,
)

# ---- the metric names the dashboard and deploy checks expect ----------------------------


def test_names_kinds_and_labels() -> None:
    by_name = {spec.name: spec for spec in ALL_METRICS}
    assert set(by_name) == {
        "dispatch_encoder_latency_ms",
        "dispatch_resolver_latency_ms",
        "dispatch_candidates_per_order",
        "dispatch_capacity_conflicts_total",
        "dispatch_validation_rejections_total",
    }
    assert ENCODER_LATENCY.kind is RESOLVER_LATENCY.kind is MetricKind.HISTOGRAM
    assert CANDIDATES_PER_ORDER.kind is MetricKind.HISTOGRAM
    assert CAPACITY_CONFLICTS.kind is VALIDATION_REJECTIONS.kind is MetricKind.COUNTER
    assert VALIDATION_REJECTIONS.labels == ("tensor", "rule")
    for spec in ALL_METRICS:
        assert spec.description
        assert spec.name.endswith("_total") == (spec.kind is MetricKind.COUNTER)
    assert ENCODER_LATENCY.buckets[0] <= 1.0 and ENCODER_LATENCY.buckets[-1] >= 500.0
    assert CANDIDATES_PER_ORDER.buckets[0] == 0.0 and CANDIDATES_PER_ORDER.buckets[-1] == 32.0


def test_a_spec_checks_its_buckets() -> None:
    with pytest.raises(ValueError, match="buckets go with histograms"):
        MetricSpec("x", MetricKind.HISTOGRAM, "x")
    with pytest.raises(ValueError, match="buckets go with histograms"):
        MetricSpec("x_total", MetricKind.COUNTER, "x", buckets=(1.0,))
    with pytest.raises(ValueError, match="strictly increasing"):
        MetricSpec("x", MetricKind.HISTOGRAM, "x", buckets=(2.0, 1.0))


def test_an_observation_checks_labels_and_counter_sign() -> None:
    with pytest.raises(ValueError, match=r"takes labels \('tensor', 'rule'\)"):
        Observation(VALIDATION_REJECTIONS, 1.0, (("rule", "range"), ("tensor", "X")))
    with pytest.raises(ValueError, match="only goes up"):
        Observation(CAPACITY_CONFLICTS, -1.0)


def test_a_rejection_is_labelled_by_tensor_and_rule_code_not_text() -> None:
    error = DispatchInputError(
        "ORDER_PICKUP", "latitude must be within [-90.0, 90.0] (row 3)", "range"
    )
    observation = rejection_observation(error)
    assert observation.metric is VALIDATION_REJECTIONS
    assert observation.value == 1.0
    assert observation.labels == (("tensor", "ORDER_PICKUP"), ("rule", "range"))


# ---- sinks -------------------------------------------------------------------------------


def test_in_memory_metrics_sum_counters_and_keep_histogram_values() -> None:
    sink = InMemoryMetrics()
    sink.record(encoder_observations({"CANDIDATE_RIDER_INDEX": np.array([[0, 1]])}, 2.0))
    sink.record(encoder_observations({"CANDIDATE_RIDER_INDEX": np.array([[0, -1]])}, 4.0))
    sink.record([Observation(CAPACITY_CONFLICTS, 2), Observation(CAPACITY_CONFLICTS, 3)])
    bad = DispatchInputError("RIDER_IDS", "ids must be unique, row 1 repeats row 0", "unique")
    sink.record([rejection_observation(bad)] * 2)
    gauge = MetricSpec("dispatch_test_gauge", MetricKind.GAUGE, "a gauge")
    sink.record([Observation(gauge, 1.0), Observation(gauge, 0.5)])

    assert sink.observed(ENCODER_LATENCY) == [2.0, 4.0]
    assert sink.observed(CANDIDATES_PER_ORDER) == [2.0, 1.0]
    assert sink.counter(CAPACITY_CONFLICTS) == 5
    assert sink.counter(VALIDATION_REJECTIONS, tensor="RIDER_IDS", rule="unique") == 2
    assert sink.counter(VALIDATION_REJECTIONS, tensor="RIDER_IDS", rule="range") == 0
    assert sink.gauges[("dispatch_test_gauge", ())] == 0.5
    NullMetrics().record(encoder_observations({}, 1.0))  # records nothing, raises nothing


# A stand-in for pb_utils.MetricFamily with the stub's rules on buckets.


# ---- BackgroundMetrics ---------------------------------------------------------------------


class SlowCounting(InMemoryMetrics):
    """InMemoryMetrics that counts how many record calls (IPC batches) reached it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []
        self.closed = False

    def record(self, observations: Any) -> None:
        batch = list(observations)
        self.calls.append(len(batch))
        super().record(batch)

    def close(self) -> None:
        self.closed = True


def test_background_metrics_record_off_the_caller_and_add_up_counters() -> None:
    inner = SlowCounting()
    # never on its own during the test; every histogram value kept
    sink = BackgroundMetrics(inner, interval_s=3600.0, histogram_samples=50)
    rejection = rejection_observation(DispatchInputError("RIDER_IDS", "is required", "missing"))
    for _ in range(50):
        sink.record([rejection, Observation(ENCODER_LATENCY, 1.5)])
    assert inner.calls == []  # nothing recorded by the callers themselves
    sink.close()
    assert inner.closed
    assert inner.counter(VALIDATION_REJECTIONS, tensor="RIDER_IDS", rule="missing") == 50
    assert inner.observed(ENCODER_LATENCY) == [1.5] * 50
    assert inner.calls == [51]  # one counter update for 50 increments, every histogram value


def test_background_metrics_keep_a_bounded_sample_of_each_histogram() -> None:
    inner = SlowCounting()
    sink = BackgroundMetrics(inner, interval_s=3600.0, histogram_samples=5, seed=7)
    for i in range(50):
        sink.record([Observation(CAPACITY_CONFLICTS, 1.0), Observation(ENCODER_LATENCY, float(i))])
    for value in (1.0, 2.0, 3.0):
        sink.record([Observation(RESOLVER_LATENCY, value)])
    sink.close()
    assert inner.counter(CAPACITY_CONFLICTS) == 50  # counters count every window
    kept = inner.observed(ENCODER_LATENCY)
    assert len(kept) == len(set(kept)) == 5 and set(kept) <= {float(i) for i in range(50)}
    assert kept == sorted(kept)  # in the order they came
    assert inner.observed(RESOLVER_LATENCY) == [1.0, 2.0, 3.0]  # under the bound: all
    assert inner.calls == [1 + 5 + 3]


def test_histogram_samples_are_uniform_and_per_series() -> None:
    labelled = MetricSpec("t_ms", MetricKind.HISTOGRAM, "t", ("role",), (1.0,))
    batch = [Observation(labelled, float(i), (("role", "a"),)) for i in range(20)]
    batch += [Observation(labelled, 100.0 + i, (("role", "b"),)) for i in range(3)]
    batch.append(Observation(CAPACITY_CONFLICTS, 4.0))
    rng = random.Random(0)
    picked = np.zeros(20)
    draws = 4000
    for _ in range(draws):
        kept = sample_histograms(batch, 5, rng)
        a = [obs.value for obs in kept if obs.labels == (("role", "a"),)]
        assert len(a) == 5
        assert [obs.value for obs in kept if obs.labels == (("role", "b"),)] == [100, 101, 102]
        assert kept[-1] == batch[-1]
        picked[np.asarray(a, dtype=np.int64)] += 1
    # every value of the crowded series is kept with probability 5/20
    assert np.allclose(picked / draws, 0.25, atol=0.04)
    assert sample_histograms(batch, 20, rng) == batch


def wait_for_a_record(inner: SlowCounting, within_s: float = 5.0) -> None:
    """Until the background thread has recorded a batch into `inner` (or `within_s`)."""
    deadline = time.monotonic() + within_s
    while not inner.calls and time.monotonic() < deadline:
        time.sleep(0.005)


def test_background_metrics_reach_the_sink_within_the_interval() -> None:
    inner = SlowCounting()
    sink = BackgroundMetrics(inner, interval_s=0.01)
    try:
        sink.record([Observation(CAPACITY_CONFLICTS, 2.0)])
        wait_for_a_record(inner)
        assert inner.counter(CAPACITY_CONFLICTS) == 2.0
    finally:
        sink.close()


def test_an_idle_background_thread_sleeps_until_something_is_recorded() -> None:
    """An idle stub's metrics thread does not wake every interval (a server runs a dozen
    stubs and more on two cores)."""

    class Counted(BackgroundMetrics):
        flushes = 0

        def flush(self) -> None:
            Counted.flushes += 1
            super().flush()

    inner = SlowCounting()
    sink = Counted(inner, interval_s=0.005)
    try:
        time.sleep(0.2)  # 40 intervals
        assert Counted.flushes == 0
        sink.record([Observation(CAPACITY_CONFLICTS, 1.0)])
        wait_for_a_record(inner)
        assert inner.counter(CAPACITY_CONFLICTS) == 1.0
    finally:
        sink.close()


def test_background_metrics_need_a_positive_interval_and_sample() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        BackgroundMetrics(NullMetrics(), interval_s=0)
    with pytest.raises(ValueError, match="histogram_samples"):
        BackgroundMetrics(NullMetrics(), histogram_samples=0)


def test_coalescing_keeps_series_apart_and_every_histogram_value() -> None:
    a = rejection_observation(DispatchInputError("RIDER_IDS", "x", "missing"))
    b = rejection_observation(DispatchInputError("ORDER_IDS", "x", "missing"))
    merged = coalesce_counters([a, b, a, Observation(RESOLVER_LATENCY, 3.0), a])
    sums = {obs.labels: obs.value for obs in merged if obs.metric is VALIDATION_REJECTIONS}
    assert sums == {a.labels: 3.0, b.labels: 1.0}
    assert [obs.value for obs in merged if obs.metric is RESOLVER_LATENCY] == [3.0]


def test_a_failing_sink_is_reported_and_the_thread_keeps_going() -> None:
    class Flaky(InMemoryMetrics):
        fail = True

        def record(self, observations: Any) -> None:
            if self.fail:
                self.fail = False
                raise RuntimeError("metrics IPC failed")
            super().record(observations)

    errors: list[Exception] = []
    inner = Flaky()
    sink = BackgroundMetrics(inner, interval_s=3600.0, on_error=errors.append)
    sink.record([Observation(ENCODER_LATENCY, 1.0)])
    sink.flush()  # this batch is lost, and said so
    sink.record([Observation(ENCODER_LATENCY, 2.0)])
    sink.close()
    assert [str(e) for e in errors] == ["metrics IPC failed"]
    assert inner.observed(ENCODER_LATENCY) == [2.0]
