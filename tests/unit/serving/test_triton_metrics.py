"""Behaviour of dispatch_service.serving.triton_metrics over a stand-in for `pb_utils`."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.metrics import (
    ALL_METRICS,
    CAPACITY_CONFLICTS,
    ENCODER_LATENCY,
    RESOLVER_LATENCY,
    MetricKind,
    MetricSpec,
    Observation,
    rejection_observation,
)
from dispatch_service.routing.metrics import (
    ROUTER_METRICS,
    SHADOW_ORDERS,
    SHADOW_TOP1_AGREEMENTS,
)
from dispatch_service.serving.triton_metrics import TritonMetrics
from pb_stand_in import FakeMetricFamily


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


def test_a_counter_that_only_ever_adds_zero_is_exported_at_zero(
    families: list[FakeFamily],
) -> None:
    """A shadow that never agrees: its agreements series must exist at 0, or the alert's
    ratio (agreements / shadowed orders) has no numerator and never fires."""
    sink = TritonMetrics(
        FakePb(), {"model": "dispatch_router", "version": "1"}, metrics=ROUTER_METRICS
    )
    pair = (("primary", "1"), ("shadow", "3"))
    for _ in range(3):
        sink.record(
            [Observation(SHADOW_ORDERS, 12.0, pair), Observation(SHADOW_TOP1_AGREEMENTS, 0.0, pair)]
        )
    (agreements,) = family(families, "dispatch_shadow_top1_agreements_total").metrics
    assert agreements.labels == {
        "model": "dispatch_router",
        "version": "1",
        "primary": "1",
        "shadow": "3",
    }
    assert agreements.calls == []  # exported at 0, no increment of 0 sent
    (orders,) = family(families, "dispatch_shadow_orders_total").metrics
    assert orders.calls == [("increment", 12.0)] * 3


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
