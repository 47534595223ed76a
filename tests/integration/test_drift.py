"""dispatch_fused counts every scored pair into its version's drift reference bins, per city:
the counters on Triton's metrics port equal counts computed here from the windows, the
version's model.onnx in ONNX Runtime and the reference file read as plain JSON."""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from dispatch_client import DispatchClient
from dispatch_contract import MODEL_INPUTS, OBJECTIVES, PAIR_FEATURE_NAMES
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import (
    DRIFT_REFERENCE_FILE,
    ONNX_FILE,
    SCORING_MODEL,
    model_layout,
)
from dispatch_service.domain.features import EncoderSettings, encode_window
from dispatch_service.domain.window import window_to_tensors
from dispatch_service.offline import simulator
from dispatch_service.ops.server import TritonServer

from .patience import wait_for
from .triton_helpers import metric_series

SCORING = model_layout(MODEL_REPOSITORY, SCORING_MODEL)
BINS = "dispatch_drift_bin_pairs_total"
SHARES = "dispatch_drift_reference_share"
FLUSH_S = 10.0  # DriftMonitor's interval


def _totals(url: str) -> Counter[tuple[str, str, str, str]]:
    """dispatch_fused's bin counters, summed over its stubs (pid)."""
    totals: Counter[tuple[str, str, str, str]] = Counter()
    for labels, value in metric_series(url, BINS):
        if labels["model"] == "dispatch_fused":
            key = (labels["model_version"], labels["city"], labels["quantity"], labels["bin"])
            totals[key] += value
    return totals


def _expected(windows: list[tuple[Any, Any, list[int]]]) -> Counter[tuple[str, str, str, str]]:
    """Bin counts computed from the windows, without the serving code's drift module."""
    expected: Counter[tuple[str, str, str, str]] = Counter()
    sessions: dict[int, ort.InferenceSession] = {}
    references: dict[int, dict[str, Any]] = {}
    names = [n for n in PAIR_FEATURE_NAMES if n not in ("hour_sin", "hour_cos", "is_weekend")]
    for window, world, versions in windows:
        encoded = encode_window(window, world.map, EncoderSettings())
        slots = encoded.candidate_rider_index
        valid = np.flatnonzero(slots.reshape(-1) >= 0)
        features = encoded.pair_features[valid].astype(np.float32)
        order_version = np.asarray(versions)[valid // slots.shape[1]]
        for version in sorted(set(order_version.tolist())):
            if version not in sessions:
                sessions[version] = ort.InferenceSession(
                    str(SCORING.version(version) / ONNX_FILE), providers=["CPUExecutionProvider"]
                )
                references[version] = json.loads(
                    (SCORING.version(version) / DRIFT_REFERENCE_FILE).read_text()
                )
            rows = features[order_version == version]
            predicted = sessions[version].run(None, {MODEL_INPUTS[0].name: rows})[0]
            columns = {
                **{n: rows[:, PAIR_FEATURE_NAMES.index(n)] for n in names},
                **{n: predicted[:, i] for i, n in enumerate(OBJECTIVES)},
            }
            city = references[version]["cities"][world.map.id]["quantities"]
            for name, bins in city.items():
                index = np.searchsorted(np.asarray(bins["edges"]), columns[name], side="right")
                for number, count in enumerate(np.bincount(index, minlength=len(bins["shares"]))):
                    expected[(str(version), world.map.id, name, str(number))] += int(count)
    return expected


def test_fused_counts_each_scored_pair_in_its_versions_reference_bins(
    triton: TritonServer,
) -> None:
    # Earlier traffic (the load's warm-up, other modules) is flushed before the baseline.
    time.sleep(FLUSH_S + 2.0)
    before = _totals(triton.metrics_url)
    worlds = simulator.city_worlds()
    rng = np.random.default_rng(46)
    sent: list[tuple[Any, Any, list[int]]] = []
    with DispatchClient.grpc(triton.grpc_url, model_name="dispatch_fused") as client:
        for number in range(6):
            world = worlds[("shanghai", "chengdu")[number % 2]]
            window = simulator.generate_window(rng, 12, 60, config=world)
            tensors: dict[str, Any] = window_to_tensors(window)
            if number >= 4:  # version 2 by its tag: counted under its own reference
                tensors["MODEL_VERSION_TAG"] = np.array([b"2"], dtype=object)
            result = client.dispatch(tensors)
            sent.append((window, world, [int(o.model_version or 0) for o in result.orders]))
    expected = _expected(sent)
    assert {key[0] for key in expected} == {"1", "2"}
    assert {key[1] for key in expected} == {"shanghai", "chengdu"}

    def delta() -> Counter[tuple[str, str, str, str]]:
        after = _totals(triton.metrics_url)
        return Counter({key: after[key] - before[key] for key in after if after[key] > before[key]})

    wait_for(lambda: delta() == +expected, "the drift counters of the windows sent", 4 * FLUSH_S)
    # Each (version, city) seen exports its reference shares, as the file has them.
    shares = {
        (labels["model_version"], labels["city"], labels["quantity"], labels["bin"]): value
        for labels, value in metric_series(triton.metrics_url, SHARES)
        if labels["model"] == "dispatch_fused"
    }
    reference = json.loads((SCORING.version(2) / DRIFT_REFERENCE_FILE).read_text())
    eta = reference["cities"]["chengdu"]["quantities"]["eta_minutes"]["shares"]
    assert [shares[("2", "chengdu", "eta_minutes", str(b))] for b in range(len(eta))] == (
        pytest.approx(eta)
    )
