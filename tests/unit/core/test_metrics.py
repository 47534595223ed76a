"""Behaviour of dispatch_service.core.metrics: observations from step outputs, and the sinks."""

from __future__ import annotations

import random
import time
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import pytest

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.metrics import (
    ALL_METRICS,
    CANDIDATES_PER_ORDER,
    CAPACITY_CONFLICTS,
    ENCODER_LATENCY,
    RESOLVER_LATENCY,
    STEP_OBSERVERS,
    VALIDATION_REJECTIONS,
    BackgroundMetrics,
    InMemoryMetrics,
    MetricKind,
    MetricSpec,
    NullMetrics,
    Observation,
    TritonMetrics,
    candidates_per_order,
    capacity_conflicts,
    coalesce_counters,
    encoder_observations,
    metrics_of,
    rejection_observation,
    resolver_observations,
    sample_histograms,
)
from dispatch_service.domain.window import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from dispatch_service.pipeline.stacking import StackingSettings
from pb_stand_in import FakeMetricFamily

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


# ---- observations --------------------------------------------------------------------


def test_candidates_per_order_counts_feasible_riders() -> None:
    index = np.array([[3, 1, -1, -1], [0, 2, 4, 5], [-1, -1, -1, -1]], dtype=np.int32)
    assert candidates_per_order(index) == pytest.approx((2 + 4 + 0) / 3)
    assert candidates_per_order(np.zeros((0, 4), dtype=np.int32)) == 0.0
    assert candidates_per_order(np.zeros((2, 0), dtype=np.int32)) == 0.0


def test_capacity_conflicts_counts_orders_without_their_top1() -> None:
    topk = np.array(
        [
            [0, 1, 2],  # got 0: its top-1
            [0, 2, -1],  # got 2: rider 0 was full
            [0, -1, -1],  # unassigned: rider 0 was full
            [-1, -1, -1],  # no feasible rider at all: not a capacity conflict
            [1, 0, 2],  # got 1: its top-1
            [0, 3, 1],  # got 3, which ties with its top-1: no loss, no conflict
        ],
        dtype=np.int32,
    )
    score = np.array(
        [[0.9, 0.5, 0.4], [0.8, 0.7, 0], [0.6, 0, 0], [0, 0, 0], [0.7, 0.6, 0.1], [0.5, 0.5, 0.2]],
        dtype=np.float32,
    )
    assigned = np.array([0, 2, -1, -1, 1, 3], dtype=np.int32)
    assigned_score = np.array([0.9, 0.7, 0, 0, 0.7, 0.5], dtype=np.float32)
    assert capacity_conflicts(topk, score, assigned, assigned_score) == 2
    empty = np.zeros((3, 0))
    assert capacity_conflicts(empty, empty, np.full(3, -1), np.zeros(3)) == 0


def _conflicts(out: dict[str, Any]) -> int:
    return capacity_conflicts(
        out["TOPK_RIDER_INDEX"],
        out["TOPK_OBJECTIVES"][..., 0],
        out["ASSIGNED_RIDER_INDEX"],
        out["ASSIGNED_SCORE"],
    )


def test_capacity_conflicts_of_a_real_window_with_scarce_riders() -> None:
    pipeline = DispatchPipeline.from_repository()
    window = dict(window_to_wire(generate_window(np.random.default_rng(3), 30, 6)))
    out = pipeline.run(window)
    had_top1 = out["TOPK_RIDER_INDEX"][:, 0] >= 0
    unassigned = int((had_top1 & (out["ASSIGNED_RIDER_INDEX"] < 0)).sum())
    assert unassigned > 0  # 30 orders, 6 riders: not everyone can be served
    assert _conflicts(out) >= unassigned
    # with room for every order on every rider and stand-alone scores, each order gets its
    # top-1: no conflicts (stack-aware, an order may still cede its top-1 rider to others:
    # a rider's later new orders ride with more load, which the solve prices)
    fields = np.array(window["RIDER_FIELDS"], copy=True)
    fields[:, 2], fields[:, 3] = 0, 30  # RIDER_FIELD_COLUMNS: load, capacity
    roomy = {**window, "RIDER_FIELDS": fields}
    stand_alone = replace(
        pipeline, resolver=replace(pipeline.resolver, stacking=StackingSettings(False))
    )
    assert _conflicts(stand_alone.run(roomy)) == 0


def test_encoder_and_resolver_observations() -> None:
    candidates = np.array([[1, 0, -1], [2, -1, -1]], dtype=np.int32)
    encoder = encoder_observations({"CANDIDATE_RIDER_INDEX": candidates}, 3.5)
    assert encoder == [
        Observation(ENCODER_LATENCY, 3.5),
        Observation(CANDIDATES_PER_ORDER, 1.5),
    ]
    resolver = resolver_observations(
        {
            "TOPK_RIDER_INDEX": np.array([[0, 1], [0, 1]], dtype=np.int32),
            # TOPK_OBJECTIVE_COLUMNS: score, then ETA, on-time, cost (unused here)
            "TOPK_OBJECTIVES": np.array(
                [[[0.9, 0, 0, 0], [0.5, 0, 0, 0]], [[0.8, 0, 0, 0], [0.3, 0, 0, 0]]],
                dtype=np.float32,
            ),
            "ASSIGNED_RIDER_INDEX": np.array([0, 1], dtype=np.int32),
            "ASSIGNED_SCORE": np.array([0.9, 0.3], dtype=np.float32),
        },
        7.25,
    )
    assert resolver == [Observation(RESOLVER_LATENCY, 7.25), Observation(CAPACITY_CONFLICTS, 1)]
    assert resolver_observations({}, 1.0) == [Observation(RESOLVER_LATENCY, 1.0)]
    assert metrics_of("feature_encoder") == (
        ENCODER_LATENCY,
        CANDIDATES_PER_ORDER,
        VALIDATION_REJECTIONS,
    )
    assert metrics_of("topk_resolver") == (
        RESOLVER_LATENCY,
        CAPACITY_CONFLICTS,
        VALIDATION_REJECTIONS,
    )
    assert metrics_of("dispatch_model") == (VALIDATION_REJECTIONS,)
    assert STEP_OBSERVERS["feature_encoder"] is encoder_observations
    assert STEP_OBSERVERS["topk_resolver"] is resolver_observations
    assert "dispatch_model" not in STEP_OBSERVERS


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


class FakeFamily(FakeMetricFamily):
    """Families register themselves, so a test sees what `TritonMetrics` created."""

    COUNTER: ClassVar[str] = "COUNTER"
    GAUGE: ClassVar[str] = "GAUGE"
    HISTOGRAM: ClassVar[str] = "HISTOGRAM"
    created: ClassVar[list[FakeFamily]] = []

    def __init__(self, name: str, description: str, kind: str) -> None:
        super().__init__(name, description, kind)
        FakeFamily.created.append(self)


class FakePb:
    MetricFamily = FakeFamily


@pytest.fixture
def families() -> list[FakeFamily]:
    FakeFamily.created = []
    return FakeFamily.created


def family(families: list[FakeFamily], name: str) -> FakeFamily:
    (found,) = (f for f in families if f.name == name)
    return found


def test_triton_metrics_creates_every_family_with_constant_labels(
    families: list[FakeFamily],
) -> None:
    sink = TritonMetrics(FakePb(), {"model": "feature_encoder", "version": "1"})
    assert [f.name for f in families] == [spec.name for spec in ALL_METRICS]
    kinds = {f.name: f.kind for f in families}
    assert kinds["dispatch_encoder_latency_ms"] == "HISTOGRAM"
    assert kinds["dispatch_capacity_conflicts_total"] == "COUNTER"
    # unlabelled series exist before the first request; labelled ones wait for their labels
    latency = family(families, "dispatch_encoder_latency_ms")
    (series,) = latency.metrics
    assert series.labels == {"model": "feature_encoder", "version": "1"}
    assert series.buckets == list(ENCODER_LATENCY.buckets)
    assert family(families, "dispatch_validation_rejections_total").metrics == []
    assert len(sink.families) == len(ALL_METRICS)


def test_triton_metrics_records_each_kind(families: list[FakeFamily]) -> None:
    sink = TritonMetrics(FakePb(), {"model": "topk_resolver", "version": "2"})
    sink.record(
        [
            Observation(RESOLVER_LATENCY, 1.25),
            Observation(CAPACITY_CONFLICTS, 0),  # nothing to add: no call
            Observation(CAPACITY_CONFLICTS, 4),
        ]
    )
    error = DispatchInputError("OBJECTIVE_WEIGHTS", "must be FP32, got float64", "dtype")
    sink.record([rejection_observation(error), rejection_observation(error)])
    (latency,) = family(families, "dispatch_resolver_latency_ms").metrics
    assert latency.calls == [("observe", 1.25)]
    (conflicts,) = family(families, "dispatch_capacity_conflicts_total").metrics
    assert conflicts.calls == [("increment", 4)]
    (rejections,) = family(families, "dispatch_validation_rejections_total").metrics
    assert rejections.labels == {
        "model": "topk_resolver",
        "version": "2",
        "tensor": "OBJECTIVE_WEIGHTS",
        "rule": "dtype",
    }
    assert rejections.calls == [("increment", 1.0), ("increment", 1.0)]


def test_triton_metrics_gauges_and_unknown_specs(families: list[FakeFamily]) -> None:
    gauge = MetricSpec("dispatch_test_gauge", MetricKind.GAUGE, "a gauge")
    sink = TritonMetrics(FakePb(), {"model": "m", "version": "1"}, metrics=[gauge])
    sink.record([Observation(gauge, 3.0), Observation(ENCODER_LATENCY, 1.0)])
    (only,) = families
    assert only.metrics[0].calls == [("set", 3.0)]


def test_triton_metrics_needs_model_and_version_labels() -> None:
    with pytest.raises(ValueError, match="constant labels"):
        TritonMetrics(FakePb(), {"model": "m"})


def test_closing_drops_series_then_families(families: list[FakeFamily]) -> None:
    sink: Any = TritonMetrics(FakePb(), {"model": "m", "version": "1"})
    sink.close()
    assert sink.series == {} and sink.families == {}
    sink.record([Observation(ENCODER_LATENCY, 1.0)])  # after close: ignored


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


def test_background_metrics_reach_the_sink_within_the_interval() -> None:
    inner = SlowCounting()
    sink = BackgroundMetrics(inner, interval_s=0.01)
    try:
        sink.record([Observation(CAPACITY_CONFLICTS, 2.0)])
        deadline = time.monotonic() + 5.0
        while not inner.calls and time.monotonic() < deadline:
            time.sleep(0.005)
        assert inner.counter(CAPACITY_CONFLICTS) == 2.0
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
