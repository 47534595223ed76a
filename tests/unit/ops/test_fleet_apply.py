"""One server made to serve a fleet state: what is loaded, routed and unloaded, in which order.

The repository API is replaced by a recorder holding the served versions and routing, so
the order of the calls and what each one sends are checked against the state asked for.
"""

from __future__ import annotations

from typing import Any

import pytest

from dispatch_service.ops import fleet_apply, router_control
from dispatch_service.ops.fleet_apply import retire_versions, switch_state
from dispatch_service.ops.fleet_state import FleetState
from dispatch_service.ops.model_control import ModelControlError
from dispatch_service.routing.settings import RouterSettings

STABLE_ONLY = RouterSettings(1, 0, 0)
CANARY_10 = RouterSettings(1, 2, 10)


class Server:
    """The served scoring versions and routing; every call recorded in order."""

    def __init__(self, state: FleetState) -> None:
        self.serve(state)
        self.calls: list[tuple[str, Any]] = []
        self.route_fails = False

    def serve(self, state: FleetState) -> None:
        self.versions, self.routing = state.versions, state.router_settings(0)

    def ready_versions(self, url: str, model: str, key: Any, timeout_s: float) -> tuple[int, ...]:
        return self.versions

    def model_config(self, url: str, model: str, timeout_s: float) -> dict[str, Any]:
        return {"name": model}

    def load_model(
        self, url: str, model: str, config: dict[str, Any], key: Any, timeout_s: float
    ) -> None:
        versions = tuple(config["version_policy"]["specific"]["versions"])
        self.calls.append(("load", versions))
        self.versions = versions

    def read_router_settings(self, url: str, key: Any, timeout_s: float) -> RouterSettings:
        return self.routing

    def read_fused_settings(self, url: str, key: Any, timeout_s: float) -> RouterSettings:
        return self.routing

    def route(
        self, url: str, settings: RouterSettings, fused: bool, key: Any, timeout_s: float
    ) -> None:
        self.calls.append(("route", (settings.canary_version, settings.canary_percent)))
        if self.route_fails:
            raise ModelControlError("dispatch_router: load refused")
        self.routing = settings


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Server:
    fake = Server(FleetState(1, (1,), STABLE_ONLY))
    monkeypatch.setattr(fleet_apply, "ready_versions", fake.ready_versions)
    monkeypatch.setattr(fleet_apply, "model_config", fake.model_config)
    monkeypatch.setattr(fleet_apply, "load_model", fake.load_model)
    monkeypatch.setattr(router_control, "read_router_settings", fake.read_router_settings)
    monkeypatch.setattr(router_control, "read_fused_settings", fake.read_fused_settings)
    monkeypatch.setattr(fleet_apply, "_route", fake.route)
    return fake


def test_a_canary_is_loaded_before_any_request_is_routed_to_it(server: Server) -> None:
    switch = switch_state("u", None, FleetState(1, (1, 2), CANARY_10), None)
    assert server.calls == [("load", (1, 2)), ("route", (2, 10))]
    assert switch.changed and switch.retire is None
    assert set(switch.seconds) == {"verify", "load", "route"}


def test_a_rollback_routes_first_and_leaves_the_unload_to_retire(server: Server) -> None:
    server.serve(FleetState(1, (1, 2), CANARY_10))
    switch = switch_state("u", None, FleetState(2, (1,), STABLE_ONLY), None)
    assert server.calls == [("route", (0, 0))]  # version 2 still loaded, no longer routed
    assert 2 in server.versions
    assert retire_versions("u", None, switch) >= 0.0
    assert server.calls[-1] == ("load", (1,))
    assert server.versions == (1,)


def test_nothing_is_sent_when_the_server_serves_the_state(server: Server) -> None:
    server.serve(FleetState(1, (1, 2), CANARY_10))
    switch = switch_state("u", None, FleetState(3, (1, 2), CANARY_10), None)
    assert not switch.changed and server.calls == []
    assert retire_versions("u", None, switch) == 0.0


def test_a_left_over_version_is_unloaded_without_reloading_an_entry_point(
    server: Server,
) -> None:
    state = FleetState(2, (1,), STABLE_ONLY)
    server.serve(state)
    server.versions = (1, 2)  # an earlier unload failed: version 2 loaded, routed nowhere
    switch = switch_state("u", None, state, None)
    assert server.calls == [] and switch.changed
    retire_versions("u", None, switch)
    assert server.calls == [("load", (1,))]


def test_a_refused_routing_change_puts_the_versions_back(server: Server) -> None:
    server.route_fails = True
    with pytest.raises(ModelControlError):
        switch_state("u", None, FleetState(1, (2,), RouterSettings(2, 0, 0)), None)
    assert server.calls == [("load", (1, 2)), ("route", (0, 0)), ("load", (1,))]
    assert server.versions == (1,)
