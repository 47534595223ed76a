"""Per-city routing: each city's stable / canary / share, read once from the routing's JSON
form (a fleet revision, the live routing file), held to the global rules, and applied per
window."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_service.core.metrics import InMemoryMetrics
from dispatch_service.core.settings import SettingsError
from dispatch_service.routing.engine import RoutedScores
from dispatch_service.routing.metrics import (
    FALLBACK_ORDERS,
    NO_CITY,
    ROUTED_ORDERS,
    routed_observations,
)
from dispatch_service.routing.policy import route_window, user_buckets
from dispatch_service.routing.settings import (
    CityRoute,
    FusedSettings,
    RouterSettings,
    settings_record,
)

Route = dict[str, Any]
ROUTES: list[Route] = [
    {"city": "chengdu", "canary_version": 2, "canary_percent": 100},
    {"city": "beijing", "canary_version": 2, "canary_percent": 10},
]


def users(count: int) -> NDArray[np.object_]:
    return np.asarray([f"user-{i}".encode() for i in range(count)], dtype=object)


def settings(routes: list[Route] | None = None, **plain: int) -> RouterSettings:
    """The routing of a revision: version 1 for all, no canary, ``plain`` and ``routes``."""
    document = {**RouterSettings().to_document(), **plain}
    document["city_routes"] = ROUTES if routes is None else routes
    return RouterSettings.from_document(document)


def every_version(version: int) -> bool:
    return True


def test_routes_are_read_once_into_typed_routes_in_city_order() -> None:
    parsed = settings()
    assert parsed.city_routes == (
        CityRoute("beijing", canary_version=2, canary_percent=10),
        CityRoute("chengdu", canary_version=2, canary_percent=100),
    )
    # Written back as the same objects, in city order (one log line: the same form).
    expected = [ROUTES[1], ROUTES[0]]
    assert parsed.to_document()["city_routes"] == expected
    assert RouterSettings.from_document(parsed.to_document()) == parsed
    assert settings_record(parsed)["city_routes"] == expected
    assert RouterSettings.from_parameters({}).city_routes == ()


@pytest.mark.parametrize(
    ("routes", "names"),
    [
        ([{"city": "beijing", "canary_version": 1}], ("beijing", "canary_version must differ")),
        (
            [{"city": "beijing", "canary_percent": 10}],
            ("beijing", "canary_percent > 0 needs a canary_version"),
        ),
        (
            [{"city": "beijing", "canary_version": 2, "canary_percent": 101}],
            ("beijing", "canary_percent"),
        ),
        ([{"city": "beijing", "stable_version": 0}], ("beijing", "stable_version must be >= 1")),
        (
            [{"city": "beijing", "canary_percent": "ten"}],
            ("city_routes[0].canary_percent", "'ten'"),
        ),
        ([{"city": "beijing", "shadow_percent": 5}], ("beijing", "shadow_percent")),
        (
            [{"city": "beijing", "canary_version": 2}, {"city": "beijing", "canary_percent": 5}],
            ("beijing", "more than one"),
        ),
        ([{"city": "bei jing", "canary_version": 2}], ("bei jing", "not a city id")),
        ([{"city": "beijing"}], ("beijing", "sets none of")),
        ([{"canary_version": 2}], ("city_routes[0]", "city id")),
    ],
)
def test_a_bad_route_is_refused_naming_the_city_and_field(
    routes: list[Route], names: tuple[str, ...]
) -> None:
    with pytest.raises(SettingsError) as caught:
        settings(routes)
    for name in names:
        assert name in str(caught.value)


def test_a_city_route_is_held_to_the_global_settings_it_leaves_in_place() -> None:
    """A route that does not set stable_version takes the global one: a global change that
    makes a city's route break a rule is refused naming the city."""
    with pytest.raises(SettingsError, match="city_routes beijing: canary_version must differ"):
        settings(stable_version=2)
    with pytest.raises(ValueError, match="city_routes beijing"):
        RouterSettings(city_routes=(CityRoute("beijing"),))


def test_routes_name_registered_cities_only() -> None:
    settings([{"city": "atlantis", "canary_version": 2}]).check_cities(("atlantis",))
    with pytest.raises(ValueError, match="city_routes atlantis: not a registered city"):
        settings([{"city": "atlantis", "canary_version": 2}]).check_cities(("beijing", "shanghai"))


def test_for_city_gives_the_settings_in_force_for_a_window_of_that_city() -> None:
    routed = settings(shadow_percent=5)
    beijing = routed.for_city("beijing")
    assert (beijing.stable_version, beijing.canary_version, beijing.canary_percent) == (1, 2, 10)
    assert beijing.shadow_percent == 5 and beijing.city_routes == ()  # the rest: global
    for city in ("shanghai", None):  # no route of its own, or no city known: the global ones
        assert routed.for_city(city) is routed
    assert routed.for_city("beijing") is beijing  # built once per settings and city


def test_a_beijing_window_goes_to_its_canary_while_a_shanghai_window_stays_on_stable() -> None:
    routed = settings([{"city": "beijing", "canary_version": 2, "canary_percent": 100}])
    ids = users(50)
    in_force, beijing = route_window(ids, None, routed, every_version, "beijing")
    assert in_force.canary_percent == 100 and (beijing == 2).all()
    _, shanghai = route_window(ids, None, routed, every_version, "shanghai")
    assert (shanghai == 1).all()
    _, unknown = route_window(ids, None, routed, every_version)  # dispatch_features
    assert (unknown == 1).all()
    tag = np.asarray([b"canary"], dtype=object)  # the tag means the city's canary
    assert (route_window(ids, tag, routed, every_version, "shanghai")[1] == 1).all()
    assert (route_window(ids, tag, routed, every_version, "beijing")[1] == 2).all()
    # a canary that is not served is out of routing in that city too
    assert (route_window(ids, None, routed, lambda v: v == 1, "beijing")[1] == 1).all()


def test_a_user_keeps_one_bucket_in_every_city() -> None:
    routed = settings()
    ids = users(2000)
    buckets = user_buckets(ids)
    beijing = route_window(ids, None, routed, every_version, "beijing")[1]
    chengdu = route_window(ids, None, routed, every_version, "chengdu")[1]
    np.testing.assert_array_equal(beijing == 2, buckets < 10)
    assert (chengdu == 2).all()
    assert 0.05 < float(np.mean(beijing == 2)) < 0.15


def test_with_route_changes_one_city_or_every_city() -> None:
    routed = settings()
    one = routed.with_route("shenzhen", canary_version=3, canary_percent=5)
    assert one.route_of("shenzhen") == CityRoute("shenzhen", canary_version=3, canary_percent=5)
    assert one.route_of("beijing") == routed.route_of("beijing")
    assert (one.canary_version, one.canary_percent) == (0, 0)  # the global route unchanged
    off = one.with_route("beijing", canary_percent=0)
    assert off.route_of("beijing") == CityRoute("beijing", canary_version=2, canary_percent=0)
    every = one.with_route(None, canary_version=3, canary_percent=20)
    assert every.city_routes == () and (every.canary_version, every.canary_percent) == (3, 20)
    kept = settings([{"city": "beijing", "stable_version": 2, "canary_version": 3}]).with_route(
        None, canary_version=0
    )
    assert kept.city_routes == (CityRoute("beijing", stable_version=2),)  # stable stays its own
    with pytest.raises(ValueError, match="city_routes beijing: canary_version must differ"):
        routed.with_route("beijing", canary_version=1)
    with pytest.raises(ValueError, match="not a per-city setting"):
        routed.with_route("beijing", shadow_percent=5)  # type: ignore[call-arg]


def test_every_routed_version_loads_with_dispatch_fused() -> None:
    routed = settings(
        [{"city": "beijing", "stable_version": 3, "canary_version": 4, "canary_percent": 5}]
    )
    assert routed.routed_versions() == (1, 3, 4)
    fused = FusedSettings(routed)
    assert fused.served_versions() == (1, 3, 4)
    both = FusedSettings(
        RouterSettings(1, 2, 10, scoring_versions=(1, 2, 5), city_routes=routed.city_routes)
    )
    assert both.served_versions() == (1, 2, 3, 4, 5)


def routed_scores(versions: list[int], levels: list[int], chosen: list[int]) -> RoutedScores:
    def ints(values: list[int]) -> Any:
        return np.asarray(values, dtype=np.int32)

    return RoutedScores(np.zeros((0, 3), np.float32), ints(versions), ints(levels), ints(chosen))


def test_order_metrics_carry_the_windows_city() -> None:
    sink = InMemoryMetrics()
    sink.record(routed_observations(routed_scores([2, 2, 1], [0, 0, 1], [2, 2, 2]), city="beijing"))
    sink.record(routed_observations(routed_scores([1], [0], [1]), city=None))
    assert sink.counter(ROUTED_ORDERS, model_version="2", level="0", city="beijing") == 2
    assert sink.counter(ROUTED_ORDERS, model_version="1", level="1", city="beijing") == 1
    assert sink.counter(FALLBACK_ORDERS, model_version="2", level="1", city="beijing") == 1
    assert sink.counter(ROUTED_ORDERS, model_version="1", level="0", city=NO_CITY) == 1
