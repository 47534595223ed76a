"""Drift reference bins, the PSI and the serving-side counts, against hand-computed values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from dispatch_contract import PAIR_FEATURE_NAMES
from dispatch_service.core.metrics import InMemoryMetrics
from dispatch_service.core.repository_layout import DRIFT_REFERENCE_FILE
from dispatch_service.pipeline.drift import (
    DRIFT_BIN_PAIRS,
    DRIFT_QUANTITIES,
    DRIFT_REFERENCE_SHARE,
    MAX_PAIRS_PER_WINDOW,
    CityReference,
    DriftMonitor,
    DriftReference,
    QuantityBins,
    bin_counts,
    psi,
    quantity_bins,
    read_reference,
)


def test_deciles_of_1_to_100_hold_ten_values_each() -> None:
    bins = quantity_bins(np.arange(1, 101))
    assert bins is not None
    # numpy's linear quantile of 1..100 at 0.1 is 1 + 0.1 * 99 = 10.9, and so on.
    assert bins.edges == pytest.approx([1 + 0.1 * k * 99 for k in range(1, 10)])
    assert bins.shares == pytest.approx([0.1] * 10)


def test_a_binary_feature_gets_two_bins_with_its_frequencies() -> None:
    values = np.array([0.0] * 70 + [1.0] * 30)
    bins = quantity_bins(values)
    # Deciles 0 (x6) and 0.3 (the 0.7 quantile interpolates 0 and 1): the empty bins merge.
    assert bins == QuantityBins((0.3,), (0.7, 0.3))


def test_a_constant_is_not_monitored() -> None:
    assert quantity_bins(np.full(50, 2.5)) is None


def test_bin_counts_put_a_value_on_an_edge_in_the_bin_above() -> None:
    assert bin_counts(np.array([0.5, 1.0, 1.5, 2.0, 7.0]), [1.0, 2.0]).tolist() == [1, 2, 2]


def test_psi_matches_the_formula_by_hand() -> None:
    expected = (0.3 - 0.5) * math.log(0.3 / 0.5) + (0.7 - 0.5) * math.log(0.7 / 0.5)
    assert psi([30, 70], [0.5, 0.5]) == pytest.approx(expected)
    assert psi([50, 50], [0.5, 0.5]) == 0.0
    assert psi([0, 0], [0.5, 0.5]) == 0.0
    # An empty live bin is floored at 1e-4, not infinite.
    floored = (1e-4 - 0.5) * math.log(1e-4 / 0.5) + (1.0 - 0.5) * math.log(1.0 / 0.5)
    assert psi([0, 10], [0.5, 0.5]) == pytest.approx(floored)


def _reference(version: int = 1) -> DriftReference:
    quantities = {name: QuantityBins((1.0, 2.0), (0.25, 0.5, 0.25)) for name in DRIFT_QUANTITIES}
    return DriftReference(
        model="dispatch_model",
        version=version,
        cities={"shanghai": CityReference(trained=True, pairs=100, quantities=quantities)},
    )


def test_the_reference_file_round_trips_and_bad_entries_are_named(tmp_path: Path) -> None:
    ref = _reference()
    (tmp_path / DRIFT_REFERENCE_FILE).write_text(json.dumps(ref.to_dict(seed=7)))
    assert read_reference(tmp_path) == ref
    bad = ref.to_dict()
    bad["cities"]["shanghai"]["quantities"]["pickup_distance_km"]["shares"] = [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match=r"cities\.shanghai\.quantities\.pickup_distance_km"):
        DriftReference.from_dict(bad)
    bad = ref.to_dict()
    bad["cities"]["shanghai"]["quantities"]["hour_sin"] = {"edges": [0.0], "shares": [0.5, 0.5]}
    with pytest.raises(ValueError, match="'hour_sin' is not monitored"):
        DriftReference.from_dict(bad)
    with pytest.raises(ValueError, match="format"):
        DriftReference.from_dict({**ref.to_dict(), "format": "other"})


def _labels(version: str, city: str, quantity: str, number: int) -> dict[str, str]:
    return {"model_version": version, "city": city, "quantity": quantity, "bin": str(number)}


def test_the_monitor_counts_each_valid_pair_in_its_versions_bins() -> None:
    sink = InMemoryMetrics()
    errors: list[str] = []
    references = {1: _reference(1)}

    def load(version: int) -> DriftReference:
        return references[version]  # KeyError: no reference for that version

    monitor = DriftMonitor(sink, load, on_error=errors.append)
    # 2 orders x 3 slots; order 0 scored by version 1, order 1 by version 2 (no reference).
    candidates = np.array([[4, 7, -1], [2, -1, -1]], dtype=np.int32)
    features = np.zeros((6, len(PAIR_FEATURE_NAMES)), dtype=np.float32)
    column = PAIR_FEATURE_NAMES.index("pickup_distance_km")
    features[:, column] = [0.5, 1.5, 9.0, 2.5, 0.0, 0.0]  # slot 2 of order 0 is no candidate
    objectives = np.zeros((6, 3), dtype=np.float32)
    objectives[:, 0] = [3.0, 2.5, 9.0, 0.2, 0.0, 0.0]  # eta_minutes
    monitor.observe("shanghai", features, candidates, objectives, np.array([1, 2], np.int32))
    monitor.observe("shanghai", features, candidates, objectives, np.array([0, 1], np.int32))
    monitor.observe(None, features, candidates, objectives, np.array([1, 1], np.int32))
    monitor.flush()
    # Version 1 scored order 0 of the first window (pairs 0.5, 1.5) and order 1 of the second
    # (pair 2.5); version 0 (rule-based) and version 2 (no reference) count nothing.
    assert [sink.counter(DRIFT_BIN_PAIRS, **_labels("1", "shanghai", "pickup_distance_km", b))
            for b in range(3)] == [1.0, 1.0, 1.0]  # fmt: skip
    assert [sink.counter(DRIFT_BIN_PAIRS, **_labels("1", "shanghai", "eta_minutes", b))
            for b in range(3)] == [1.0, 0.0, 2.0]  # fmt: skip
    assert all(key[1][0] == ("model_version", "1") for key in sink.counters)
    assert (
        sink.gauges[
            (DRIFT_REFERENCE_SHARE.name, tuple(_labels("1", "shanghai", "eta_minutes", 1).items()))
        ]
        == 0.5
    )
    assert len(errors) == 1 and errors[0].startswith("version 2: no drift reference")
    # A second flush adds only non-empty bins and sets no gauge again.
    sink.gauges.clear()
    monitor.observe("shanghai", features, candidates, objectives, np.array([1, 1], np.int32))
    monitor.flush()
    assert [sink.counter(DRIFT_BIN_PAIRS, **_labels("1", "shanghai", "pickup_distance_km", b))
            for b in range(3)] == [2.0, 2.0, 2.0]  # fmt: skip
    assert sink.gauges == {}
    assert len(errors) == 1


def test_a_city_missing_from_the_reference_is_not_counted() -> None:
    sink = InMemoryMetrics()
    monitor = DriftMonitor(sink, lambda version: _reference(version))
    features = np.ones((2, len(PAIR_FEATURE_NAMES)), dtype=np.float32)
    monitor.observe(
        "beijing", features, np.array([[0, 1]], np.int32), np.ones((2, 3), np.float32),
        np.array([1], np.int32),
    )  # fmt: skip
    monitor.flush()
    assert sink.counters == {}


def test_the_thread_flushes_and_close_records_the_rest() -> None:
    sink = InMemoryMetrics()
    monitor = DriftMonitor(sink, lambda version: _reference(version), interval_s=3600).start()
    features = np.ones((1, len(PAIR_FEATURE_NAMES)), dtype=np.float32)
    monitor.observe(
        "shanghai", features, np.array([[0]], np.int32), np.ones((1, 3), np.float32),
        np.array([1], np.int32),
    )  # fmt: skip
    monitor.close()  # long before the interval: close itself records what is queued
    assert sink.counter(DRIFT_BIN_PAIRS, **_labels("1", "shanghai", "eta_minutes", 1)) == 1.0


def test_a_large_window_is_counted_by_a_stride_of_its_pairs() -> None:
    sink = InMemoryMetrics()
    monitor = DriftMonitor(sink, lambda version: _reference(version))
    orders, slots = 40, 32  # 1,280 valid pairs: every 3rd counted (ceil(1280 / 512) = 3)
    assert MAX_PAIRS_PER_WINDOW == 512
    features = np.zeros((orders * slots, len(PAIR_FEATURE_NAMES)), dtype=np.float32)
    features[:, PAIR_FEATURE_NAMES.index("pickup_distance_km")] = np.arange(orders * slots) % 3
    candidates = np.zeros((orders, slots), dtype=np.int32)
    objectives = np.zeros((orders * slots, 3), dtype=np.float32)
    monitor.observe("shanghai", features, candidates, objectives, np.ones(orders, np.int32))
    monitor.flush()
    counts = [
        sink.counter(DRIFT_BIN_PAIRS, **_labels("1", "shanghai", "pickup_distance_km", b))
        for b in range(3)
    ]
    # Pairs 0, 3, 6, ...: 427 of them, every one with pickup_distance_km 0 (bin 0).
    assert counts == [427.0, 0.0, 0.0]
