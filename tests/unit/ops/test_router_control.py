"""router_control.apply_router_settings: every entry point or none, against a stand-in
of Triton's model-control API (the live behaviour is in tests/integration/test_canary.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dispatch_service.core.settings import parameters_from_model_config
from dispatch_service.ops import router_control
from dispatch_service.ops.model_control import ModelControlError
from dispatch_service.ops.router_control import RouterControlError, apply_router_settings
from dispatch_service.routing.settings import (
    IN_PROCESS_ROUTING_MODELS,
    FusedSettings,
    RouterSettings,
)

BEFORE = RouterSettings(stable_version=1, canary_version=2)  # the initial routing
AFTER = RouterSettings(stable_version=1, canary_version=2, bls_timeout_ms=300, cpu_scoring=1)


def config(name: str, settings: RouterSettings) -> dict[str, Any]:
    parameters = {k: {"string_value": v} for k, v in settings.to_parameters().items()}
    if name in IN_PROCESS_ROUTING_MODELS:
        parameters["scoring_model"] = {"string_value": "dispatch_model"}
    return {"name": name, "parameters": parameters}


class FakeTriton:
    def __init__(self, loaded: tuple[str, ...] = IN_PROCESS_ROUTING_MODELS) -> None:
        self.configs = {"dispatch_router": config("dispatch_router", BEFORE)}
        for name in loaded:
            self.configs[name] = config(name, BEFORE)
        self.refuse: set[str] = set()
        self.loads: list[str] = []

    def model_config(self, http_url: str, model: str, timeout_s: float = 30.0) -> Any:
        return copy.deepcopy(self.configs[model])

    def ready_versions(self, http_url: str, model: str, *args: Any) -> tuple[int, ...]:
        return (1,) if model in self.configs else ()

    def load_model(self, http_url: str, model: str, config: Any = None, **kwargs: Any) -> None:
        self.loads.append(model)
        if model in self.refuse:
            raise ModelControlError("HTTP 400: load failed", 400)
        self.configs[model] = copy.deepcopy(config)

    def routing(self, model: str) -> RouterSettings:
        parameters = parameters_from_model_config(self.configs[model])
        if model in IN_PROCESS_ROUTING_MODELS:
            return FusedSettings.from_parameters(parameters).routing
        return RouterSettings.from_parameters(parameters)


@pytest.fixture
def triton(monkeypatch: pytest.MonkeyPatch) -> FakeTriton:
    fake = FakeTriton()
    for name in ("model_config", "ready_versions", "load_model"):
        monkeypatch.setattr(router_control, name, getattr(fake, name))
    return fake


def test_every_entry_point_takes_the_settings(triton: FakeTriton) -> None:
    apply_router_settings("h:1", AFTER, admin_key="k")
    for model in ("dispatch_router", "dispatch_fused", "dispatch_priority"):
        assert triton.routing(model) == AFTER, model
    assert triton.loads == ["dispatch_router", "dispatch_fused", "dispatch_priority"]


def test_a_refused_fused_reload_puts_the_router_back(triton: FakeTriton) -> None:
    triton.refuse.add("dispatch_fused")
    with pytest.raises(RouterControlError, match="dispatch_router put back to the previous"):
        apply_router_settings("h:1", AFTER, admin_key="k")
    assert triton.routing("dispatch_router") == triton.routing("dispatch_fused") == BEFORE
    assert triton.routing("dispatch_priority") == BEFORE
    assert triton.loads == ["dispatch_router", "dispatch_fused", "dispatch_router"]


def test_a_refused_priority_lane_puts_both_others_back(triton: FakeTriton) -> None:
    triton.refuse.add("dispatch_priority")
    with pytest.raises(
        RouterControlError, match="dispatch_router, dispatch_fused put back to the previous"
    ):
        apply_router_settings("h:1", AFTER)
    for model in ("dispatch_router", "dispatch_fused", "dispatch_priority"):
        assert triton.routing(model) == BEFORE, model
    assert triton.loads == [
        "dispatch_router",
        "dispatch_fused",
        "dispatch_priority",
        "dispatch_fused",
        "dispatch_router",
    ]


def test_a_failed_put_back_says_the_entry_points_differ(
    triton: FakeTriton, monkeypatch: pytest.MonkeyPatch
) -> None:
    triton.refuse.add("dispatch_fused")
    original = triton.load_model

    def refuse_restore(http_url: str, model: str, config: Any = None, **kwargs: Any) -> None:
        if model == "dispatch_router" and triton.loads.count("dispatch_router") == 1:
            triton.refuse.add("dispatch_router")
        original(http_url, model, config, **kwargs)

    monkeypatch.setattr(router_control, "load_model", refuse_restore)
    with pytest.raises(RouterControlError, match="may now route with different settings"):
        apply_router_settings("h:1", AFTER)


def test_a_refused_router_changes_nothing(triton: FakeTriton) -> None:
    triton.refuse.add("dispatch_router")
    with pytest.raises(RouterControlError, match="previous settings keep serving"):
        apply_router_settings("h:1", AFTER)
    assert triton.loads == ["dispatch_router"]
    assert triton.routing("dispatch_fused") == triton.routing("dispatch_priority") == BEFORE


@pytest.mark.parametrize("loaded", [(), ("dispatch_fused",)])
def test_only_the_loaded_models_change(
    monkeypatch: pytest.MonkeyPatch, loaded: tuple[str, ...]
) -> None:
    fake = FakeTriton(loaded)
    for name in ("model_config", "ready_versions", "load_model"):
        monkeypatch.setattr(router_control, name, getattr(fake, name))
    apply_router_settings("h:1", AFTER)
    assert fake.loads == ["dispatch_router", *loaded]
    assert all(fake.routing(model) == AFTER for model in fake.loads)


def test_a_routing_change_is_refused_before_any_load(triton: FakeTriton) -> None:
    """Routing changes only as a fleet revision: settings whose routing is not the initial
    routing are refused by name, and no model is reloaded."""
    canary = RouterSettings(stable_version=1, canary_version=2, canary_percent=30)
    with pytest.raises(RouterControlError, match="only a signed fleet revision changes it"):
        apply_router_settings("h:1", canary)
    assert triton.loads == []
