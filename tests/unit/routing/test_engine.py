"""dispatch_service.routing.engine: canary buckets, tags, fallback chain, shadow comparison."""

from __future__ import annotations

import asyncio
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import NUM_PAIR_FEATURES, PAIR_FEATURE_NAMES
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.metrics import InMemoryMetrics
from dispatch_service.core.settings import SettingsError
from dispatch_service.domain import geo
from dispatch_service.domain.cities import default_registry
from dispatch_service.domain.features import encode_window, feasible_mask
from dispatch_service.domain.resolver import resolve
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.offline.simulator import generate_window
from dispatch_service.routing.engine import (
    RoutedScores,
    RouteItem,
    route_and_score,
    route_and_score_many,
    route_and_score_many_sync,
    route_and_score_sync,
)
from dispatch_service.routing.fallback import FallbackLevel, rule_based_objectives
from dispatch_service.routing.metrics import (
    FALLBACK_ORDERS,
    MODEL_CALLS,
    MODEL_ERRORS,
    ROUTED_ORDERS,
    SHADOW_ORDERS,
    SHADOW_TOP1_AGREEMENTS,
    answered_counts,
    fallback_counts,
    routed_observations,
)
from dispatch_service.routing.policy import choose_versions, parse_version_tag, user_buckets
from dispatch_service.routing.settings import INITIAL_ROUTING, RouterSettings, settings_record
from dispatch_service.routing.shadow import compare_shadow, shadow_sampled, shadow_version_of

SHANGHAI = default_registry().get("shanghai")

CANARY = RouterSettings(stable_version=1, canary_version=2, canary_percent=30)


def users(count: int, prefix: str = "user") -> NDArray[np.object_]:
    return np.array([f"{prefix}-{i}".encode() for i in range(count)], dtype=object)


# ---- settings ------------------------------------------------------------------------------


def test_config_parameters_carry_the_nodes_settings_and_no_routing() -> None:
    """A model config sets the node's deadline, CPU scoring and served versions; the routing
    is the initial routing until a fleet revision (stable 1, canary 2 at 0 %, no shadow, no
    city routes)."""
    settings = RouterSettings(
        stable_version=2,
        canary_version=3,
        canary_percent=5,
        shadow_percent=10,
        bls_timeout_ms=50,
        scoring_versions=(1, 2, 3),
    )
    assert settings.to_parameters() == {
        "bls_timeout_ms": "50",
        "cpu_scoring": "0",
        "scoring_versions": "1,2,3",
    }
    read = RouterSettings.from_parameters(settings.to_parameters())
    assert read == RouterSettings(1, 2, bls_timeout_ms=50, scoring_versions=(1, 2, 3))
    assert RouterSettings.from_parameters({"scoring_versions": "2, 1"}).scoring_versions == (1, 2)
    with pytest.raises(SettingsError, match="scoring_versions"):
        RouterSettings.from_parameters({"scoring_versions": "1,two"})
    assert RouterSettings.from_parameters({}) == INITIAL_ROUTING
    assert (INITIAL_ROUTING.stable_version, INITIAL_ROUTING.canary_version) == (1, 2)
    assert (INITIAL_ROUTING.canary_percent, INITIAL_ROUTING.shadow_percent) == (0, 0)
    assert INITIAL_ROUTING.city_routes == ()


def test_a_version_is_served_when_stated_or_while_none_are_when_the_routing_names_it() -> None:
    # Before a first revision nothing states the versions: only the stable and canary (global
    # and per city) count as served, so a tag naming version 7 is never called.
    assert [v for v in range(0, 8) if INITIAL_ROUTING.serves(v)] == [1, 2]
    routed = INITIAL_ROUTING.with_route("beijing", canary_version=3)
    assert [v for v in range(0, 8) if routed.serves(v)] == [1, 2, 3]
    stated = RouterSettings(1, 2, scoring_versions=(1, 4))
    assert [v for v in range(0, 8) if stated.serves(v)] == [1, 4]


@pytest.mark.parametrize(
    "changes",
    [
        {"canary_version": 1},  # same as stable
        {"canary_percent": 101, "canary_version": 2},
        {"canary_percent": -1, "canary_version": 2},
        {"shadow_percent": 150},
        {"canary_percent": 10},  # no canary version
        {"stable_version": 0},
        {"bls_timeout_ms": 0},
        {"canary_version": -2},
        {"canary_percent": True, "canary_version": 2},
    ],
)
def test_inconsistent_settings_are_refused(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RouterSettings(**changes)


def test_unknown_or_unreadable_parameters_fail_the_load() -> None:
    with pytest.raises(SettingsError, match="canary_precent"):
        RouterSettings.from_parameters({"canary_precent": "10"})
    with pytest.raises(SettingsError, match="'bls_timeout_ms': 'ten'"):
        RouterSettings.from_parameters({"bls_timeout_ms": "ten"})
    with pytest.raises(SettingsError, match="cpu_scoring must be 0 or 1"):
        RouterSettings.from_parameters({"cpu_scoring": "2"})
    # Routing in a config is refused by name: only a fleet revision routes.
    with pytest.raises(SettingsError, match="canary_percent, canary_version are routing"):
        RouterSettings.from_parameters({"canary_version": "2", "canary_percent": "10"})


def test_settings_log_record_is_flat_and_complete() -> None:
    record = settings_record(CANARY, model="dispatch_router", version="1")
    assert record["event"] == "router_settings_loaded"
    assert record["canary_percent"] == 30 and record["stable_version"] == 1
    assert record["model"] == "dispatch_router"


# ---- buckets and versions ------------------------------------------------------------------


def reference_bucket(user_id: bytes) -> int:
    """FNV-1a 64 then MurmurHash3's fmix64, mod 100, in plain Python integers."""
    mask = (1 << 64) - 1
    h = 0xCBF29CE484222325
    for byte in user_id:
        h = ((h ^ byte) * 0x100000001B3) & mask
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & mask
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & mask
    h ^= h >> 33
    return h % 100


def test_buckets_are_the_documented_hash_in_every_process() -> None:
    ids = [b"alice", b"bob", b"user-0", b"", "\u7528\u6237-42".encode()]
    buckets = user_buckets(np.array(ids, dtype=object)).tolist()
    assert buckets == [reference_bucket(i) for i in ids]
    # Pinned: a change here would move users between versions on upgrade.
    assert buckets[:3] == [36, 52, 50]
    as_text = user_buckets(np.array([i.decode() for i in ids], dtype=object)).tolist()
    assert as_text == buckets


def test_buckets_cover_0_to_99_about_evenly() -> None:
    buckets = user_buckets(users(20_000))
    assert buckets.min() >= 0 and buckets.max() < 100
    counts = np.bincount(buckets, minlength=100)
    assert counts.min() > 120 and counts.max() < 280  # expected 200 each


def test_canary_share_matches_the_percentage() -> None:
    versions = choose_versions(users(1000), CANARY)
    share = float(np.mean(versions == 2))
    assert abs(share - 0.30) <= 0.05
    assert set(np.unique(versions).tolist()) == {1, 2}


def test_routing_is_sticky_and_raising_the_percentage_only_adds_users() -> None:
    ids = users(500)
    first = choose_versions(ids, CANARY)
    order = np.random.default_rng(1).permutation(ids.size)
    again = choose_versions(ids[order], CANARY)
    np.testing.assert_array_equal(again, first[order])
    wider = choose_versions(ids, RouterSettings(canary_version=2, canary_percent=60))
    assert np.all(wider[first == 2] == 2)
    assert np.mean(wider == 2) > np.mean(first == 2)


@pytest.mark.parametrize(("percent", "expected"), [(0, {1}), (100, {2})])
def test_zero_and_hundred_percent(percent: int, expected: set[int]) -> None:
    settings = RouterSettings(canary_version=2, canary_percent=percent)
    assert set(choose_versions(users(300), settings).tolist()) == expected


def test_no_canary_means_stable_for_everyone() -> None:
    assert set(choose_versions(users(100), RouterSettings(stable_version=3)).tolist()) == {3}


@pytest.mark.parametrize(
    ("tag", "expected"),
    [
        (b"stable", 1),
        (b"canary", 2),
        (b" Canary ", 2),
        (b"2", 2),
        (b"7", 7),
        ("1", 1),
    ],
)
def test_a_tag_forces_the_version(tag: bytes | str, expected: int) -> None:
    forced = parse_version_tag(np.array([tag], dtype=object), CANARY)
    assert forced == expected
    assert set(choose_versions(users(50), CANARY, forced).tolist()) == {expected}


def test_canary_tag_without_a_canary_is_the_stable_version() -> None:
    assert parse_version_tag(np.array([b"canary"], dtype=object), RouterSettings()) == 1


def test_no_tag_forces_nothing() -> None:
    assert parse_version_tag(None, CANARY) is None


@pytest.mark.parametrize(
    "tag",
    [
        np.array([b"beta"], dtype=object),
        np.array([b"0"], dtype=object),
        np.array([b"-1"], dtype=object),
        np.array([b""], dtype=object),
        np.array([b"\xff"], dtype=object),
        np.array([b"stable", b"canary"], dtype=object),
        np.array([3], dtype=object),
    ],
)
def test_a_bad_tag_is_rejected_naming_the_tensor(tag: NDArray[Any]) -> None:
    with pytest.raises(DispatchInputError) as info:
        parse_version_tag(tag, CANARY)
    assert info.value.tensor == "MODEL_VERSION_TAG"


def test_shadow_pairs_stable_and_canary() -> None:
    assert shadow_version_of(1, CANARY) == 2
    assert shadow_version_of(2, CANARY) == 1
    assert shadow_version_of(5, CANARY) == 0
    assert shadow_version_of(1, RouterSettings()) == 0


def test_shadow_sample_follows_the_percentage() -> None:
    settings = RouterSettings(canary_version=2, shadow_percent=25)
    draws = np.random.default_rng(3).random(4000)
    share = np.mean([shadow_sampled(float(d), settings) for d in draws])
    assert abs(share - 0.25) < 0.03
    assert not shadow_sampled(0.0, RouterSettings())
    assert shadow_sampled(0.999, RouterSettings(canary_version=2, shadow_percent=100))


# ---- the rule-based dispatcher ------------------------------------------------------------


def _window(seed: int, orders: int, riders: int) -> DispatchWindow:
    return generate_window(np.random.default_rng(seed), orders, riders)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rule_based_objectives_make_the_resolver_pick_the_nearest_feasible_rider(
    seed: int,
) -> None:
    window = _window(seed, 40, 120)
    encoded = encode_window(window, SHANGHAI)
    objectives = rule_based_objectives(encoded.pair_features)
    assert objectives.dtype == np.float32 and np.isfinite(objectives).all()
    resolution = resolve(
        objectives=objectives,
        candidate_rider_index=encoded.candidate_rider_index,
        rider_ids=window.rider_ids,
        rider_load=window.rider_load,
        rider_capacity=window.rider_capacity,
        weights=np.array([0.45, 0.35, 0.20]),
    )
    feasible = feasible_mask(window)
    for b in range(window.num_orders):
        if not feasible[b].any():
            assert resolution.topk_rider_index[b, 0] == -1
            continue
        distance = geo.haversine_km(
            window.rider_position[:, 0],
            window.rider_position[:, 1],
            window.pickup[b, 0],
            window.pickup[b, 1],
        )
        nearest = int(np.argmin(np.where(feasible[b], distance, np.inf)))
        assert resolution.topk_rider_index[b, 0] == nearest, f"order {b}"
    assigned = resolution.assigned_rider_index
    spare = np.maximum(window.rider_capacity - window.rider_load, 0)
    taken = np.bincount(assigned[assigned >= 0], minlength=window.num_riders)
    assert np.all(taken <= spare)
    assert np.all(feasible[np.flatnonzero(assigned >= 0), assigned[assigned >= 0]])


def test_rule_based_objectives_worsen_with_pickup_distance() -> None:
    features = np.zeros((3, NUM_PAIR_FEATURES), dtype=np.float32)
    features[:, PAIR_FEATURE_NAMES.index("pickup_distance_km")] = [0.5, 1.0, 3.0]
    features[:, PAIR_FEATURE_NAMES.index("trip_distance_km")] = 2.0
    features[:, PAIR_FEATURE_NAMES.index("slack_minutes")] = 25.0
    eta, ontime, cost = rule_based_objectives(features).T
    assert np.all(np.diff(eta) > 0) and np.all(np.diff(ontime) < 0) and np.all(np.diff(cost) > 0)
    assert np.all((ontime > 0) & (ontime < 1))


def test_rule_based_objectives_stay_finite_on_garbage_rows() -> None:
    features = np.full((2, NUM_PAIR_FEATURES), np.nan, dtype=np.float32)
    features[1] = np.float32(3e38)
    out = rule_based_objectives(features)
    assert np.isfinite(out).all() and np.all(out[:, [0, 2]] >= 0)
    with pytest.raises(DispatchInputError, match="PAIR_FEATURES"):
        rule_based_objectives(np.zeros((2, 5), dtype=np.float32))


# ---- shadow comparison ---------------------------------------------------------------------


def test_identical_answers_agree_fully() -> None:
    objectives = np.tile(np.array([[20.0, 0.8, 9.0]], dtype=np.float32), (6, 1))
    objectives[:, 0] += np.arange(6, dtype=np.float32)
    candidates = np.array([[3, 4, -1], [5, 6, 7]], dtype=np.int32)
    cmp = compare_shadow(objectives, objectives, candidates, 1, 2)
    assert (cmp.orders, cmp.top1_agreements, cmp.pairs) == (2, 2, 5)
    assert cmp.top1_agreement == 1.0
    assert cmp.mean_score_abs_diff == 0.0 and cmp.mean_ontime_abs_diff == 0.0


def test_a_flipped_favourite_counts_as_disagreement() -> None:
    first = np.array(
        [[10, 0.9, 5], [30, 0.5, 9], [10, 0.9, 5], [30, 0.5, 9]], dtype=np.float32
    )  # 2 orders x 2 candidates; candidate 0 best in both orders
    second = first.copy()
    second[2:] = second[[3, 2]]  # order 1: candidate 1 now best
    second[0, 1] = 0.7  # order 0 keeps its favourite, on-time moves by 0.2
    cmp = compare_shadow(first, second, np.array([[0, 1], [2, 3]], dtype=np.int32), 1, 2)
    assert (cmp.orders, cmp.top1_agreements, cmp.pairs) == (2, 1, 4)
    assert cmp.top1_agreement == 0.5
    assert cmp.mean_ontime_abs_diff == pytest.approx((0.2 + 0.4 + 0.4) / 4)
    assert cmp.mean_score_abs_diff > 0


def test_orders_without_candidates_are_not_compared() -> None:
    objectives = np.ones((4, 3), dtype=np.float32)
    cmp = compare_shadow(objectives, objectives, np.array([[-1, -1], [1, -1]]), 1, 2)
    assert (cmp.orders, cmp.top1_agreements, cmp.pairs) == (1, 1, 1)


# ---- the fallback chain with a stand-in for dispatch_model -------------------------------


class FakeVersions:
    """Async dispatch_model stand-in: version v answers a version-tagged function of the rows."""

    def __init__(
        self,
        failing: AbstractSet[int] = frozenset(),
        slow: AbstractSet[int] = frozenset(),
        bad: AbstractSet[int] = frozenset(),
    ) -> None:
        self.failing = set(failing)
        self.slow = set(slow)
        self.bad = set(bad)
        self.calls: list[tuple[int, int]] = []

    @staticmethod
    def answer(version: int, features: NDArray[np.float32]) -> NDArray[np.float32]:
        pickup = features[:, PAIR_FEATURE_NAMES.index("pickup_distance_km")]
        eta = 10.0 * version + pickup
        return np.stack([eta, np.full_like(eta, 0.5), np.full_like(eta, 8.0)], axis=1)

    async def __call__(self, version: int, features: NDArray[np.float32]) -> NDArray[Any]:
        self.calls.append((version, features.shape[0]))
        if version in self.slow:
            await asyncio.sleep(5.0)
        if version in self.failing:
            raise RuntimeError(f"version {version} is not loaded")
        if version in self.bad:
            return np.full((features.shape[0], 3), np.nan, dtype=np.float32)
        return self.answer(version, features)


def _routed_input(
    seed: int = 4, orders: int = 30
) -> tuple[NDArray[np.float32], NDArray[np.int32], NDArray[np.int32]]:
    encoded = encode_window(_window(seed, orders, 90), SHANGHAI)
    versions = choose_versions(users(orders), RouterSettings(canary_version=2, canary_percent=50))
    assert set(versions.tolist()) == {1, 2}
    return encoded.pair_features, encoded.candidate_rider_index, versions


def _run(scorer: FakeVersions, shadow: bool = False, **settings: int) -> Any:
    features, candidates, versions = _routed_input()
    options = {"canary_version": 2, "canary_percent": 50, **settings}
    routed = asyncio.run(
        route_and_score(
            features, candidates, versions, RouterSettings(**options), scorer, shadow=shadow
        )
    )
    return routed, features, candidates, versions


def _expected(features: NDArray[np.float32], per_order_version: NDArray[np.int32]) -> Any:
    width = features.shape[0] // per_order_version.size
    rows = np.repeat(per_order_version, width)
    out = np.empty((features.shape[0], 3), dtype=np.float32)
    for v in np.unique(rows):
        if v == 0:
            out[rows == 0] = rule_based_objectives(features[rows == 0])
        else:
            out[rows == v] = FakeVersions.answer(int(v), features[rows == v])
    return out


def test_each_order_is_scored_by_its_version_at_level_0() -> None:
    scorer = FakeVersions()
    routed, features, _, versions = _run(scorer)
    np.testing.assert_array_equal(routed.model_version, versions)
    assert np.all(routed.fallback_level == FallbackLevel.CHOSEN)
    np.testing.assert_allclose(routed.objectives, _expected(features, versions))
    assert sorted(v for v, _ in scorer.calls) == [1, 2]  # one call per version
    assert routed.shadows == ()


def test_a_failing_canary_falls_back_to_the_stable_version() -> None:
    scorer = FakeVersions(failing={2})
    routed, features, _, versions = _run(scorer)
    canary = versions == 2
    assert np.all(routed.fallback_level[canary] == FallbackLevel.STABLE_RETRY)
    assert np.all(routed.fallback_level[~canary] == FallbackLevel.CHOSEN)
    assert np.all(routed.model_version == 1)
    np.testing.assert_allclose(routed.objectives, _expected(features, routed.model_version))
    retry = [call for call in routed.calls if call.role == "retry"]
    assert [(c.version, c.orders) for c in retry] == [(1, int(canary.sum()))]
    (failed,) = [c.error or "" for c in routed.calls if c.version == 2]
    assert failed.startswith("RuntimeError: version 2 is not loaded")


@pytest.mark.parametrize("fault", ["failing", "slow", "bad"])
def test_when_every_version_fails_the_rule_based_dispatcher_answers(fault: str) -> None:
    scorer = FakeVersions(**{fault: {1, 2}})
    routed, features, _, _ = _run(scorer, bls_timeout_ms=20)
    assert np.all(routed.fallback_level == FallbackLevel.RULE_BASED)
    assert np.all(routed.model_version == 0)
    np.testing.assert_allclose(routed.objectives, rule_based_objectives(features))
    errors = {call.error for call in routed.calls}
    assert None not in errors
    if fault == "slow":
        assert errors == {"timeout"}


def test_a_failing_stable_version_is_not_retried() -> None:
    scorer = FakeVersions(failing={1})
    routed, _, _, versions = _run(scorer)
    stable = versions == 1
    assert np.all(routed.fallback_level[stable] == FallbackLevel.RULE_BASED)
    assert np.all(routed.fallback_level[~stable] == FallbackLevel.CHOSEN)
    assert np.all(routed.model_version[~stable] == 2)
    assert [call.role for call in routed.calls].count("retry") == 0


def test_shadow_scoring_never_changes_the_answer() -> None:
    plain, *_ = _run(FakeVersions())
    scorer = FakeVersions()
    shadowed, _, candidates, versions = _run(scorer, shadow=True, shadow_percent=100)
    np.testing.assert_array_equal(shadowed.objectives, plain.objectives)
    np.testing.assert_array_equal(shadowed.model_version, plain.model_version)
    assert sorted(call.role for call in shadowed.calls) == ["primary"] * 2 + ["shadow"] * 2
    pairs = {(c.primary_version, c.shadow_version): c for c in shadowed.shadows}
    assert set(pairs) == {(1, 2), (2, 1)}
    assert pairs[(1, 2)].orders == int(np.sum((versions == 1) & (candidates[:, 0] >= 0)))
    # The fake versions differ by a constant ETA offset: same favourite, different scores.
    assert all(c.top1_agreement == 1.0 and c.mean_score_abs_diff > 0 for c in shadowed.shadows)
    assert all(c.mean_ontime_abs_diff == 0.0 for c in shadowed.shadows)


def test_a_failing_shadow_is_only_a_metric() -> None:
    scorer = FakeVersions(slow={2})
    features, candidates, _ = _routed_input()
    stable_only = np.ones(candidates.shape[0], dtype=np.int32)
    settings = RouterSettings(canary_version=2, shadow_percent=100, bls_timeout_ms=20)
    routed = asyncio.run(
        route_and_score(features, candidates, stable_only, settings, scorer, shadow=True)
    )
    assert np.all(routed.fallback_level == 0) and np.all(routed.model_version == 1)
    assert routed.shadows == ()
    assert [(c.role, c.error) for c in routed.calls if c.version == 2] == [("shadow", "timeout")]


def test_mismatched_tensors_are_input_errors() -> None:
    features, candidates, versions = _routed_input()
    with pytest.raises(DispatchInputError, match="PAIR_FEATURES"):
        asyncio.run(route_and_score(features[:-1], candidates, versions, CANARY, FakeVersions()))
    with pytest.raises(DispatchInputError, match="CANDIDATE_RIDER_INDEX"):
        asyncio.run(
            route_and_score(features, candidates.reshape(-1), versions, CANARY, FakeVersions())
        )
    with pytest.raises(DispatchInputError, match=r"ORDER_TEXT\[user_id\]"):
        asyncio.run(route_and_score(features, candidates, versions[:-1], CANARY, FakeVersions()))


def test_non_finite_features_are_rejected_not_answered_by_the_fallback() -> None:
    features, candidates, versions = _routed_input()
    features = features.copy()
    features[0, 0] = np.nan
    with pytest.raises(DispatchInputError, match="PAIR_FEATURES: must be finite"):
        asyncio.run(route_and_score(features, candidates, versions, CANARY, FakeVersions()))


def test_observations_count_calls_levels_and_fallbacks() -> None:
    routed, _, _, versions = _run(FakeVersions(failing={2}), shadow=False)
    sink = InMemoryMetrics()
    sink.record(routed_observations(routed))
    canary = int(np.sum(versions == 2))
    stable = versions.size - canary
    assert sink.counter(MODEL_CALLS, model_version="2", role="primary") == 1
    assert sink.counter(MODEL_CALLS, model_version="1", role="retry") == 1
    assert sink.counter(MODEL_ERRORS, model_version="2", role="primary", reason="error") == 1
    assert sink.counter(ROUTED_ORDERS, model_version="1", level="0", city="none") == stable
    assert sink.counter(ROUTED_ORDERS, model_version="1", level="1", city="none") == canary
    assert sink.counter(FALLBACK_ORDERS, model_version="2", level="1", city="none") == canary
    assert sink.counter(FALLBACK_ORDERS, model_version="1", level="1", city="none") == 0


def _reference_counts(*columns: NDArray[np.int32]) -> dict[tuple[int, ...], int]:
    """What the counts were before their fast paths: np.unique over (column, ...) rows."""
    if columns[0].size == 0:
        return {}
    unique, counts = np.unique(np.stack(columns, axis=1), axis=0, return_counts=True)
    return {tuple(row): count for row, count in zip(unique.tolist(), counts.tolist(), strict=True)}


@pytest.mark.parametrize("seed", range(40))
def test_order_counts_match_the_unique_rows_reference(seed: int) -> None:
    rng = np.random.default_rng(seed)
    orders = int(rng.integers(0, 6))
    kinds = int(rng.integers(1, 3))  # 1: every order alike, the fast path
    chosen = rng.integers(1, 1 + kinds, orders).astype(np.int32)
    level = rng.choice(np.asarray([0, 1, 2, 3], dtype=np.int32)[: 1 + kinds], orders)
    version = np.where(level == 2, 0, chosen).astype(np.int32)
    routed = RoutedScores(np.zeros((0, 3), np.float32), version, level, chosen)
    assert answered_counts(routed) == _reference_counts(version, level)
    fell = np.isin(level, (1, 2))
    assert fallback_counts(routed) == _reference_counts(chosen[fell], level[fell])
    assert list(answered_counts(routed)) == sorted(answered_counts(routed))  # ascending keys


def test_observations_of_shadow_comparisons() -> None:
    routed, *_ = _run(FakeVersions(), shadow=True, shadow_percent=100)
    sink = InMemoryMetrics()
    sink.record(routed_observations(routed))
    orders = sink.counter(SHADOW_ORDERS, primary="1", shadow="2")
    assert orders > 0
    assert sink.counter(SHADOW_TOP1_AGREEMENTS, primary="1", shadow="2") == orders
    assert sink.counter(MODEL_CALLS, model_version="2", role="shadow") == 1


@pytest.mark.parametrize(
    ("failing", "bad", "shadow"),
    [
        (set(), set(), False),
        (set(), set(), True),
        ({2}, set(), True),
        ({1, 2}, set(), False),
        (set(), {2}, True),
    ],
)
def test_in_process_routing_answers_as_the_async_one(
    failing: set[int], bad: set[int], shadow: bool
) -> None:
    features, candidates, versions = _routed_input()
    settings = RouterSettings(canary_version=2, canary_percent=50)
    async_scorer = FakeVersions(failing=failing, bad=bad)
    expected = asyncio.run(
        route_and_score(features, candidates, versions, settings, async_scorer, shadow=shadow)
    )

    def now(version: int, rows: NDArray[np.float32]) -> NDArray[Any]:
        return asyncio.run(async_scorer(version, rows))

    got = route_and_score_sync(features, candidates, versions, settings, now, shadow=shadow)
    np.testing.assert_array_equal(got.objectives, expected.objectives)
    np.testing.assert_array_equal(got.model_version, expected.model_version)
    np.testing.assert_array_equal(got.fallback_level, expected.fallback_level)
    assert [(c.version, c.role, c.orders, c.error) for c in got.calls] == [
        (c.version, c.role, c.orders, c.error) for c in expected.calls
    ]
    assert got.shadows == expected.shadows


# ---- several windows at once: route_and_score_many ------------------------------------------


def _batch_items(
    seed: int, count: int, shadow: bool, nan_window: int | None = None
) -> tuple[list[RouteItem], list[int]]:
    """Windows of different sizes, canary at 50 %; ``nan_window``'s rows make version 2
    answer NaN (`RowPoison`). Returns the items and each window's pair rows."""
    rng = np.random.default_rng(seed)
    items, rows = [], []
    for number in range(count):
        orders = int(rng.integers(1, 9))
        window = _window(seed * 100 + number, orders, int(rng.integers(3, 40)))
        encoded = encode_window(window, SHANGHAI)
        features = encoded.pair_features.copy()
        if number == nan_window:
            features[:, 0] = RowPoison.MARK
        settings = RouterSettings(canary_version=2, canary_percent=50, shadow_percent=100)
        versions = choose_versions(users(orders, f"w{seed}-{number}"), settings)
        items.append(
            RouteItem(features, encoded.candidate_rider_index, versions, settings, shadow=shadow)
        )
        rows.append(features.shape[0])
    return items, rows


class RowPoison(FakeVersions):
    """Version 2 answers NaN for rows marked in feature 0 (one window's data), as a model
    can for rows it cannot score; every other row as FakeVersions."""

    MARK = -12345.0

    def now(self, version: int, features: NDArray[np.float32]) -> NDArray[Any]:
        self.calls.append((version, features.shape[0]))
        if version in self.failing:
            raise RuntimeError(f"version {version} is not loaded")
        out = self.answer(version, features)
        if version == 2:
            out[features[:, 0] == self.MARK] = np.nan
        return out


def _same_routing(got: RoutedScores, alone: RoutedScores) -> None:
    for name in ("objectives", "model_version", "fallback_level", "chosen_version"):
        a, b = getattr(got, name), getattr(alone, name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
    strip = [(c.version, c.role, c.orders, c.error) for c in alone.calls]
    assert [(c.version, c.role, c.orders, c.error) for c in got.calls] == strip
    assert [(s.primary_version, s.shadow_version, s.orders) for s in got.shadows] == [
        (s.primary_version, s.shadow_version, s.orders) for s in alone.shadows
    ]


@pytest.mark.parametrize(
    ("failing", "nan_window", "shadow"),
    [(set(), None, False), (set(), None, True), ({2}, None, True), (set(), 1, False)],
    ids=["plain", "shadow", "canary-fails", "one-window-nan"],
)
def test_windows_routed_together_answer_as_each_alone(
    failing: set[int], nan_window: int | None, shadow: bool
) -> None:
    items, _ = _batch_items(3, 5, shadow, nan_window)
    together_scorer = RowPoison(failing=failing)
    together = route_and_score_many_sync(items, together_scorer.now)
    alone_scorer = RowPoison(failing=failing)
    for item, got in zip(items, together, strict=True):
        assert isinstance(got, RoutedScores), got
        alone = route_and_score_sync(
            item.features, item.candidates, item.versions, item.settings,
            alone_scorer.now, shadow=item.shadow,
        )  # fmt: skip
        _same_routing(got, alone)
    if nan_window is not None:  # only the poisoned window fell back from its canary orders
        levels = [int(r.fallback_level.max()) for r in together if isinstance(r, RoutedScores)]
        assert levels[nan_window] == FallbackLevel.STABLE_RETRY
        assert all(
            level == FallbackLevel.CHOSEN for n, level in enumerate(levels) if n != nan_window
        )


def test_one_call_per_version_per_round_for_the_whole_batch() -> None:
    items, rows = _batch_items(5, 6, shadow=True)
    scorer = RowPoison()
    route_and_score_many_sync(items, scorer.now)
    # Round one: every window's primary and shadow calls, joined by version: 1 and 2 once.
    assert sorted(version for version, _ in scorer.calls) == [1, 2]
    # With shadows at 100 % every row is scored by both versions.
    assert sum(count for _, count in scorer.calls) == 2 * sum(rows)


def test_a_joined_call_is_timed_as_each_window_s_share_of_it() -> None:
    now = [0.0]
    scorer = RowPoison()

    def one_second(version: int, features: NDArray[np.float32]) -> NDArray[Any]:
        now[0] += 1.0  # every call takes one second of the fake clock
        return scorer.now(version, features)

    items, rows = _batch_items(7, 4, shadow=False)
    items = [
        RouteItem(i.features, i.candidates, np.ones_like(i.versions), i.settings) for i in items
    ]  # every order on version 1: one call in all
    routed = route_and_score_many_sync(items, one_second, clock=lambda: now[0])
    seconds = []
    for got, count in zip(routed, rows, strict=True):
        assert isinstance(got, RoutedScores)
        (call,) = got.calls
        assert call.seconds == pytest.approx(count / sum(rows))
        seconds.append(call.seconds)
    assert now[0] == 1.0 and sum(seconds) == pytest.approx(1.0)


def test_a_bad_window_fails_alone_in_a_batch() -> None:
    items, _ = _batch_items(9, 3, shadow=False)
    bad = RouteItem(items[1].features[:-1], items[1].candidates, items[1].versions, CANARY)
    routed = route_and_score_many_sync([items[0], bad, items[2]], RowPoison().now)
    assert isinstance(routed[1], DispatchInputError)
    assert routed[1].tensor == "PAIR_FEATURES"
    assert all(isinstance(routed[n], RoutedScores) for n in (0, 2))
    assert route_and_score_many_sync([], RowPoison().now) == []


def test_a_joined_call_that_times_out_fails_each_window_without_a_second_try() -> None:
    items, _ = _batch_items(11, 3, shadow=False)
    items = [
        RouteItem(i.features, i.candidates, np.full_like(i.versions, 2), RouterSettings(
            canary_version=2, canary_percent=100, bls_timeout_ms=20
        )) for i in items
    ]  # fmt: skip
    scorer = FakeVersions(slow={2})
    routed = asyncio.run(route_and_score_many(items, scorer))
    assert [version for version, _ in scorer.calls] == [2, 1]  # one joined call, one retry
    for got in routed:
        assert isinstance(got, RoutedScores)
        assert [(c.version, c.role, c.error) for c in got.calls] == [
            (2, "primary", "timeout"),
            (1, "retry", None),
        ]
        assert np.all(got.fallback_level == FallbackLevel.STABLE_RETRY)
