"""The launcher's Prometheus series: one `prometheus_client` registry per launcher, filled at
each scrape by collectors that read what the launcher already knows (the supervisor's
snapshot, the build), so nothing is recorded on the request path.

Other parts of the launcher add a `Collector` of their own (`launcher_registry(...)
.register`); a part that still writes Prometheus text (`Supervisor.metric_sources`) is read
through `TextSourcesCollector`, which parses it into metric families.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from dispatch_contract.version import product_version

__all__ = [
    "BuildInfoCollector",
    "SupervisorCollector",
    "TextSourcesCollector",
    "build_info",
    "exposition",
    "launcher_registry",
]


def build_info() -> dict[str, str]:
    """What this launcher is: the product version (one source: the repository's VERSION
    file, carried by the three distributions and the images) and its Python."""
    return {"version": product_version(), "python": platform.python_version()}


class BuildInfoCollector(Collector):
    """``dispatch_build_info{version=...,python=...} 1``: join on it to label any series."""

    def collect(self) -> Iterator[Metric]:
        info = build_info()
        family = GaugeMetricFamily(
            "dispatch_build_info",
            "The launcher's version and Python (always 1; the labels carry the facts).",
            labels=sorted(info),
        )
        family.add_metric([info[key] for key in sorted(info)], 1)
        yield family


class SupervisorCollector(Collector):
    """The supervisor's verdicts and counters, read from its snapshot (`Supervisor.snapshot`)
    at each scrape; ``entry_points`` get a series each even before their first probe."""

    def __init__(
        self, snapshot: Callable[[], Mapping[str, Any]], entry_points: Sequence[str]
    ) -> None:
        self.snapshot = snapshot
        self.entry_points = tuple(entry_points)

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        stubs = CounterMetricFamily(
            "dispatch_launcher_stub_restarts",
            "Python-backend stubs found dead and their model reloaded by the launcher.",
            labels=["model"],
        )
        for model, count in sorted(snap["stub_restarts"].items()):
            stubs.add_metric([model], count)
        yield stubs
        ready = GaugeMetricFamily(
            "dispatch_launcher_ready", "1 when every entry point answers a small window."
        )
        ready.add_metric([], int(snap["ready"]))
        yield ready
        restarts = CounterMetricFamily(
            "dispatch_launcher_server_restarts", "Servers restarted after a failed deep check."
        )
        restarts.add_metric([], snap["server_restarts"])
        yield restarts
        degraded_levels = snap["degraded"]
        degraded = GaugeMetricFamily(
            "dispatch_launcher_degraded",
            "1 while the entry point answers its probe only through a fallback (the scoring "
            "model away or failing).",
            labels=["entry_point"],
        )
        level = GaugeMetricFamily(
            "dispatch_launcher_fallback_level",
            "The fallback level of the entry point's last probe answer (0: the chosen model "
            "version scored it).",
            labels=["entry_point"],
        )
        for entry_point in self.entry_points:
            degraded.add_metric([entry_point], int(entry_point in degraded_levels))
            level.add_metric([entry_point], degraded_levels.get(entry_point, 0))
        yield degraded
        yield level
        unhealed = GaugeMetricFamily(
            "dispatch_launcher_unhealed",
            "1 while a model's instances are not all back (its reload refused or failing); "
            "the server is not ready meanwhile.",
            labels=["model"],
        )
        for model in sorted(snap["unhealed"]):
            unhealed.add_metric([model], 1)
        yield unhealed
        probes = CounterMetricFamily(
            "dispatch_launcher_probes",
            "Deep-check windows sent to the entry point (counted by Triton's nv_inference_* "
            "like any request; the project's own metrics leave them out).",
            labels=["entry_point"],
        )
        for entry_point, count in sorted(snap["probes"].items()):
            probes.add_metric([entry_point], count)
        yield probes


class TextSourcesCollector(Collector):
    """Series that a part of the launcher writes as Prometheus text (each source called per
    scrape), parsed into metric families so that one registry serves them."""

    def __init__(self, sources: Iterable[Callable[[], str]]) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        for source in list(self.sources):
            yield from text_string_to_metric_families(source())


def launcher_registry(
    snapshot: Callable[[], Mapping[str, Any]],
    entry_points: Sequence[str],
    text_sources: Iterable[Callable[[], str]] = (),
) -> CollectorRegistry:
    """The launcher's registry: build info, the supervisor's series and ``text_sources``.
    Not auto-described: collectors read live state, so nothing runs at registration."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BuildInfoCollector())
    registry.register(SupervisorCollector(snapshot, entry_points))
    registry.register(TextSourcesCollector(text_sources))
    return registry


def exposition(registry: CollectorRegistry) -> str:
    """The registry in Prometheus' text format (what ``/metrics`` serves)."""
    return generate_latest(registry).decode()
