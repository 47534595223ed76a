"""Per-city routing on a live server: a canary for one city reaches that
city's windows only, through `dispatch` (the encoder's WINDOW_CITY to dispatch_router) and
`dispatch_fused` alike, the order metrics carry the city, and ``rollback --city`` takes it
back; each routing applied as a fleet replica applies a revision (`fleet_helpers.
apply_revision`). On the routing server (conftest `routing_triton`): it changes the routing.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import city_worlds, generate_window
from dispatch_service.ops.fleet_revisions import deployed, rolled_back
from dispatch_service.ops.fleet_state import FleetState
from dispatch_service.ops.server import TritonServer
from dispatch_service.routing.settings import RouterSettings
from fleet_helpers import ROUTING_ADMIN_KEY, apply_revision
from triton_helpers import ROUTED_OUTPUT_NAMES, infer_grpc, metric_series

ADMIN_KEY = ROUTING_ADMIN_KEY
ENTRY_POINTS = ("dispatch", "dispatch_fused")
Arrays = dict[str, np.ndarray[Any, Any]]


@pytest.fixture(scope="module")
def server(routing_triton: TritonServer) -> TritonServer:
    """The session's routing server (conftest), in the shipped state when the module starts."""
    return routing_triton


def city_window(city: str, seed: int, orders: int = 16, riders: int = 60) -> Arrays:
    """A simulated window of ``city`` (its own world: area, map, clock)."""
    window = generate_window(
        np.random.default_rng(seed), orders, riders, config=city_worlds()[city]
    )
    return dict(window_to_wire(window))


def answers(server: TritonServer, tensors: Arrays) -> dict[str, Arrays]:
    """Both entry points' answers to one window, which must be equal output for output."""
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        got = {m: infer_grpc(client, tensors, m, ROUTED_OUTPUT_NAMES) for m in ENTRY_POINTS}
    for name in ROUTED_OUTPUT_NAMES:
        np.testing.assert_array_equal(got["dispatch_fused"][name], got["dispatch"][name], name)
    return got


def versions_by_city(server: TritonServer, seed: int) -> dict[str, set[int]]:
    """The versions that answered each city's windows (both entry points; level 0 only)."""
    seen: dict[str, set[int]] = {}
    for city in ("beijing", "shanghai"):
        for offset in range(2):
            for answer in answers(server, city_window(city, seed + offset)).values():
                assert (answer["ORDER_FALLBACK_LEVEL"] == 0).all(), city
                seen.setdefault(city, set()).update(answer["ORDER_MODEL_VERSION"].tolist())
    return seen


def orders_metric(server: TritonServer, **labels: str) -> float:
    """dispatch_router_orders_total summed over the series with these labels (after the
    background recording had time to flush)."""
    time.sleep(0.5)
    return sum(
        value
        for found, value in metric_series(server.metrics_url, "dispatch_router_orders_total")
        if all(found.get(k) == v for k, v in labels.items())
    )


def test_a_canary_for_beijing_reaches_beijing_windows_only_on_both_entry_points(
    server: TritonServer,
) -> None:
    base = FleetState(0, (1, 2), RouterSettings(1))
    apply_revision(server, base, ADMIN_KEY)
    assert versions_by_city(server, seed=1) == {"beijing": {1}, "shanghai": {1}}

    # What `dispatch-admin deploy --city beijing --version 2 --canary-percent 100` writes.
    canary = deployed(2, 100, city="beijing")(base)
    assert canary.routing.for_city("beijing").canary_percent == 100
    apply_revision(server, FleetState(1, canary.versions, canary.routing), ADMIN_KEY)

    def count(model: str, city: str, version: int) -> float:
        return orders_metric(server, model=model, city=city, model_version=str(version))

    series = [
        (model, city, version)
        for model in ("dispatch_router", "dispatch_fused")
        for city, version in (("beijing", 2), ("beijing", 1), ("shanghai", 1), ("none", 1))
    ]
    before = {key: count(*key) for key in series}
    assert versions_by_city(server, seed=11) == {"beijing": {2}, "shanghai": {1}}
    # the order counts carry each window's city, from either entry point: 2 windows of 16
    # orders per city (a routing change reloads no model: every series counts on).
    added = {key: count(*key) - before[key] for key in series}
    for model in ("dispatch_router", "dispatch_fused"):
        assert added[(model, "beijing", 2)] == 32, model
        assert added[(model, "beijing", 1)] == 0, model
        assert added[(model, "none", 1)] == 0, model
        assert added[(model, "shanghai", 1)] == 32, model

    # What `dispatch-admin rollback --city beijing` writes.
    back = rolled_back(city="beijing")(canary)
    apply_revision(server, FleetState(2, back.versions, back.routing), ADMIN_KEY)
    assert versions_by_city(server, seed=21) == {"beijing": {1}, "shanghai": {1}}
