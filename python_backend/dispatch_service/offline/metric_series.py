"""Samples of a few metric families taken from metrics endpoints, written as the input series
of a ``promtool test rules`` file: how a live-city run (`offline.live_city`) records what the
service exported, one step per simulated minute, for the alert rules to be tested on."""

from __future__ import annotations

import math
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["DEFAULT_SERIES_PREFIXES", "SeriesRecorder"]

DEFAULT_SERIES_PREFIXES: Final = ("dispatch_drift_", "dispatch_quality_")


@dataclass
class SeriesRecorder:
    """Samples of a few metric families, one scrape per simulated minute, written as the
    ``input_series`` of a ``promtool test rules`` file (one step per scrape)."""

    urls: Sequence[str]
    prefixes: Sequence[str] = DEFAULT_SERIES_PREFIXES
    timeout_s: float = 10.0
    series: dict[str, dict[int, float]] = field(default_factory=dict)
    scrapes: int = 0

    def scrape(self) -> None:
        step = self.scrapes
        for url in self.urls:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as response:
                text = response.read().decode("utf-8")
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if not sample.name.startswith(tuple(self.prefixes)):
                        continue
                    labels = ",".join(
                        f'{name}="{_escape(value)}"'
                        for name, value in sorted(sample.labels.items())
                    )
                    key = f"{sample.name}{{{labels}}}"
                    self.series.setdefault(key, {})[step] = float(sample.value)
        self.scrapes += 1

    def input_series(self) -> list[dict[str, str]]:
        """promtool's input series: a value per step, ``_`` where the series was absent."""
        out = []
        for key, values in sorted(self.series.items()):
            text = " ".join(
                _number(values[step]) if step in values else "_" for step in range(self.scrapes)
            )
            out.append({"series": key, "values": text})
        return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return repr(float(value))
