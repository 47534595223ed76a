"""Server-side canary, shadow traffic and the fallback chain on a live server.

These tests change the server's state (its routing, loaded dispatch_model versions), so they
run against the routing server (conftest `routing_triton`, put back to the shipped state after
each module that changes it), never the session server the other integration tests share.
Routing changes as on every replica: a revision applied through the live routing file
(`fleet_helpers.apply_revision`). Every test puts back what it changed.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from dispatch_contract import pack_window
from dispatch_service.domain import geo
from dispatch_service.domain.features import feasible_mask
from dispatch_service.domain.window import window_from_tensors, window_to_tensors
from dispatch_service.offline.simulator import generate_window
from dispatch_service.ops.fleet_state import FleetState
from dispatch_service.ops.model_control import (
    load_model,
    model_config,
    ready_versions,
    unload_model,
    with_versions,
)
from dispatch_service.ops.server import TritonServer
from dispatch_service.routing.live import read_entry_points, write_routing_file
from dispatch_service.routing.settings import FUSED_MODEL_NAME, CityRoute, RouterSettings
from fleet_helpers import ROUTING_ADMIN_KEY, apply_revision
from triton_helpers import ROUTED_OUTPUT_NAMES, infer_http, metric_series

Arrays = dict[str, np.ndarray[Any, Any]]
ADMIN_KEY = ROUTING_ADMIN_KEY
SHIPPED = RouterSettings(stable_version=1, canary_version=2, scoring_versions=(1, 2))
METRICS_SETTLE_S = 0.2  # four flushes of the models' metrics thread
_REVISIONS = itertools.count(1)


@pytest.fixture(scope="module")
def server(routing_triton: TritonServer) -> TritonServer:
    """The session's routing server (conftest), in the shipped state when the module starts."""
    return routing_triton


@pytest.fixture(scope="module")
def client(server: TritonServer) -> Iterator[httpclient.InferenceServerClient]:
    http = httpclient.InferenceServerClient(server.http_url, network_timeout=120.0)
    yield http
    http.close()


@pytest.fixture
def router(server: TritonServer) -> Iterator[TritonServer]:
    """The server; routed back to the shipped settings after the test."""
    try:
        yield server
    finally:
        apply(server)


def apply(server: TritonServer, **changes: int) -> None:
    """The shipped routing with ``changes``, as the next revision (what a replica applies)."""
    routing = dataclasses.replace(SHIPPED, **changes)
    apply_revision(server, FleetState(next(_REVISIONS), (1, 2), routing), ADMIN_KEY)


def window(seed: int, orders: int, riders: int, users: int | None = None) -> Arrays:
    tensors = dict(window_to_tensors(generate_window(np.random.default_rng(seed), orders, riders)))
    count = orders if users is None else users
    ids = [f"user-{i % count}".encode() for i in range(orders)]
    tensors["ORDER_USER_IDS"] = np.array(ids, dtype=object)
    return tensors


def dispatch(
    client: httpclient.InferenceServerClient,
    tensors: Arrays,
    tag: str | None = None,
    model: str = "dispatch",
) -> Arrays:
    if tag is not None:
        tensors = {**tensors, "MODEL_VERSION_TAG": np.array([tag.encode()], dtype=object)}
    # the window's separate tensors, packed as contract v2 sends them
    return infer_http(client, pack_window(tensors), model=model, output_names=ROUTED_OUTPUT_NAMES)


def assert_valid(tensors: Arrays, result: Arrays) -> None:
    """Top-K consistent with the riders, sorted, feasible; nobody above capacity."""
    rider_ids = tensors["RIDER_IDS"]
    index, scores = result["TOPK_RIDER_INDEX"], result["TOPK_OBJECTIVES"][..., 0]
    assert index.shape[0] == len(tensors["ORDER_IDS"])
    for b in range(index.shape[0]):
        row = index[b][index[b] >= 0]
        assert len(row) >= 1
        assert ((row >= 0) & (row < len(rider_ids))).all()
        assert np.all(np.diff(scores[b][: len(row)]) <= 0)
    spare = np.maximum(tensors["RIDER_CAPACITY"] - tensors["RIDER_LOAD"], 0)
    assigned = result["ASSIGNED_RIDER_INDEX"]
    taken = np.bincount(assigned[assigned >= 0], minlength=len(rider_ids))
    assert np.all(taken <= spare), "a rider is over capacity"
    # The assignment is made over all N candidates, so an assigned rider may rank below the
    # Top-K list; it is a real rider either way.
    assert np.all(assigned[assigned >= 0] < len(rider_ids))


def metric(server: TritonServer, name: str, **labels: str) -> float:
    """Sum of the series of `name` whose labels include `labels` (0 when none).

    The models record metrics from a background thread every 50 ms (BackgroundMetrics), so
    a read first lets the values of requests already answered arrive.
    """
    time.sleep(METRICS_SETTLE_S)
    return sum(
        value
        for found, value in metric_series(server.metrics_url, name)
        if all(found.get(k) == v for k, v in labels.items())
    )


def metric_reaches(
    server: TritonServer, name: str, target: float, timeout_s: float = 10.0, **labels: str
) -> float:
    """The metric once it reaches `target` (or its value after `timeout_s`, to assert on)."""
    deadline = time.monotonic() + timeout_s
    value = metric(server, name, **labels)
    while value < target and time.monotonic() < deadline:
        value = metric(server, name, **labels)
    return value


# ---- routing -------------------------------------------------------------------------------


def test_shipped_settings_send_everyone_to_the_stable_version(
    router: TritonServer, client: httpclient.InferenceServerClient
) -> None:
    tensors = window(1, 64, 200)
    result = dispatch(client, tensors)
    assert result["ORDER_MODEL_VERSION"].dtype == np.int32
    assert result["ORDER_MODEL_VERSION"].tolist() == [1] * 64
    assert result["ORDER_FALLBACK_LEVEL"].tolist() == [0] * 64
    assert_valid(tensors, result)


def test_a_percentage_change_applies_to_the_next_request_and_sticks_per_user(
    router: TritonServer, client: httpclient.InferenceServerClient
) -> None:
    tensors = window(2, 1000, 400)
    apply(router, canary_percent=30)
    first = dispatch(client, tensors)["ORDER_MODEL_VERSION"]
    assert abs(float(np.mean(first == 2)) - 0.30) <= 0.05
    assert set(first.tolist()) == {1, 2}
    # The one-process entry point got the same settings: same user, same version, same answer.
    fused = dispatch(client, tensors, model=FUSED_MODEL_NAME)
    np.testing.assert_array_equal(fused["ORDER_MODEL_VERSION"], first)
    np.testing.assert_array_equal(
        fused["ASSIGNED_RIDER_INDEX"], dispatch(client, tensors)["ASSIGNED_RIDER_INDEX"]
    )

    # Same users, another window and another order: each keeps its version.
    again = window(3, 1000, 400)
    order = np.random.default_rng(0).permutation(1000)
    again["ORDER_USER_IDS"] = tensors["ORDER_USER_IDS"][order]
    np.testing.assert_array_equal(dispatch(client, again)["ORDER_MODEL_VERSION"], first[order])

    apply(router, canary_percent=60)
    wider = dispatch(client, tensors)["ORDER_MODEL_VERSION"]
    assert abs(float(np.mean(wider == 2)) - 0.60) <= 0.05
    assert np.all(wider[first == 2] == 2), "raising the share moved a canary user back"


def test_a_tag_forces_the_version(
    router: TritonServer, client: httpclient.InferenceServerClient
) -> None:
    tensors = window(4, 40, 150)
    for tag, version in (("canary", 2), ("stable", 1), ("2", 2), ("1", 1)):
        result = dispatch(client, tensors, tag)
        assert result["ORDER_MODEL_VERSION"].tolist() == [version] * 40, tag
        assert result["ORDER_FALLBACK_LEVEL"].tolist() == [0] * 40, tag
    absent = dispatch(client, tensors, "9")  # not served: the stable version answers
    assert absent["ORDER_MODEL_VERSION"].tolist() == [1] * 40
    assert absent["ORDER_FALLBACK_LEVEL"].tolist() == [1] * 40
    with pytest.raises(InferenceServerException, match="MODEL_VERSION_TAG") as info:
        dispatch(client, tensors, "newest")
    assert info.value.status() == "400"


def test_a_refused_routing_file_keeps_the_old_routing(
    router: TritonServer, client: httpclient.InferenceServerClient
) -> None:
    apply(router, canary_percent=20)
    routing_file = router.routing_file()
    assert routing_file is not None
    atlantis = dataclasses.replace(
        SHIPPED, canary_percent=90, city_routes=(CityRoute("atlantis", canary_percent=5),)
    )
    write_routing_file(routing_file, atlantis, 999)  # a city no registry holds

    def refused() -> bool:
        reports = [r for rs in read_entry_points(routing_file).values() for r in rs]
        return bool(reports) and all("atlantis" in r["error"] for r in reports)

    deadline = time.monotonic() + 30
    while not refused():
        assert time.monotonic() < deadline, read_entry_points(routing_file)
        time.sleep(0.1)
    for reports in read_entry_points(routing_file).values():
        assert {r["revision"] for r in reports} != {999}  # each keeps the revision it had
    result = dispatch(client, window(5, 200, 200))
    assert abs(float(np.mean(result["ORDER_MODEL_VERSION"] == 2)) - 0.20) <= 0.08


# ---- shadow --------------------------------------------------------------------------------


def test_shadow_scoring_changes_no_answer_and_exports_agreement(
    router: TritonServer, server: TritonServer, client: httpclient.InferenceServerClient
) -> None:
    tensors = window(6, 64, 200)
    plain = dispatch(client, tensors)
    labels = {"primary": "1", "shadow": "2", "model": "dispatch_router"}
    fused_labels = {**labels, "model": FUSED_MODEL_NAME}
    before = metric(server, "dispatch_shadow_orders_total", **labels)
    apply(router, shadow_percent=100)
    fused_before = metric(server, "dispatch_shadow_orders_total", **fused_labels)  # after warmup
    for _ in range(3):
        shadowed = dispatch(client, tensors)
        for name in ROUTED_OUTPUT_NAMES:
            np.testing.assert_array_equal(shadowed[name], plain[name], err_msg=name)
    orders = metric_reaches(server, "dispatch_shadow_orders_total", before + 3 * 64, **labels)
    assert orders - before == 3 * 64
    fused = dispatch(client, tensors, model=FUSED_MODEL_NAME)
    assert_valid(tensors, fused)
    fused_orders = metric_reaches(
        server, "dispatch_shadow_orders_total", fused_before + 64, **fused_labels
    )
    assert fused_orders - fused_before == 64
    agreed = metric(server, "dispatch_shadow_top1_agreements_total", **labels)
    pairs = metric(server, "dispatch_shadow_pairs_total", **labels)
    score_diff = metric(server, "dispatch_shadow_score_abs_diff_total", **labels)
    assert 0 < agreed <= metric(server, "dispatch_shadow_orders_total", **labels)
    assert pairs > 0 and 0 < score_diff / pairs < 0.5
    assert metric(server, "dispatch_router_model_calls_total", model_version="2", role="shadow")


# ---- fallback chain ------------------------------------------------------------------------


def nearest_feasible(tensors: Arrays) -> np.ndarray[Any, Any]:
    win = window_from_tensors(tensors)
    feasible = feasible_mask(win)
    out = np.full(win.num_orders, -1)
    for b in range(win.num_orders):
        if feasible[b].any():
            dist = geo.haversine_km(
                win.rider_position[:, 0], win.rider_position[:, 1], *win.pickup[b]
            )
            out[b] = int(np.argmin(np.where(feasible[b], dist, np.inf)))
    return out


def test_fallback_chain_under_injected_faults(
    router: TritonServer, server: TritonServer, client: httpclient.InferenceServerClient
) -> None:
    url = router.http_url
    tensors = window(7, 64, 200)
    served = model_config(url, "dispatch_model")
    router_only = {"model": "dispatch_router"}
    levels = {
        lvl: metric(server, "dispatch_router_orders_total", level=lvl, **router_only)
        for lvl in ("1", "2")
    }
    apply(router, canary_percent=100)
    try:
        assert dispatch(client, tensors)["ORDER_MODEL_VERSION"].tolist() == [2] * 64

        # The canary (version 2) is unloaded: the stable version answers at level 1.
        load_model(url, "dispatch_model", with_versions(served, [1]), admin_key=ADMIN_KEY)
        assert ready_versions(url, "dispatch_model", ADMIN_KEY) == (1,)
        result = dispatch(client, tensors)
        assert result["ORDER_FALLBACK_LEVEL"].tolist() == [1] * 64
        assert result["ORDER_MODEL_VERSION"].tolist() == [1] * 64
        assert_valid(tensors, result)

        # No version at all: the rule-based dispatcher answers at level 2, nearest first.
        unload_model(url, "dispatch_model", admin_key=ADMIN_KEY)
        result = dispatch(client, tensors)
        assert result["ORDER_FALLBACK_LEVEL"].tolist() == [2] * 64
        assert result["ORDER_MODEL_VERSION"].tolist() == [0] * 64
        assert_valid(tensors, result)
        np.testing.assert_array_equal(result["TOPK_RIDER_INDEX"][:, 0], nearest_feasible(tensors))
    finally:  # the served config as an override: a plain load would keep the [1] override
        load_model(url, "dispatch_model", served, admin_key=ADMIN_KEY)

    assert ready_versions(url, "dispatch_model", ADMIN_KEY) == (1, 2)
    result = dispatch(client, tensors)
    assert result["ORDER_FALLBACK_LEVEL"].tolist() == [0] * 64
    assert result["ORDER_MODEL_VERSION"].tolist() == [2] * 64
    for lvl in ("1", "2"):
        total = metric_reaches(
            server, "dispatch_router_orders_total", levels[lvl] + 64, level=lvl, **router_only
        )
        assert total - levels[lvl] == 64, lvl
    assert metric(server, "dispatch_router_fallbacks_total", model_version="2", level="1") >= 64


# ---- live change under load ----------------------------------------------------------------


def test_a_live_percentage_change_under_load_drops_no_request(
    router: TritonServer, server: TritonServer
) -> None:
    tensors = window(8, 32, 120)
    stop = threading.Event()
    failures: list[str] = []
    seen: list[set[int]] = []

    def load() -> None:  # its own client: tritonclient's HTTP client is not thread-safe
        http = httpclient.InferenceServerClient(server.http_url, network_timeout=60.0)
        deadline = time.monotonic() + 90.0
        try:
            for _ in range(2000):
                if stop.is_set() or time.monotonic() > deadline:
                    break
                try:
                    answer = dispatch(http, tensors)
                except Exception as exc:  # every failure is a dropped request
                    failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                seen.append(set(answer["ORDER_MODEL_VERSION"].tolist()))
                stop.wait(0.02)  # bounded load: leave the CPUs room to start the new router
        finally:
            http.close()

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        for percent in (50, 100, 0):
            apply(router, canary_percent=percent)
            served = len(seen)
            while len(seen) < served + 3 and worker.is_alive():  # a few answers per setting
                time.sleep(0.05)
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not worker.is_alive()
    assert failures == []
    assert len(seen) >= 9
    assert {2} in seen and seen[-1] == {1}
