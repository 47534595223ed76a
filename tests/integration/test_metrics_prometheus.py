"""Triton's own metrics and the project's custom metrics, scraped by a real Prometheus.

Starts `prometheus` (Debian package, installed by `make setup`) on a free loopback port with
a 1 s scrape of the session server's metrics port, sends real dispatch traffic and some bad
requests, and reads the results back through Prometheus's HTTP API. Each test sends its
own traffic and reads deltas from a settled start (the session server also serves the other
integration modules), so none depends on another or on the order they run in. Every wait
polls with a deadline scaled to the host; Prometheus is stopped at the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from patience import wait_for
from prometheus_helpers import Prometheus, running_prometheus
from tritonclient.utils import InferenceServerException

from dispatch_service.core.metrics import (
    ALL_METRICS,
    CANDIDATE_BUCKETS,
    LATENCY_BUCKETS_MS,
)
from dispatch_service.ops.server import TritonServer
from dispatch_service.pipeline.step_metrics import capacity_conflicts
from dispatch_service.routing.settings import IN_PROCESS_ROUTING_MODELS
from triton_helpers import infer_grpc, sim_window

DEADLINE_S = 45.0  # before `patience`: a bound on the test's run time, never on the server
SCRAPE_S = 1.0
TRITON_METRICS = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
)


def _poll(what: str, check: Callable[[], bool], deadline_s: float = DEADLINE_S) -> None:
    wait_for(check, what, deadline_s, 0.25)


@pytest.fixture(scope="module")
def prometheus(
    triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    work = tmp_path_factory.mktemp("prometheus")
    with running_prometheus(work, {"triton": triton.metrics_url}, SCRAPE_S) as server:
        _poll("first scrape of the server", lambda: server.value('up{job="triton"}') == 1.0)
        yield server


def _counts(prom: Prometheus) -> dict[str, Any]:
    return {
        "encoder": prom.value("dispatch_encoder_latency_ms_count"),
        "resolver": prom.value("dispatch_resolver_latency_ms_count"),
        "candidates": prom.value("dispatch_candidates_per_order_count"),
        "conflicts": prom.value("dispatch_capacity_conflicts_total"),
        "rejections": prom.by_labels(
            "sum by (model, tensor, rule) (dispatch_validation_rejections_total)",
            "model",
            "tensor",
            "rule",
        ),
        "success": prom.value('nv_inference_request_success{model="dispatch"}'),
        "failure": prom.value('nv_inference_request_failure{model="dispatch"}'),
        "queue_us": prom.value("nv_inference_queue_duration_us"),
    }


def _bad_windows() -> list[tuple[tuple[str, str, str], dict[str, np.ndarray[Any, Any]]]]:
    """(expected model, tensor, rule label) and the window that breaks it."""
    bad = []
    for seed in range(3):
        window = sim_window(100 + seed, 6, 12)
        fields = window["ORDER_FIELDS"].copy()
        fields[seed, 0] = 95.0  # pickup_lat
        window["ORDER_FIELDS"] = fields
        bad.append((("feature_encoder", "ORDER_FIELDS[pickup_lat, pickup_lon]", "range"), window))
    for seed in range(2):
        window = sim_window(200 + seed, 4, 8)
        window["ORDER_IDS"] = np.array([b"a", b"b", b"a", b"c"], dtype=object)
        bad.append((("feature_encoder", "ORDER_IDS", "unique"), window))
    window = sim_window(300, 3, 5)
    window["WINDOW_FIELDS"] = np.array([window["WINDOW_FIELDS"][0], 9.0])  # no datum 9
    bad.append((("feature_encoder", "WINDOW_FIELDS[coord_system]", "unknown_value"), window))
    return bad


def _settled(prom: Prometheus) -> dict[str, Any]:
    """The counts once they stopped moving: alike over three scrapes, so that what other
    tests sent before has reached Prometheus and the deltas that follow are this test's."""
    readings = [_counts(prom)]

    def still() -> bool:
        time.sleep(3 * SCRAPE_S)
        readings.append(_counts(prom))
        return readings[-1] == readings[-2]

    _poll("the counts settle before the test's own traffic", still, 120)
    return readings[-1]


def test_traffic_moves_triton_and_custom_metrics_in_prometheus(
    prometheus: Prometheus, grpc_client: grpcclient.InferenceServerClient
) -> None:
    before = _settled(prometheus)

    # Good windows, some with far fewer riders than orders so capacity forces conflicts.
    conflicts = 0
    sizes = [(20, 40), (64, 20), (30, 8), (5, 50), (12, 3)]
    for seed, (orders, riders) in enumerate(sizes):
        out = infer_grpc(grpc_client, sim_window(seed, orders, riders))
        conflicts += capacity_conflicts(
            out["TOPK_RIDER_INDEX"],
            out["TOPK_OBJECTIVES"][..., 0],
            out["ASSIGNED_RIDER_INDEX"],
            out["ASSIGNED_SCORE"],
        )
    assert conflicts > 0
    bad = _bad_windows()
    for _, window in bad:
        with pytest.raises(InferenceServerException):
            infer_grpc(grpc_client, window)
    expected_rejections: dict[tuple[str, ...], float] = {}
    for labels, _ in bad:
        expected_rejections[labels] = expected_rejections.get(labels, 0.0) + 1.0

    good = len(sizes)  # <= the histogram sample per flush, so every window is counted
    seen: dict[str, Any] = {}

    def moved() -> bool:
        seen.update(_counts(prometheus))
        rejections = {
            labels: seen["rejections"].get(labels, 0.0) - before["rejections"].get(labels, 0.0)
            for labels in set(seen["rejections"]) | set(before["rejections"])
        }
        seen["rejection_deltas"] = {k: v for k, v in rejections.items() if v}
        return bool(
            seen["encoder"] - before["encoder"] == good
            and seen["resolver"] - before["resolver"] == good
            and seen["candidates"] - before["candidates"] == good
            and seen["conflicts"] - before["conflicts"] == conflicts
            and seen["success"] - before["success"] == good
            # this Triton build counts a failed ensemble request more than once (reason OTHER)
            and seen["failure"] - before["failure"] >= len(bad)
            and seen["rejection_deltas"] == expected_rejections
        )

    try:
        _poll("the traffic shows in Prometheus", moved)
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\nbefore: {before}\nlast seen: {seen}\n"
            f"expected: {good} good windows, {conflicts} conflicts, "
            f"rejections {expected_rejections}"
        ) from None
    assert seen["queue_us"] > before["queue_us"]


def test_metric_names_and_labels(
    prometheus: Prometheus, grpc_client: grpcclient.InferenceServerClient
) -> None:
    # Its own traffic: a good window (the unlabelled series), one that forces capacity
    # conflicts and a refused one (the labelled series appear with their first value).
    before = _settled(prometheus)
    infer_grpc(grpc_client, sim_window(7, 4, 10))
    infer_grpc(grpc_client, sim_window(1, 64, 20))
    (expected_labels, bad_window), *_ = _bad_windows()
    with pytest.raises(InferenceServerException):
        infer_grpc(grpc_client, bad_window)

    def scraped() -> bool:
        now = _counts(prometheus)
        return bool(
            now["resolver"] - before["resolver"] >= 2
            and now["conflicts"] > before["conflicts"]
            and now["rejections"].get(expected_labels, 0.0)
            > before["rejections"].get(expected_labels, 0.0)
        )

    _poll("this test's windows are scraped", scraped)
    names = prometheus.names()
    missing = [name for name in TRITON_METRICS if name not in names]
    assert not missing, f"Triton metrics not scraped: {missing}"
    for spec in ALL_METRICS:
        if spec.kind.value == "histogram":
            expected = {f"{spec.name}_bucket", f"{spec.name}_sum", f"{spec.name}_count"}
        else:
            expected = {spec.name}
        assert expected <= names, f"{spec.name}: {sorted(expected - names)} not scraped"

    models = {
        "dispatch_encoder_latency_ms_count": "feature_encoder",
        "dispatch_candidates_per_order_count": "feature_encoder",
        "dispatch_resolver_latency_ms_count": "topk_resolver",
        "dispatch_capacity_conflicts_total": "topk_resolver",
    }
    for name, model in models.items():
        series = prometheus.query(name)
        assert series, name
        # dispatch_fused and its lane run the same steps and record the same families under
        # their own names
        assert model in {sample["metric"]["model"] for sample in series}, name
        for sample in series:
            labels = sample["metric"]
            assert labels["model"] in {model, *IN_PROCESS_ROUTING_MODELS}, labels
            assert labels["version"] == "1", labels

    for name, buckets in (
        ("dispatch_encoder_latency_ms_bucket", LATENCY_BUCKETS_MS),
        ("dispatch_resolver_latency_ms_bucket", LATENCY_BUCKETS_MS),
        ("dispatch_candidates_per_order_bucket", CANDIDATE_BUCKETS),
    ):
        bounds = {float(sample["metric"]["le"]) for sample in prometheus.query(name)}
        assert bounds == {*buckets, float("inf")}, name

    rejections = prometheus.query("dispatch_validation_rejections_total")
    assert rejections, "no rejection series"
    for sample in rejections:
        labels = sample["metric"]
        assert set(labels) >= {"model", "version", "tensor", "rule"}, labels
        assert labels["rule"].isidentifier() and " " not in labels["rule"], labels
        # a tensor, or columns of a packed one: ORDER_FIELDS[pickup_lat, pickup_lon]
        assert labels["tensor"].split("[")[0].isupper(), labels


def _logged_events(log: Path, event: str) -> list[dict[str, Any]]:
    """JSON log lines of one event from the server log (Triton quotes each message)."""
    found = []
    for line in log.read_text(errors="replace").splitlines():
        if f'\\"event\\": \\"{event}\\"' not in line and f'"event": "{event}"' not in line:
            continue
        message = line.split("] ", 1)[1]
        text = json.loads(message) if message.startswith('"') else message
        found.append(json.loads(text))
    return found


def test_each_model_instance_logged_its_load(triton: TritonServer) -> None:
    loaded = _logged_events(triton.log_path, "model_loaded")
    models = {entry["model"] for entry in loaded}
    assert {"feature_encoder", "dispatch_model", "topk_resolver"} <= models, loaded
    for entry in loaded:
        assert set(entry) >= {"event", "model", "version", "instance"}, entry
        assert entry["version"].isdigit() and entry["instance"].startswith(entry["model"])
    instances = [(entry["model"], entry["version"], entry["instance"]) for entry in loaded]
    assert len(instances) == len(set(instances)), "one line per instance"
