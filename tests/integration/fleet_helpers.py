"""Routing a bare server as a fleet replica's launcher does, for the integration tests that
start Triton without a launcher."""

from __future__ import annotations

import time
from typing import Any

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.ops.fleet_apply import retire_versions, switch_state
from dispatch_service.ops.fleet_state import initial_state
from dispatch_service.routing.live import read_entry_points, routing_digest
from dispatch_service.routing.settings import IN_PROCESS_ROUTING_MODELS, ROUTER_MODEL_NAME

# The admin key of the session's routing server (conftest `routing_triton`).
ROUTING_ADMIN_KEY = "routing-test-key"


def apply_revision(server: Any, state: Any, admin_key: str | None) -> None:
    """What a fleet replica's launcher does with a new revision (`fleet_watch`): the versions
    it names loaded, the live routing file written, the versions it no longer names retired;
    then waits until every entry-point process reports it routes by it. ``server`` a
    `TritonServer` started with ``live_routing``; ``state`` a `FleetState`."""
    routing_file = server.routing_file()
    assert routing_file is not None, "the server was started without live_routing"
    switch = switch_state(server.http_url, admin_key, state, None, routing_file=routing_file)
    retire_versions(server.http_url, admin_key, switch)
    wanted = routing_digest(state.routing)
    models = (ROUTER_MODEL_NAME, *IN_PROCESS_ROUTING_MODELS)
    deadline = time.monotonic() + 30
    while True:
        reports = read_entry_points(routing_file)
        if all(reports.get(m) for m in models) and all(
            r["routing"] == wanted and not r["error"] for m in models for r in reports[m]
        ):
            return
        assert time.monotonic() < deadline, reports
        time.sleep(0.1)


def apply_shipped(server: Any, admin_key: str | None) -> None:
    """Route ``server`` as the shipped repository does before any revision (its versions,
    `INITIAL_ROUTING`): what a module that changed the routing puts back."""
    apply_revision(server, initial_state(MODEL_REPOSITORY), admin_key)
