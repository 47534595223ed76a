"""A model's custom metrics on Triton's metrics port: `TritonMetrics` over
`pb_utils.MetricFamily`, recorded off the request path, and the one line that says when
recording fails.

The metric definitions and observations are the library's (`core.metrics`,
`pipeline.step_metrics`); this module is the only one that speaks to Triton's metrics API.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from dispatch_service.core.log_text import describe_error
from dispatch_service.core.metrics import (
    ALL_METRICS,
    CONSTANT_LABELS,
    BackgroundMetrics,
    MetricKind,
    MetricSpec,
    MetricsSink,
    NullMetrics,
    Observation,
)
from dispatch_service.serving.backend_log import log_event

__all__ = ["TritonMetrics", "metrics_error_logger", "triton_metrics"]


def _label_key(metric: MetricSpec, labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple((name, labels[name]) for name in metric.labels)


class TritonMetrics:
    """Records into Triton custom metrics (`pb_utils.MetricFamily`), one family per spec.

    The families live as long as this object: Triton fails a metric's updates once its
    family is gone. Series without variable labels are created up front (they read 0
    before the first request); labelled ones on first use.
    """

    def __init__(
        self,
        pb_utils: Any,
        constant_labels: Mapping[str, str],
        metrics: Iterable[MetricSpec] = ALL_METRICS,
    ) -> None:
        # More constant labels are allowed (e.g. a per-process one, see router_adapter).
        if not set(CONSTANT_LABELS) <= set(constant_labels):
            raise ValueError(
                f"constant labels must include {CONSTANT_LABELS}, got {constant_labels}"
            )
        self.pb = pb_utils
        self.constant_labels = dict(constant_labels)
        kinds = {
            MetricKind.COUNTER: pb_utils.MetricFamily.COUNTER,
            MetricKind.GAUGE: pb_utils.MetricFamily.GAUGE,
            MetricKind.HISTOGRAM: pb_utils.MetricFamily.HISTOGRAM,
        }
        self.families: dict[str, Any] = {}
        self.series: dict[tuple[str, tuple[tuple[str, str], ...]], Any] = {}
        for spec in metrics:
            self.families[spec.name] = pb_utils.MetricFamily(
                name=spec.name, description=spec.description, kind=kinds[spec.kind]
            )
            if not spec.labels:
                self._series(spec, ())

    def _series(self, spec: MetricSpec, labels: tuple[tuple[str, str], ...]) -> Any:
        key = (spec.name, labels)
        metric = self.series.get(key)
        if metric is None:
            family = self.families[spec.name]
            all_labels = {**self.constant_labels, **dict(labels)}
            if spec.kind is MetricKind.HISTOGRAM:
                metric = family.Metric(labels=all_labels, buckets=list(spec.buckets))
            else:
                metric = family.Metric(labels=all_labels)
            self.series[key] = metric
        return metric

    def record(self, observations: Iterable[Observation]) -> None:
        for obs in observations:
            if obs.metric.name not in self.families:
                continue
            if obs.metric.kind is MetricKind.COUNTER:
                # A 0 still makes the series exist (once: created series are kept), so a
                # ratio whose numerator never grew reads 0, not "no data" (a shadow that
                # never agrees must still fire DispatchShadowDisagreement); adding the 0
                # itself would cost an IPC call for nothing.
                series = self._series(obs.metric, obs.labels)
                if obs.value > 0:
                    series.increment(obs.value)
            elif obs.metric.kind is MetricKind.HISTOGRAM:
                self._series(obs.metric, obs.labels).observe(obs.value)
            else:
                self._series(obs.metric, obs.labels).set(obs.value)

    def close(self) -> None:
        """Drop the series before their families (model unload)."""
        self.series.clear()
        self.families.clear()


def triton_metrics(
    pb_utils: Any, model_name: str, version: str, definitions: Sequence[MetricSpec]
) -> MetricsSink:
    """The model's custom metrics on Triton's metrics port; none (logged) where unavailable.

    Recorded from a thread of the stub (`BackgroundMetrics`): each value is a round trip to
    the server, which a request should not wait for. Each series carries the stub's `pid`:
    Triton frees a series shared by several processes when the first of them unloads, so a
    live reload must never share one (sum over `pid`).
    """
    try:
        labels = {"model": model_name, "version": version, "pid": str(os.getpid())}
        sink = TritonMetrics(pb_utils, labels, definitions)
    except Exception as exc:  # e.g. a server started with --allow-metrics=false
        log_event(
            pb_utils,
            "warn",
            event="metrics_unavailable",
            model=model_name,
            error=describe_error(exc),
        )
        return NullMetrics()
    return BackgroundMetrics(sink, on_error=metrics_error_logger(pb_utils, model_name))


def metrics_error_logger(pb_utils: Any, model_name: str) -> Callable[[Exception], None]:
    """The first failure of a model's metrics recording as one error line; later ones quiet."""
    failed: list[Exception] = []

    def report(exc: Exception) -> None:
        if not failed:
            failed.append(exc)
            log_event(
                pb_utils,
                "error",
                event="metrics_failed",
                model=model_name,
                error=describe_error(exc),
            )

    return report
