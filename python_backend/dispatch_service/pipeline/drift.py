"""Input and output drift per city: a scoring version's training reference, and the counts of
live pairs per reference bin that Prometheus turns into a population stability index (PSI).

Each `dispatch_model` version folder ships ``drift_reference.json`` (written by the training
export, `offline.training.drift_reference_cli`): per registered city and per monitored
quantity (the pair features but the calendar ones, and the three predictions) the cut points
of its reference
deciles and the share of reference pairs in each bin. Serving counts each scored pair into
those bins (`DriftMonitor`, off the request path) and exports the counts as one counter per
(scoring version, city, quantity, bin), the reference shares as gauges; the recording rules
in ``deploy/prometheus/alerts.yml`` compute the PSI over an hour from them, summed over entry
points and replicas. `psi` is the same statistic in Python (reports and tests).

Why PSI and not a KS statistic: PSI is a sum over bins, so per-bin counters from every stub
and replica add up in Prometheus and the statistic is one PromQL expression over any window;
KS needs the largest gap between two CDFs, which bins only bound, and its p-value says
"different" for any shift once a city sends millions of pairs. PSI measures the size of the
shift, with thresholds in common use (0.1 moderate, 0.25 major).

The calendar features (``hour_sin``, ``hour_cos``, ``is_weekend``) are not monitored: the
reference spans every hour of three weeks, an hour of live traffic holds one hour, so they
would "drift" every hour by design.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import CANDIDATE_RIDER_INDEX, OBJECTIVES, PAIR_FEATURE_NAMES, PAIR_FEATURES
from dispatch_service.core.metrics import MetricKind, MetricSpec, MetricsSink, Observation
from dispatch_service.core.repository_layout import DRIFT_REFERENCE_FILE, model_layout
from dispatch_service.core.signing import TrustedKeys, read_verified
from dispatch_service.routing.engine import RoutedScores

__all__ = [
    "CALENDAR_FEATURES",
    "DRIFT_BIN_PAIRS",
    "DRIFT_METRICS",
    "DRIFT_QUANTITIES",
    "DRIFT_REFERENCE_SHARE",
    "MAX_PAIRS_PER_WINDOW",
    "PSI_FLOOR",
    "REFERENCE_BINS",
    "REFERENCE_FORMAT",
    "CityReference",
    "DriftMonitor",
    "DriftReference",
    "QuantityBins",
    "bin_counts",
    "drift_monitor",
    "psi",
    "quantity_bins",
    "read_reference",
]

REFERENCE_FORMAT: Final = "dispatch-drift-reference/1"
REFERENCE_BINS: Final = 10  # deciles of the reference
# A bin's share is floored here before the PSI's logarithm (an empty bin would be infinite).
PSI_FLOOR: Final = 1e-4
CALENDAR_FEATURES: Final = ("hour_sin", "hour_cos", "is_weekend")
# What is compared, in this order: the pair features but the calendar ones, then the outputs.
DRIFT_QUANTITIES: Final = (
    *(name for name in PAIR_FEATURE_NAMES if name not in CALENDAR_FEATURES),
    *OBJECTIVES,
)
_FEATURE_COLUMNS: Final = tuple(
    i for i, name in enumerate(PAIR_FEATURE_NAMES) if name not in CALENDAR_FEATURES
)
_LABELS: Final = ("model_version", "city", "quantity", "bin")
# A larger window is counted by every k-th of its valid pairs (the pairs run order by order,
# each order's candidates nearest first: the stride keeps every order and every rank), so
# that the request path copies a bounded amount whatever the window's size.
MAX_PAIRS_PER_WINDOW: Final = 512

DRIFT_BIN_PAIRS: Final = MetricSpec(
    "dispatch_drift_bin_pairs_total",
    MetricKind.COUNTER,
    "scored order-rider pairs (at most 512 a window, a stride of larger ones) by the version "
    "that scored them, the window's city, a monitored feature or prediction and the bin of "
    "its training reference it fell in",
    labels=_LABELS,
)
DRIFT_REFERENCE_SHARE: Final = MetricSpec(
    "dispatch_drift_reference_share",
    MetricKind.GAUGE,
    "share of the version's training pairs of that city in that bin (drift_reference.json)",
    labels=_LABELS,
)
DRIFT_METRICS: Final = (DRIFT_BIN_PAIRS, DRIFT_REFERENCE_SHARE)


@dataclass(frozen=True)
class QuantityBins:
    """One quantity's reference: bin i holds ``edges[i-1] <= x < edges[i]`` (the first bin
    everything below ``edges[0]``, the last everything from ``edges[-1]`` up)."""

    edges: tuple[float, ...]
    shares: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.shares) != len(self.edges) + 1:
            raise ValueError(f"{len(self.edges)} edges need {len(self.edges) + 1} shares")
        if list(self.edges) != sorted(set(self.edges)):
            raise ValueError("edges must be strictly increasing")
        if min(self.shares) <= 0.0 or abs(sum(self.shares) - 1.0) > 1e-3:
            raise ValueError("shares must be positive and add up to 1")


@dataclass(frozen=True)
class CityReference:
    """One city's reference: the bins of every monitored quantity, in `DRIFT_QUANTITIES`'
    order (a quantity constant in the reference has no bins and is not monitored)."""

    trained: bool  # the version's training drew windows in this city
    pairs: int
    quantities: Mapping[str, QuantityBins]


@dataclass(frozen=True)
class DriftReference:
    model: str
    version: int
    cities: Mapping[str, CityReference]

    def to_dict(self, **provenance: Any) -> dict[str, Any]:
        """The file's content; ``provenance`` (command, seed, windows) is kept as given."""
        return {
            "format": REFERENCE_FORMAT,
            "model": self.model,
            "version": self.version,
            **provenance,
            "statistic": "psi",
            "cities": {
                city: {
                    "trained": ref.trained,
                    "pairs": ref.pairs,
                    "quantities": {
                        name: {"edges": list(bins.edges), "shares": list(bins.shares)}
                        for name, bins in ref.quantities.items()
                    },
                }
                for city, ref in self.cities.items()
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DriftReference:
        """ValueError naming the entry where the file breaks a rule."""
        if data.get("format") != REFERENCE_FORMAT:
            raise ValueError(f"format: expected {REFERENCE_FORMAT!r}, got {data.get('format')!r}")
        cities: dict[str, CityReference] = {}
        for city, entry in dict(data["cities"]).items():
            quantities: dict[str, QuantityBins] = {}
            for name, bins in dict(entry["quantities"]).items():
                if name not in DRIFT_QUANTITIES:
                    raise ValueError(f"cities.{city}.quantities: {name!r} is not monitored")
                try:
                    quantities[name] = QuantityBins(
                        tuple(float(v) for v in bins["edges"]),
                        tuple(float(v) for v in bins["shares"]),
                    )
                except (KeyError, TypeError, ValueError) as exc:
                    raise ValueError(f"cities.{city}.quantities.{name}: {exc}") from None
            cities[str(city)] = CityReference(
                trained=bool(entry["trained"]), pairs=int(entry["pairs"]), quantities=quantities
            )
        return cls(model=str(data["model"]), version=int(data["version"]), cities=cities)


def read_reference(version_dir: Path, trusted: TrustedKeys | None = None) -> DriftReference:
    """A version folder's drift reference (verified with the folder where keys are given);
    FileNotFoundError without one, SigningError or ValueError when it cannot be used."""
    path = version_dir / DRIFT_REFERENCE_FILE
    raw = path.read_bytes() if trusted is None else read_verified(version_dir, path.name, trusted)
    return DriftReference.from_dict(json.loads(raw))


def quantity_bins(values: NDArray[Any], bins: int = REFERENCE_BINS) -> QuantityBins | None:
    """The reference bins of one quantity: cut at its interior quantiles (rounded to 6
    significant digits, so the file is stable), with every empty bin merged into its
    neighbour; None when the values hold one bin only (a constant)."""
    x = np.asarray(values, dtype=np.float64)
    levels = np.arange(1, bins) / bins
    edges = sorted({float(f"{q:.6g}") for q in np.quantile(x, levels).tolist()})
    while True:
        counts = bin_counts(x, edges)
        empty = np.flatnonzero(counts == 0)
        if empty.size == 0:
            break
        gone = int(empty[0])  # bin i lies below edges[i]: drop that edge (the last: edges[-1])
        del edges[min(gone, len(edges) - 1)]
    if not edges:
        return None
    shares = tuple(float(f"{s:.6g}") for s in (counts / counts.sum()).tolist())
    return QuantityBins(tuple(edges), shares)


def bin_counts(values: NDArray[Any], edges: Sequence[float]) -> NDArray[np.int64]:
    """How many ``values`` fall in each bin of ``edges`` (`QuantityBins`' rule)."""
    index = np.searchsorted(np.asarray(edges, dtype=np.float64), values, side="right")
    return np.bincount(index, minlength=len(edges) + 1).astype(np.int64)


def psi(live_counts: Sequence[float], reference_shares: Sequence[float]) -> float:
    """Population stability index of live bin counts against reference shares: sum over bins
    of (live - reference) * ln(live / reference), shares floored at `PSI_FLOOR` (as the
    recording rule does). 0 for no live pairs."""
    counts = np.asarray(live_counts, dtype=np.float64)
    total = counts.sum()
    if total <= 0:
        return 0.0
    live = np.maximum(counts / total, PSI_FLOOR)
    ref = np.maximum(np.asarray(reference_shares, dtype=np.float64), PSI_FLOOR)
    return float(np.sum((live - ref) * np.log(live / ref)))


# ---- serving: counts per reference bin, off the request path --------------------------------

ReferenceLoader = Callable[[int], DriftReference]


@dataclass(frozen=True, eq=False)
class _Scored:
    city: str
    versions: NDArray[np.int32]  # [valid pairs] the version that scored each pair
    features: NDArray[np.float32]  # [valid pairs, monitored features]
    objectives: NDArray[np.float32]  # [valid pairs, 3]


@dataclass
class DriftMonitor:
    """Counts scored pairs into their version's reference bins per city.

    `observe` (on the request path) only keeps the window's valid pairs (at most
    `MAX_PAIRS_PER_WINDOW`) in a bounded queue;
    a thread of its own bins them every `interval_s` and records the counts into ``sink``
    (one counter increment per series and flush, whatever the traffic), and the reference
    shares of a (version, city) the first time it is seen. A version without a readable
    reference, and the rule-based answers (version 0), are not counted; why is told once
    through ``on_error``. A full queue drops the oldest windows (drift is a sample).
    """

    sink: MetricsSink
    loader: ReferenceLoader
    interval_s: float = 10.0
    max_queued: int = 2_000
    on_error: Callable[[str], None] | None = None
    _queue: deque[_Scored] = field(init=False, repr=False)
    _references: dict[int, DriftReference | None] = field(init=False, repr=False)
    _seen: set[tuple[int, str]] = field(init=False, repr=False)
    _stop: threading.Event = field(init=False, repr=False)
    _thread: threading.Thread | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        self._queue = deque(maxlen=self.max_queued)
        self._references = {}
        self._seen = set()
        self._stop = threading.Event()

    def start(self) -> DriftMonitor:
        self._thread = threading.Thread(target=self._run, name="drift", daemon=True)
        self._thread.start()
        return self

    def observe(
        self,
        city: str | None,
        pair_features: NDArray[np.float32],
        candidates: NDArray[np.int32],
        objectives: NDArray[np.float32],
        order_versions: NDArray[np.int32],
    ) -> None:
        """One answered window: [B*N, F] pair features and [B*N, 3] objectives, row-major
        over (order, candidate slot); [B, N] candidate rider rows (-1 = none); [B] the
        version that scored each order (0 = rule-based)."""
        if city is None:  # features sent by the caller: no city, no reference
            return
        slots = np.asarray(candidates).reshape(-1)
        valid = np.flatnonzero(slots >= 0)
        if valid.size > MAX_PAIRS_PER_WINDOW:
            valid = valid[:: -(-valid.size // MAX_PAIRS_PER_WINDOW)]
        width = max(int(np.asarray(candidates).shape[-1]), 1)
        versions = np.asarray(order_versions, dtype=np.int32)[valid // width]
        self._queue.append(
            _Scored(
                city,
                versions,
                np.asarray(pair_features)[valid][:, _FEATURE_COLUMNS],
                np.asarray(objectives)[valid],
            )
        )

    def observe_routed(
        self, city: str | None, encoded: Mapping[str, NDArray[Any]], routed: RoutedScores
    ) -> None:
        """`observe` for an answered window's encoder outputs and routed scores."""
        self.observe(
            city,
            encoded[PAIR_FEATURES.name],
            encoded[CANDIDATE_RIDER_INDEX.name],
            routed.objectives,
            routed.model_version,
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def flush(self) -> None:
        """Bin what is queued and record it."""
        scored: list[_Scored] = []
        while self._queue:
            scored.append(self._queue.popleft())
        if scored:
            self.sink.record(self.observations(scored))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()

    def reference(self, version: int) -> DriftReference | None:
        if version not in self._references:
            try:
                self._references[version] = self.loader(version)
            except Exception as exc:  # no file, unreadable, refused: not monitored
                self._references[version] = None
                if self.on_error is not None:
                    self.on_error(f"version {version}: no drift reference: {exc}")
        return self._references[version]

    def observations(self, scored: Iterable[_Scored]) -> list[Observation]:
        """The counter increments (and first-seen reference shares) of these windows."""
        groups: dict[tuple[int, str], list[tuple[NDArray[Any], NDArray[Any]]]] = {}
        for item in scored:
            for version in np.unique(item.versions).tolist():
                rows = item.versions == version
                key = (int(version), item.city)
                groups.setdefault(key, []).append((item.features[rows], item.objectives[rows]))
        out: list[Observation] = []
        for (version, city), parts in groups.items():
            reference = None if version == 0 else self.reference(version)
            city_ref = None if reference is None else reference.cities.get(city)
            if city_ref is None:
                continue
            columns = np.concatenate(
                [np.concatenate([f, o], axis=1) for f, o in parts], axis=0, dtype=np.float64
            )
            first = (version, city) not in self._seen
            self._seen.add((version, city))
            for column, name in enumerate(DRIFT_QUANTITIES):
                bins = city_ref.quantities.get(name)
                if bins is None:
                    continue
                counts = bin_counts(columns[:, column], bins.edges).tolist()
                for number, count in enumerate(counts):
                    labels = (
                        ("model_version", str(version)),
                        ("city", city),
                        ("quantity", name),
                        ("bin", str(number)),
                    )
                    if count or first:  # every bin's series exists from the start
                        out.append(Observation(DRIFT_BIN_PAIRS, float(count), labels))
                    if first:
                        out.append(Observation(DRIFT_REFERENCE_SHARE, bins.shares[number], labels))
        return out


def drift_monitor(
    repository: Path,
    scoring_model: str,
    sink: MetricsSink,
    *,
    trusted: TrustedKeys | None = None,
    on_error: Callable[[str], None] | None = None,
    interval_s: float = 10.0,
) -> DriftMonitor:
    """A started monitor reading each version's reference from its folder in ``repository``
    (verified like its weights where ``trusted`` keys are configured)."""
    layout = model_layout(repository, scoring_model)
    return DriftMonitor(
        sink,
        lambda version: read_reference(layout.version(version), trusted),
        interval_s=interval_s,
        on_error=on_error,
    ).start()
