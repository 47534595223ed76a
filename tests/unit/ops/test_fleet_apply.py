"""One server made to serve a fleet state: what is loaded, routed and unloaded, in which order.

The repository API is replaced by a recorder holding the served versions, and the routing
file is a real one, so the order of the calls and what each one sends or writes are checked
against the state asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dispatch_service.ops import fleet_apply
from dispatch_service.ops.fleet_apply import Switch, retire_versions, switch_state
from dispatch_service.ops.fleet_state import FleetState
from dispatch_service.ops.model_control import ModelControlError
from dispatch_service.routing import live
from dispatch_service.routing.settings import RouterSettings

STABLE_ONLY = RouterSettings(1, 0, 0)
CANARY_10 = RouterSettings(1, 2, 10)


class Server:
    """The served scoring versions and the routing file; every call recorded in order."""

    def __init__(self, state: FleetState, routing_file: Path) -> None:
        self.routing_file = routing_file
        self.calls: list[tuple[str, Any]] = []
        self.serve(state)
        self.write_fails = False

    def serve(self, state: FleetState) -> None:
        self.versions = state.versions
        live.write_routing_file(self.routing_file, state.routing, state.revision)

    @property
    def routing(self) -> RouterSettings:
        return live.read_routing_file(self.routing_file, RouterSettings())[0]

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

    def write_routing_file(self, path: Path, settings: RouterSettings, revision: int) -> None:
        self.calls.append(("route", (settings.canary_version, settings.canary_percent)))
        if self.write_fails:
            raise PermissionError(13, "Permission denied")
        live.write_routing_file(path, settings, revision)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Server:
    fake = Server(FleetState(1, (1,), STABLE_ONLY), tmp_path / "routing.json")
    monkeypatch.setattr(fleet_apply, "ready_versions", fake.ready_versions)
    monkeypatch.setattr(fleet_apply, "model_config", fake.model_config)
    monkeypatch.setattr(fleet_apply, "load_model", fake.load_model)
    monkeypatch.setattr(fleet_apply, "write_routing_file", fake.write_routing_file)
    return fake


def switch(server: Server, state: FleetState) -> Switch:
    return switch_state("u", None, state, None, routing_file=server.routing_file)


def test_a_canary_is_loaded_before_any_request_is_routed_to_it(server: Server) -> None:
    done = switch(server, FleetState(1, (1, 2), CANARY_10))
    assert server.calls == [("load", (1, 2)), ("route", (2, 10))]
    assert server.routing == FleetState(1, (1, 2), CANARY_10).routing
    assert done.changed and done.retire is None
    assert set(done.seconds) == {"verify", "load", "route"}


def test_a_rollback_routes_first_and_leaves_the_unload_to_retire(server: Server) -> None:
    server.serve(FleetState(1, (1, 2), CANARY_10))
    done = switch(server, FleetState(2, (1,), STABLE_ONLY))
    assert server.calls == [("route", (0, 0))]  # version 2 still loaded, no longer routed
    assert 2 in server.versions
    assert retire_versions("u", None, done) >= 0.0
    assert server.calls[-1] == ("load", (1,))
    assert server.versions == (1,)


def test_nothing_is_sent_when_the_server_serves_the_state(server: Server) -> None:
    server.serve(FleetState(1, (1, 2), CANARY_10))
    done = switch(server, FleetState(3, (1, 2), CANARY_10))
    assert not done.changed and server.calls == []
    assert retire_versions("u", None, done) == 0.0


def test_a_missing_or_unreadable_routing_file_is_written_anew(server: Server) -> None:
    server.routing_file.write_text("{not json", encoding="utf-8")
    done = switch(server, FleetState(2, (1,), STABLE_ONLY))
    assert server.calls == [("route", (0, 0))] and done.changed
    assert server.routing == FleetState(2, (1,), STABLE_ONLY).routing


def test_a_left_over_version_is_unloaded_without_routing_again(server: Server) -> None:
    state = FleetState(2, (1,), STABLE_ONLY)
    server.serve(state)
    server.versions = (1, 2)  # an earlier unload failed: version 2 loaded, routed nowhere
    done = switch(server, state)
    assert server.calls == [] and done.changed
    retire_versions("u", None, done)
    assert server.calls == [("load", (1,))]


def test_a_routing_file_that_cannot_be_written_is_a_server_failure_tried_again(
    server: Server,
) -> None:
    server.write_fails = True
    with pytest.raises(ModelControlError, match="Permission denied"):
        switch(server, FleetState(2, (1,), RouterSettings(1, 0, 0, shadow_percent=5)))
    assert server.routing == FleetState(1, (1,), STABLE_ONLY).routing  # unchanged


def test_an_unloaded_scoring_model_is_loaded_from_its_config_file(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no version served Triton has no config to give ("'dispatch_model' has no
    available versions"): the repository's file is loaded, with the state's versions."""
    from dispatch_service.core.paths import MODEL_REPOSITORY
    from dispatch_service.ops.verified_load import LoadCheck, LoadVerifier

    class Verifier(LoadVerifier):
        def check(self, model: str, config: Any) -> LoadCheck:
            checked.append((model, config["version_policy"]))
            return LoadCheck(model, config, (1,))

    def no_config(url: str, model: str, timeout_s: float) -> dict[str, Any]:
        raise ModelControlError("Request for unknown model: 'dispatch_model' has no available")

    checked: list[tuple[str, Any]] = []
    server.versions = ()
    monkeypatch.setattr(fleet_apply, "model_config", no_config)
    verifier = Verifier(MODEL_REPOSITORY, None)  # type: ignore[arg-type]
    state = FleetState(2, (1,), STABLE_ONLY)
    done = switch_state("u", None, state, verifier, routing_file=server.routing_file)
    assert server.calls[0] == ("load", (1,))
    assert checked == [("dispatch_model", {"specific": {"versions": [1]}})]
    assert done.changed and done.retire is None
