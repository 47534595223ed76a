"""One routing core: `dispatch` (ensemble, BLS), `dispatch_fused` (one process) and its priority
lane `dispatch_priority` answer the same, output for output, for every tag, in every
repository state the control plane makes.

Randomized windows (sizes, users, weights) and tags (none, stable, canary, each version, an
unknown version) go through every entry point in three states (and, with the canary, all at
once as well, so that the windows of one execute share their calls), reached the way a fleet
replica's launcher applies a revision (`fleet_apply.switch_state`: versions loaded, the live
routing file written, left-over versions retired): one version (``rollback --unload-canary``),
stable + canary with shadow traffic (``deploy``, ``shadow``), and after a plain ``rollback``
that keeps the old canary loaded. On the routing server (conftest `routing_triton`): it
changes the server's state.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from dispatch_contract.keys import PRIORITY_KEY_HEADER
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import city_worlds, generate_window
from dispatch_service.ops.fleet_state import FleetState
from dispatch_service.ops.model_control import ready_versions
from dispatch_service.ops.server import TritonServer
from dispatch_service.routing.settings import (
    IN_PROCESS_ROUTING_MODELS,
    RouterSettings,
)
from fleet_helpers import ROUTING_ADMIN_KEY, apply_revision
from triton_helpers import ROUTED_OUTPUT_NAMES, infer_grpc, sim_window

ADMIN_KEY = ROUTING_ADMIN_KEY
MODEL = "dispatch_model"
TAGS = (None, "stable", "canary", "1", "2", "7")  # 7: a version that exists nowhere
Arrays = dict[str, np.ndarray[Any, Any]]


@pytest.fixture(scope="module")
def server(routing_triton: TritonServer) -> TritonServer:
    """The session's routing server (conftest), in the shipped state when the module starts."""
    return routing_triton


def random_request(rng: np.random.Generator, tag: str | None) -> Arrays:
    orders, riders = int(rng.integers(1, 13)), int(rng.integers(4, 61))
    tensors = dict(sim_window(int(rng.integers(1 << 30)), orders, riders))
    users = rng.integers(0, 1000, size=orders)
    tensors["ORDER_TEXT"] = np.array([[f"user-{u}".encode()] for u in users], dtype=object)
    if rng.random() < 0.3:
        weights = rng.dirichlet(np.ones(3)).astype(np.float32)
        tensors["OBJECTIVE_WEIGHTS"] = weights
    if tag is not None:
        tensors["MODEL_VERSION_TAG"] = np.array([tag.encode()], dtype=object)
    return tensors


def lane_key(server: TritonServer) -> dict[str, str]:
    """The priority key's header, which the priority lane asks of every window."""
    return {PRIORITY_KEY_HEADER: str(server.priority_key)}


def assert_parity(server: TritonServer, seed: int) -> dict[tuple[str | None, int, int], int]:
    """Every output equal from both entry points; returns (tag, version, level) -> orders."""
    rng = np.random.default_rng(seed)
    seen: dict[tuple[str | None, int, int], int] = {}
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for round_ in range(2):
            for tag in TAGS:
                tensors = random_request(rng, tag)
                ensemble = infer_grpc(client, tensors, "dispatch", ROUTED_OUTPUT_NAMES)
                for model in IN_PROCESS_ROUTING_MODELS:
                    got = infer_grpc(
                        client, tensors, model, ROUTED_OUTPUT_NAMES, headers=lane_key(server)
                    )
                    for name in ROUTED_OUTPUT_NAMES:
                        np.testing.assert_array_equal(
                            got[name],
                            ensemble[name],
                            err_msg=f"{model} {name}, tag {tag}, {round_}",
                        )
                pairs = zip(
                    ensemble["ORDER_MODEL_VERSION"].tolist(),
                    ensemble["ORDER_FALLBACK_LEVEL"].tolist(),
                    strict=True,
                )
                for version, level in pairs:
                    seen[(tag, version, level)] = seen.get((tag, version, level), 0) + 1
    return seen


def assert_city_parity(server: TritonServer, seed: int) -> dict[tuple[str, str | None], set[Any]]:
    """`assert_parity` over windows of several cities (each its own world); returns
    (city, tag) -> the (version, level) pairs seen."""
    rng = np.random.default_rng(seed)
    worlds = city_worlds()
    seen: dict[tuple[str, str | None], set[Any]] = {}
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        for city in ("beijing", "chengdu", "shanghai"):
            for tag in (None, "canary", "stable"):
                tensors = random_request(rng, tag)
                window = generate_window(rng, 8, 40, config=worlds[city])
                tensors.update(window_to_wire(window))  # the tag and weights: random_request
                ensemble = infer_grpc(client, tensors, "dispatch", ROUTED_OUTPUT_NAMES)
                for model in IN_PROCESS_ROUTING_MODELS:
                    got = infer_grpc(
                        client, tensors, model, ROUTED_OUTPUT_NAMES, headers=lane_key(server)
                    )
                    for name in ROUTED_OUTPUT_NAMES:
                        np.testing.assert_array_equal(
                            got[name], ensemble[name], err_msg=f"{model} {name}, {city}, tag {tag}"
                        )
                pairs = zip(
                    ensemble["ORDER_MODEL_VERSION"].tolist(),
                    ensemble["ORDER_FALLBACK_LEVEL"].tolist(),
                    strict=True,
                )
                seen.setdefault((city, tag), set()).update(pairs)
    return seen


def assert_concurrent_answers_alike(server: TritonServer, seed: int) -> None:
    """Windows sent all at once (so that an execute holds several: their calls of one version
    joined into one) get, from each entry point, the answers they get one at a time."""
    rng = np.random.default_rng(seed)
    requests = [random_request(rng, TAGS[n % len(TAGS)]) for n in range(18)]

    def one(job: tuple[str, Arrays]) -> Arrays:
        model, tensors = job
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            return infer_grpc(client, tensors, model, ROUTED_OUTPUT_NAMES, headers=lane_key(server))

    for model in ("dispatch", *IN_PROCESS_ROUTING_MODELS):
        jobs = [(model, tensors) for tensors in requests]
        alone = [one(job) for job in jobs]
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            together = list(pool.map(one, jobs))
        for n, (got, expected) in enumerate(zip(together, alone, strict=True)):
            for name in ROUTED_OUTPUT_NAMES:
                np.testing.assert_array_equal(got[name], expected[name], err_msg=f"{model} {n}")


def routes(seen: dict[tuple[str | None, int, int], int], tag: str | None) -> set[tuple[int, int]]:
    return {(version, level) for (t, version, level) in seen if t == tag}


def test_every_entry_point_answers_alike_in_every_repository_state(server: TritonServer) -> None:
    url = server.http_url
    # State 1: one version (the operator's rollback --unload-canary from the shipped state).
    apply_revision(server, FleetState(1, (1,), RouterSettings(1)), ADMIN_KEY)
    assert ready_versions(url, MODEL, ADMIN_KEY) == (1,)
    seen = assert_parity(server, seed=1)
    for tag in (None, "stable", "canary", "1"):
        assert routes(seen, tag) == {(1, 0)}, tag
    assert routes(seen, "2") == routes(seen, "7") == {(1, 1)}  # not served: stable retries

    # State 2: stable + canary at 50 % with shadow traffic (deploy, then shadow).
    apply_revision(
        server, FleetState(2, (1, 2), RouterSettings(1, 2, 50, shadow_percent=50)), ADMIN_KEY
    )
    assert ready_versions(url, MODEL, ADMIN_KEY) == (1, 2)
    seen = assert_parity(server, seed=2)
    assert routes(seen, None) == {(1, 0), (2, 0)}  # users split between the versions
    assert routes(seen, "canary") == routes(seen, "2") == {(2, 0)}
    assert routes(seen, "stable") == routes(seen, "1") == {(1, 0)}
    assert routes(seen, "7") == {(1, 1)}
    assert_concurrent_answers_alike(server, seed=4)

    # State 3: a plain rollback keeps version 2 loaded: routed nowhere, reachable by its tag.
    apply_revision(server, FleetState(3, (1, 2), RouterSettings(1)), ADMIN_KEY)
    assert ready_versions(url, MODEL, ADMIN_KEY) == (1, 2)
    seen = assert_parity(server, seed=3)
    for tag in (None, "stable", "canary", "1"):
        assert routes(seen, tag) == {(1, 0)}, tag
    assert routes(seen, "2") == {(2, 0)}
    assert routes(seen, "7") == {(1, 1)}

    # State 4: per-city routes: each window routed with its city's settings.
    per_city = RouterSettings(1).with_route("beijing", canary_version=2, canary_percent=100)
    apply_revision(server, FleetState(4, (1, 2), per_city), ADMIN_KEY)
    by_city = assert_city_parity(server, seed=5)
    assert by_city[("beijing", None)] == by_city[("beijing", "canary")] == {(2, 0)}
    assert by_city[("beijing", "stable")] == {(1, 0)}
    for city in ("chengdu", "shanghai"):  # no route of their own: no canary
        for tag in (None, "canary", "stable"):
            assert by_city[(city, tag)] == {(1, 0)}, (city, tag)
