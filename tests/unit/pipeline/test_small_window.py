"""dispatch_service.pipeline.small_window: a one-order window's stages done directly.

The wiring test compares the path with the general steps (the same library, so it checks
only that both give one answer); the others check its answers against values worked out
here from the objectives and the scoring rule, and its errors against the contract's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import RIDER_FIELD_COLUMNS
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.cities import default_registry
from dispatch_service.domain.scoring import ResolverSettings
from dispatch_service.domain.window_wire import window_from_wire, window_to_wire
from dispatch_service.offline.simulator import REGIMES, city_world, generate_regime_window
from dispatch_service.pipeline import encoder_step
from dispatch_service.pipeline import fused as fused_module
from dispatch_service.pipeline.fused import FusedDispatch, FusedResult
from dispatch_service.pipeline.small_window import resolved_one_order
from dispatch_service.routing.fallback import FallbackLevel
from dispatch_service.routing.settings import FusedSettings, RouterSettings
from perf.window_answers import answer_digests, fused_dispatch

Tensors = dict[str, NDArray[Any]]
_LOAD = RIDER_FIELD_COLUMNS.index("load")
_CAPACITY = RIDER_FIELD_COLUMNS.index("capacity")


@pytest.fixture(scope="module")
def paths() -> tuple[FusedDispatch, FusedDispatch]:
    """The same dispatch with the small-window path (first) and without it."""
    small = fused_dispatch()
    assert small.small_windows
    return small, dataclasses.replace(small, small_windows=False)


def _random_windows(count: int, seed: int) -> Iterator[Tensors]:
    """Simulator windows of every city and regime, mostly of one order and up to 40 riders
    (some of two or three), with what the path must get right: co-located twins (the
    same rider twice: tied distances and tied scores), full riders, a single spare slot,
    request weights with zeros."""
    rng = np.random.default_rng(seed)
    cities = default_registry().cities
    worlds = {city.id: city_world(city) for city in cities}
    regimes = list(REGIMES.values())
    for number in range(count):
        city = cities[number % len(cities)]
        orders = int(rng.integers(2, 4)) if number % 6 == 5 else 1
        regime = dataclasses.replace(
            regimes[number % len(regimes)], num_orders=orders, num_riders=int(rng.integers(1, 41))
        )
        tensors = window_to_wire(generate_regime_window(rng, regime, worlds[city.id]))
        riders = tensors["RIDER_FIELDS"]
        if riders.shape[0] > 2 and rng.random() < 0.3:  # a twin of rider 0
            riders[int(rng.integers(1, riders.shape[0]))] = riders[0]
        if rng.random() < 0.3:  # some riders full
            full = rng.random(riders.shape[0]) < 0.5
            riders[full, _LOAD] = riders[full, _CAPACITY]
        if rng.random() < 0.1:  # one spare slot in all
            riders[:, _LOAD] = riders[:, _CAPACITY]
            riders[0, _LOAD] = riders[0, _CAPACITY] - 1
        if rng.random() < 0.5:
            weights = rng.choice([0.0, 0.5, 1.0, 2.0], size=3).astype(np.float32)
            weights[int(rng.integers(0, 3))] = 1.0  # a positive sum
            tensors["OBJECTIVE_WEIGHTS"] = weights
        yield tensors


def _counted(
    monkeypatch: pytest.MonkeyPatch, name: str, module: ModuleType = fused_module
) -> list[bool]:
    """Whether each call of ``module``'s ``name`` answered (not None)."""
    original: Callable[..., Any] = getattr(module, name)
    answered: list[bool] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        answered.append(result is not None)
        return result

    monkeypatch.setattr(module, name, spy)
    return answered


def _same(got: FusedResult, expected: FusedResult) -> None:
    assert answer_digests(got) == answer_digests(expected)
    for name in ("model_version", "fallback_level", "chosen_version"):
        np.testing.assert_array_equal(getattr(got.routed, name), getattr(expected.routed, name))
    assert [(c.version, c.role, c.orders, c.error) for c in got.routed.calls] == [
        (c.version, c.role, c.orders, c.error) for c in expected.routed.calls
    ]
    assert got.city == expected.city


def test_wiring_small_path_answers_as_the_general_steps_on_random_windows(
    paths: tuple[FusedDispatch, FusedDispatch], monkeypatch: pytest.MonkeyPatch
) -> None:
    small, general = paths
    listed = _counted(monkeypatch, "one_order_candidates", encoder_step)
    routed = _counted(monkeypatch, "routed_alone")
    resolved = _counted(monkeypatch, "resolved_one_order")
    for tensors in _random_windows(400, seed=49):
        expected = general.run(tensors)
        _same(small.run(tensors), expected)
    # the path answered most windows itself, and left some to the general code
    assert sum(listed) > 120 and sum(routed) > 300 and sum(resolved) > 250
    assert not all(listed) and not all(resolved)


def test_wiring_small_path_with_shadow_scoring_and_a_canary(
    paths: tuple[FusedDispatch, FusedDispatch],
) -> None:
    """Shadow scoring and a half canary share: the general routing answers, the resolver's
    path still applies; the answers are the general steps'."""
    routing = RouterSettings(stable_version=1, canary_version=2, canary_percent=50,
                             shadow_percent=100)  # fmt: skip
    small, general = (dataclasses.replace(path, settings=FusedSettings(routing)) for path in paths)
    for tensors in _random_windows(40, seed=7):
        expected = general.run(tensors)
        got = small.run(tensors)
        _same(got, expected)
        assert "shadow" in [c.role for c in got.routed.calls]


def test_wiring_bad_input_raises_the_general_steps_error(
    paths: tuple[FusedDispatch, FusedDispatch],
) -> None:
    """Broken one-order windows, weights and answers: the same error, tensor and rule."""
    base = next(_random_windows(1, seed=3))
    cases: list[Tensors] = []
    for name, value in (
        ("OBJECTIVE_WEIGHTS", np.asarray([-1.0, 1.0, 1.0], dtype=np.float32)),
        ("OBJECTIVE_WEIGHTS", np.asarray([1.0, 1.0], dtype=np.float32)),
        ("OBJECTIVE_WEIGHTS", np.asarray([1.0, 1.0, 1.0], dtype=np.float64)),
        ("RIDER_FIELDS", base["RIDER_FIELDS"][:, :-1]),
        ("RIDER_IDS", base["RIDER_IDS"][:-1]),
        ("ORDER_FIELDS", np.full_like(base["ORDER_FIELDS"], np.nan)),
    ):
        cases.append({**base, name: value})
    cases.append({k: v for k, v in base.items() if k != "RIDER_IDS"})
    for tensors in cases:
        errors = []
        for path in paths:
            with pytest.raises(DispatchInputError) as caught:
                path.run(tensors)
            errors.append((caught.value.tensor, caught.value.rule, caught.value.code))
        assert errors[0] == errors[1]


def _one_order(riders: int = 4) -> tuple[Tensors, Any]:
    tensors = next(_random_windows(1, seed=11))
    tensors["RIDER_FIELDS"] = tensors["RIDER_FIELDS"][:riders].copy()
    tensors["RIDER_FIELDS"][:, _LOAD] = 0
    tensors["RIDER_IDS"] = np.asarray([f"r{i}".encode() for i in range(riders)], dtype=object)
    tensors.pop("OBJECTIVE_WEIGHTS", None)
    return tensors, window_from_wire(tensors)


def test_the_best_scored_rider_is_assigned_and_listed_first() -> None:
    """Scores worked out here: weights (1, 1, 1), utilities 1 / (1 + eta / 30), clip(p),
    1 / (1 + cost / 10)."""
    tensors, window = _one_order()
    tensors["OBJECTIVE_WEIGHTS"] = np.ones(3, dtype=np.float32)
    candidates = np.asarray([[2, 0, 3, 1]], dtype=np.int32)
    objectives = np.asarray(
        [[20.0, 0.9, 5.0], [10.0, 0.95, 4.0], [40.0, 0.5, 9.0], [10.0, 0.95, 6.0]],
        dtype=np.float32,
    )
    got = resolved_one_order(tensors, candidates, objectives, window, ResolverSettings(top_k=3))
    assert got is not None
    # candidate 1 (rider 0) dominates; then candidate 3 (rider 1), then 0 (rider 2)
    assert got["TOPK_RIDER_INDEX"].tolist() == [[0, 1, 2]]
    assert got["ASSIGNED_RIDER_INDEX"].tolist() == [0]
    best = ((1 / (1 + 10 / 30)) + 0.95 + 1 / (1 + 4 / 10)) / 3
    assert got["ASSIGNED_SCORE"].tolist() == [pytest.approx(best, rel=1e-6)]
    assert got["ASSIGNED_OBJECTIVES"].tolist() == [pytest.approx([10.0, 0.95, 4.0])]
    assert got["TOPK_OBJECTIVES"][0, 0].tolist() == pytest.approx([best, 10.0, 0.95, 4.0])


def test_a_full_rider_is_listed_but_not_assigned() -> None:
    tensors, window = _one_order()
    tensors["RIDER_FIELDS"][0, _LOAD] = tensors["RIDER_FIELDS"][0, _CAPACITY]
    window = window_from_wire(tensors)
    candidates = np.asarray([[0, 1, -1, -1]], dtype=np.int32)
    objectives = np.asarray(
        [[5.0, 1.0, 1.0], [50.0, 0.5, 9.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=np.float32
    )
    got = resolved_one_order(tensors, candidates, objectives, window, ResolverSettings())
    assert got is not None
    assert got["TOPK_RIDER_INDEX"].tolist() == [[0, 1, -1, -1]]
    assert got["ASSIGNED_RIDER_INDEX"].tolist() == [1]  # rider 0 has no room left
    assert got["TOPK_OBJECTIVES"][0, 2:].tolist() == [[0.0] * 4, [0.0] * 4]


def test_an_exact_tie_for_the_best_rider_is_left_to_the_solver() -> None:
    tensors, window = _one_order()
    candidates = np.asarray([[0, 1, 2, 3]], dtype=np.int32)
    objectives = np.asarray([[10.0, 0.9, 5.0]] * 2 + [[30.0, 0.5, 9.0]] * 2, dtype=np.float32)
    assert resolved_one_order(tensors, candidates, objectives, window, ResolverSettings()) is None


def test_a_negative_eta_is_refused_naming_the_tensor() -> None:
    tensors, window = _one_order()
    candidates = np.asarray([[0, 1, 2, 3]], dtype=np.int32)
    objectives = np.asarray([[10.0, 0.9, 5.0]] * 3 + [[-1.0, 0.5, 9.0]], dtype=np.float32)
    with pytest.raises(DispatchInputError) as caught:
        resolved_one_order(tensors, candidates, objectives, window, ResolverSettings())
    assert caught.value.tensor == "PAIR_OBJECTIVES"
    assert "row 3" in caught.value.rule


def test_wiring_small_path_reports_cpu_scoring_as_the_general_steps(
    paths: tuple[FusedDispatch, FusedDispatch],
) -> None:
    """While the scoring model runs on CPU instances every chosen order says so."""
    routing = RouterSettings(stable_version=1, cpu_scoring=1)
    small, general = (dataclasses.replace(path, settings=FusedSettings(routing)) for path in paths)
    for tensors in _random_windows(20, seed=5):
        got = small.run(tensors)
        _same(got, general.run(tensors))
        assert set(got.routed.fallback_level.tolist()) == {FallbackLevel.CPU_SCORED}
