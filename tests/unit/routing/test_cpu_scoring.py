"""ORDER_FALLBACK_LEVEL 3 (CPU_SCORED): while the GPU monitor's device-level fallback L2 runs
dispatch_model on CPU instances (RouterSettings.cpu_scoring = 1), the orders the chosen
version scored say so; the rest of the chain (stable retry 1, rule-based 2) is unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import PAIR_FEATURE_NAMES
from dispatch_service.core.metrics import InMemoryMetrics
from dispatch_service.core.settings import SettingsError
from dispatch_service.domain.cities import default_registry
from dispatch_service.domain.features import encode_window
from dispatch_service.offline.simulator import generate_window
from dispatch_service.routing.engine import route_and_score_sync
from dispatch_service.routing.fallback import FallbackLevel, rule_based_objectives
from dispatch_service.routing.metrics import FALLBACK_ORDERS, ROUTED_ORDERS, routed_observations
from dispatch_service.routing.policy import choose_versions
from dispatch_service.routing.settings import RouterSettings

SHANGHAI = default_registry().get("shanghai")

CPU = int(FallbackLevel.CPU_SCORED)
F32 = NDArray[np.float32]


def answer(version: int, features: F32) -> F32:
    """Version v's stand-in answer: a version-tagged function of the rows."""
    pickup = features[:, PAIR_FEATURE_NAMES.index("pickup_distance_km")]
    eta = 10.0 * version + pickup
    return np.stack([eta, np.full_like(eta, 0.5), np.full_like(eta, 8.0)], axis=1)


def scorer_failing(failing: set[int]) -> Callable[[int, F32], F32]:
    def score(version: int, features: F32) -> F32:
        if version in failing:
            raise RuntimeError(f"version {version} is not loaded")
        return answer(version, features)

    return score


def routed_input(orders: int = 30) -> tuple[F32, NDArray[np.int32], NDArray[np.int32]]:
    window = generate_window(np.random.default_rng(4), orders, 90)
    encoded = encode_window(window, SHANGHAI)
    user_ids = np.array([f"user-{i}".encode() for i in range(orders)], dtype=object)
    versions = choose_versions(user_ids, RouterSettings(canary_version=2, canary_percent=50))
    assert set(versions.tolist()) == {1, 2}
    return encoded.pair_features, encoded.candidate_rider_index, versions


def route(cpu_scoring: int, failing: set[int], shadow: bool = False) -> Any:
    features, candidates, versions = routed_input()
    settings = RouterSettings(
        canary_version=2, canary_percent=50, shadow_percent=100, cpu_scoring=cpu_scoring
    )
    routed = route_and_score_sync(
        features, candidates, versions, settings, scorer_failing(failing), shadow=shadow
    )
    return routed, features, versions


def test_orders_the_chosen_version_scored_on_the_cpu_report_level_3() -> None:
    plain, _, versions = route(0, set())
    on_cpu, _, _ = route(1, set())
    assert np.all(plain.fallback_level == 0)
    assert np.all(on_cpu.fallback_level == CPU)
    np.testing.assert_array_equal(on_cpu.objectives, plain.objectives)  # same answer
    np.testing.assert_array_equal(on_cpu.model_version, versions)


def test_retry_and_rule_based_keep_their_levels_on_the_cpu() -> None:
    routed, features, versions = route(1, {2})
    canary = versions == 2
    assert np.all(routed.fallback_level[canary] == FallbackLevel.STABLE_RETRY)
    assert np.all(routed.fallback_level[~canary] == CPU)
    routed, features, _ = route(1, {1, 2})
    assert np.all(routed.fallback_level == FallbackLevel.RULE_BASED)
    np.testing.assert_allclose(routed.objectives, rule_based_objectives(features))


def test_cpu_scored_orders_are_answered_orders_not_fallbacks_in_the_metrics() -> None:
    routed, _, versions = route(1, {2})
    metrics = InMemoryMetrics()
    metrics.record(routed_observations(routed))
    stable_orders = int(np.sum(versions == 1))
    canary_orders = int(np.sum(versions == 2))
    assert (
        metrics.counter(ROUTED_ORDERS, model_version="1", level=str(CPU), city="none")
        == stable_orders
    )
    assert (
        metrics.counter(ROUTED_ORDERS, model_version="1", level="1", city="none") == canary_orders
    )
    assert (
        metrics.counter(FALLBACK_ORDERS, model_version="2", level="1", city="none") == canary_orders
    )
    assert metrics.counter(FALLBACK_ORDERS, model_version="1", level=str(CPU), city="none") == 0


def test_shadow_comparison_still_sees_the_cpu_scored_orders() -> None:
    plain, _, _ = route(0, set(), shadow=True)
    on_cpu, _, _ = route(1, set(), shadow=True)
    assert plain.shadows and on_cpu.shadows == plain.shadows


def test_cpu_scoring_is_0_or_1() -> None:
    assert RouterSettings.from_parameters({"cpu_scoring": "1"}).cpu_scoring == 1
    with pytest.raises(SettingsError, match="cpu_scoring must be 0 or 1"):
        RouterSettings.from_parameters({"cpu_scoring": "2"})
