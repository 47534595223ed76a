"""dispatch_service.pipeline.fused: the ensemble's answer, routing and fallback in one process."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import DISPATCH_ENSEMBLE_OUTPUTS, RESOLVER_OUTPUTS
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import (
    ENCODER_MODEL,
    FUSED_MODEL,
    RESOLVER_MODEL,
    SCORING_MODEL,
    model_layout,
)
from dispatch_service.core.settings import SettingsError
from dispatch_service.core.signing import (
    SigningError,
    TrustedKeys,
    generate_private_key,
    sign_version,
)
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import city_worlds, generate_window
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from dispatch_service.pipeline.fused import FusedDispatch, FusedResult
from dispatch_service.routing.engine import NOT_SERVED
from dispatch_service.routing.fallback import FallbackLevel
from dispatch_service.routing.settings import CityRoute, FusedSettings, RouterSettings

Tensors = dict[str, NDArray[Any]]


def window(seed: int = 3, orders: int = 24, riders: int = 80, **extra: NDArray[Any]) -> Tensors:
    tensors = window_to_wire(generate_window(np.random.default_rng(seed), orders, riders))
    return {**tensors, **extra}


def tag(value: str) -> NDArray[Any]:
    return np.asarray([value.encode()], dtype=object)


SHIPPED = FusedSettings.from_parameters(
    config_parameters(model_layout(MODEL_REPOSITORY, FUSED_MODEL).config)
)


@pytest.fixture(scope="module")
def fused() -> FusedDispatch:
    return FusedDispatch.from_repository(MODEL_REPOSITORY, SHIPPED)


@pytest.fixture(scope="module")
def pipelines() -> dict[int, DispatchPipeline]:
    return {v: DispatchPipeline.from_repository(model_version=v) for v in (1, 2)}


def run(dispatch: FusedDispatch, tensors: Tensors) -> FusedResult:
    return dispatch.run(tensors)


def assert_same_answer(got: Tensors, expected: Tensors) -> None:
    for spec in RESOLVER_OUTPUTS:
        np.testing.assert_array_equal(got[spec.name], expected[spec.name], err_msg=spec.name)


def test_wiring_answers_like_the_pipeline_of_the_stable_version(
    fused: FusedDispatch, pipelines: dict[int, DispatchPipeline]
) -> None:
    """Wiring, not correctness: the fused composition of the same steps gives the ensemble
    pipeline's answer (the steps are tested against independent references elsewhere)."""
    for seed in (1, 2, 3):
        tensors = window(seed)
        result = run(fused, tensors)
        assert set(result.outputs) == {spec.name for spec in DISPATCH_ENSEMBLE_OUTPUTS}
        assert_same_answer(result.outputs, pipelines[1].run(tensors))
        assert (result.outputs["ORDER_MODEL_VERSION"] == 1).all()
        assert (result.outputs["ORDER_FALLBACK_LEVEL"] == FallbackLevel.CHOSEN).all()
        assert result.encode_ms > 0 and result.resolve_ms > 0


def test_the_tag_forces_the_canary_version(
    fused: FusedDispatch, pipelines: dict[int, DispatchPipeline]
) -> None:
    tensors = window(4, MODEL_VERSION_TAG=tag("canary"))
    result = run(fused, tensors)
    assert_same_answer(result.outputs, pipelines[2].run(tensors))
    assert (result.outputs["ORDER_MODEL_VERSION"] == 2).all()


def test_each_window_is_answered_with_the_city_it_was_drawn_in(fused: FusedDispatch) -> None:
    """WINDOW_CITY: the simulator drew each window inside one registered city's world; alone
    and in one batch of windows from four cities, each answer names that city."""
    worlds = city_worlds()
    drawn = {
        city: window_to_wire(generate_window(np.random.default_rng(7), 5, 20, config=world))
        for city, world in worlds.items()
    }
    assert set(drawn) == {"shanghai", "beijing", "shenzhen", "chengdu"}
    for city, tensors in drawn.items():
        assert run(fused, tensors).outputs["WINDOW_CITY"].tolist() == [city.encode()]
    batch = fused.run_batch(list(drawn.values()))
    answers = [r.outputs["WINDOW_CITY"].tolist() for r in batch if isinstance(r, FusedResult)]
    assert answers == [[city.encode()] for city in drawn]


def test_a_bad_tag_names_the_tensor(fused: FusedDispatch) -> None:
    with pytest.raises(DispatchInputError) as caught:
        run(fused, window(MODEL_VERSION_TAG=tag("blue")))
    assert caught.value.tensor == "MODEL_VERSION_TAG"


def test_a_bad_window_names_the_tensor_and_the_rule(fused: FusedDispatch) -> None:
    tensors = window()
    tensors["RIDER_FIELDS"] = tensors["RIDER_FIELDS"][:, :-1]
    with pytest.raises(DispatchInputError) as caught:
        run(fused, tensors)
    assert caught.value.tensor == "RIDER_FIELDS"
    assert "[*, 6]" in caught.value.rule


def test_canary_share_routes_users_as_the_router_does(fused: FusedDispatch) -> None:
    routing = RouterSettings(stable_version=1, canary_version=2, canary_percent=50)
    half = dataclasses.replace(fused, settings=FusedSettings(routing))
    versions = run(half, window(5, orders=200, riders=400)).outputs["ORDER_MODEL_VERSION"]
    assert set(versions.tolist()) == {1, 2}
    again = run(half, window(5, orders=200, riders=400)).outputs["ORDER_MODEL_VERSION"]
    np.testing.assert_array_equal(versions, again)  # sticky: by user, not by draw


def test_an_unavailable_canary_is_out_of_routing(
    fused: FusedDispatch, pipelines: dict[int, DispatchPipeline]
) -> None:
    """A canary whose session did not load is routed like no canary: stable at level 0;
    its own number as a tag is not called and the stable version answers at level 1."""
    stable_only = dataclasses.replace(
        fused, scorers={1: fused.scorers[1]}, unavailable={2: "model.onnx did not load"}
    )
    for name, level in (("canary", FallbackLevel.CHOSEN), ("2", FallbackLevel.STABLE_RETRY)):
        tensors = window(6, MODEL_VERSION_TAG=tag(name))
        result = run(stable_only, tensors)
        assert_same_answer(result.outputs, pipelines[1].run(tensors))
        assert (result.outputs["ORDER_MODEL_VERSION"] == 1).all()
        assert (result.outputs["ORDER_FALLBACK_LEVEL"] == level).all()
    (failed,) = [call for call in result.routed.calls if call.error is not None]
    assert (failed.version, failed.error, failed.called) == (2, NOT_SERVED, False)
    half = dataclasses.replace(
        stable_only,
        settings=FusedSettings(
            RouterSettings(stable_version=1, canary_version=2, canary_percent=50)
        ),
    )
    outputs = run(half, window(5, orders=200, riders=400)).outputs
    assert (outputs["ORDER_MODEL_VERSION"] == 1).all()
    assert (outputs["ORDER_FALLBACK_LEVEL"] == FallbackLevel.CHOSEN).all()


def test_routes_over_the_versions_the_settings_serve(fused: FusedDispatch) -> None:
    """scoring_versions decides, as for the router: a served version that is neither stable
    nor canary is scored when tagged; an unserved canary is out of routing."""

    def with_routing(**routing: Any) -> FusedDispatch:
        return dataclasses.replace(
            fused,
            settings=FusedSettings(RouterSettings(stable_version=1, **routing)),
            scorers={1: fused.scorers[1]},
            unavailable={},
        )

    both = with_routing(scoring_versions=(1, 2))
    result = run(both, window(9, MODEL_VERSION_TAG=tag("2"))).outputs
    assert (result["ORDER_MODEL_VERSION"] == 2).all()
    assert (result["ORDER_FALLBACK_LEVEL"] == FallbackLevel.CHOSEN).all()
    assert 2 in both.scorers  # loaded on first use
    only_one = with_routing(scoring_versions=(1,))
    result = run(only_one, window(9, MODEL_VERSION_TAG=tag("2"))).outputs
    assert (result["ORDER_MODEL_VERSION"] == 1).all()
    assert (result["ORDER_FALLBACK_LEVEL"] == FallbackLevel.STABLE_RETRY).all()
    assert 2 not in only_one.scorers  # never loaded: not served
    canary_unserved = with_routing(canary_version=2, canary_percent=100, scoring_versions=(1,))
    result = run(canary_unserved, window(9, MODEL_VERSION_TAG=tag("canary"))).outputs
    assert (result["ORDER_MODEL_VERSION"] == 1).all()
    assert (result["ORDER_FALLBACK_LEVEL"] == FallbackLevel.CHOSEN).all()
    result = run(canary_unserved, window(9)).outputs
    assert (result["ORDER_FALLBACK_LEVEL"] == FallbackLevel.CHOSEN).all()


def test_no_version_at_all_still_assigns_with_the_rule_based_dispatcher(
    fused: FusedDispatch,
) -> None:
    nothing = dataclasses.replace(fused, scorers={}, unavailable={}, loader=None)
    tensors = window(7)
    result = run(nothing, tensors).outputs
    assert (result["ORDER_MODEL_VERSION"] == 0).all()
    assert (result["ORDER_FALLBACK_LEVEL"] == FallbackLevel.RULE_BASED).all()
    assigned = result["ASSIGNED_RIDER_INDEX"]
    assert (assigned >= 0).any()
    riders, counts = np.unique(assigned[assigned >= 0], return_counts=True)
    fields = tensors["RIDER_FIELDS"]  # RIDER_FIELD_COLUMNS: load 2, capacity 3
    spare = fields[riders, 3] - fields[riders, 2]
    assert (counts <= spare).all()


def test_a_missing_version_folder_is_unavailable_not_fatal(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    for name in (ENCODER_MODEL, RESOLVER_MODEL):
        shutil.copytree(
            model_layout(MODEL_REPOSITORY, name).folder, model_layout(repository, name).folder
        )
    source = model_layout(MODEL_REPOSITORY, SCORING_MODEL)
    scoring = model_layout(repository, SCORING_MODEL)
    scoring.version(1).mkdir(parents=True)
    shutil.copy(source.config, scoring.folder)
    shutil.copy(source.onnx(1), scoring.version(1))
    dispatch = FusedDispatch.from_repository(repository, SHIPPED)
    assert set(dispatch.scorers) == {1}
    assert scoring.onnx(2).relative_to(repository).as_posix() in dispatch.unavailable[2]


def signed_repository(tmp_path: Path) -> tuple[Path, TrustedKeys]:
    """A copy of the repository's fused steps with dispatch_model 1 and 2 signed."""
    repository = tmp_path / "repository"
    for name in (ENCODER_MODEL, RESOLVER_MODEL, SCORING_MODEL):
        shutil.copytree(
            model_layout(MODEL_REPOSITORY, name).folder,
            model_layout(repository, name).folder,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    key = generate_private_key()
    for version in (1, 2):
        sign_version(model_layout(repository, SCORING_MODEL).version(version), key)
    return repository, TrustedKeys.from_public_keys(key.public_key())


def tamper(folder: Path) -> None:
    with (folder / "model_card.json").open("a") as card:
        card.write(" ")


def test_with_trusted_keys_every_version_is_verified_before_it_loads(tmp_path: Path) -> None:
    repository, trusted = signed_repository(tmp_path)
    dispatch = FusedDispatch.from_repository(repository, SHIPPED, trusted=trusted)
    assert set(dispatch.scorers) == {1, 2} and not dispatch.unavailable


def test_a_refused_canary_is_out_of_routing_not_a_refused_model(tmp_path: Path) -> None:
    repository, trusted = signed_repository(tmp_path)
    tamper(model_layout(repository, SCORING_MODEL).version(2))
    dispatch = FusedDispatch.from_repository(repository, SHIPPED, trusted=trusted)
    assert set(dispatch.scorers) == {1}
    assert "refused by signature verification" in dispatch.unavailable[2]
    assert "digest mismatch on file model_card.json" in dispatch.unavailable[2]
    result = run(dispatch, window(6, MODEL_VERSION_TAG=tag("canary"))).outputs
    assert (result["ORDER_MODEL_VERSION"] == 1).all()
    assert (result["ORDER_FALLBACK_LEVEL"] == FallbackLevel.CHOSEN).all()


def test_a_refused_stable_version_fails_the_load(tmp_path: Path) -> None:
    repository, trusted = signed_repository(tmp_path)
    tamper(model_layout(repository, SCORING_MODEL).version(1))
    with pytest.raises(SigningError, match="stable version 1: refused"):
        FusedDispatch.from_repository(repository, SHIPPED, trusted=trusted)
    other = TrustedKeys.from_public_keys(generate_private_key().public_key())
    with pytest.raises(SigningError, match="unknown key"):
        FusedDispatch.from_repository(repository, SHIPPED, trusted=other)


def test_settings_are_the_routers_plus_the_scoring_model() -> None:
    settings = FusedSettings.from_parameters({"bls_timeout_ms": "50"})
    assert settings.routing == RouterSettings(1, 2, bls_timeout_ms=50)  # the initial routing
    assert settings.scoring_model == "dispatch_model"
    assert settings.served_versions() == (1, 2)
    assert FusedSettings(RouterSettings(2, 3, 10)).served_versions() == (2, 3)
    assert FusedSettings(RouterSettings(stable_version=4)).served_versions() == (4,)
    assert FusedSettings(RouterSettings(scoring_versions=(1, 5))).served_versions() == (1, 5)


@pytest.mark.parametrize(
    "parameters",
    [
        {"canary_percnt": "5"},
        {"canary_version": "3"},  # routing: only a fleet revision routes
        {"city_routes": ""},
        {"scoring_model": "../elsewhere"},
        {"scoring_model": ""},
    ],
)
def test_bad_settings_fail_the_load(parameters: dict[str, str]) -> None:
    with pytest.raises((SettingsError, ValueError)):
        FusedSettings.from_parameters(parameters)


def test_shadow_scoring_compares_versions_without_changing_the_answer(
    fused: FusedDispatch,
) -> None:
    shadowed = dataclasses.replace(
        fused,
        settings=FusedSettings(dataclasses.replace(SHIPPED.routing, shadow_percent=100)),
        draw=lambda: 0.0,
    )
    tensors = window(8)
    result = run(shadowed, tensors)
    assert_same_answer(result.outputs, run(fused, tensors).outputs)
    assert [call.role for call in result.routed.calls] == ["primary", "shadow"]
    (comparison,) = result.routed.shadows
    assert (comparison.primary_version, comparison.shadow_version) == (1, 2)


# ---- the answer does not depend on how the window is listed ----------------


def test_every_listing_of_a_window_gets_the_same_answer(contract_model: Path) -> None:
    """dispatch_fused (`run` and a batch of listings in one `run_batch`): the same riders
    for the same orders, the same figures, versions and location sources, byte for byte."""
    from permutation_helpers import assert_same_answer, by_ids, permuted, regime_windows

    from dispatch_service.pipeline.dispatch_pipeline import repository_steps
    from dispatch_service.pipeline.onnx_runner import OnnxScorer

    encoder, resolver = repository_steps(MODEL_REPOSITORY)
    scorer = OnnxScorer(contract_model)
    dispatch = FusedDispatch(encoder, resolver, SHIPPED, scorers={1: scorer, 2: scorer})
    rng = np.random.default_rng(13)
    for _, _, tensors in regime_windows(seeds=1):
        expected = by_ids(dispatch.run(tensors).outputs, tensors)
        listings = [permuted(tensors, rng) for _ in range(2)]
        for listed, orders in listings:
            assert_same_answer(by_ids(dispatch.run(listed).outputs, listed, orders), expected)
        batch = dispatch.run_batch([listed for listed, _ in listings])
        for (listed, orders), result in zip(listings, batch, strict=True):
            assert isinstance(result, FusedResult)
            assert_same_answer(by_ids(result.outputs, listed, orders), expected)


# ---- per-city routing: the encoder's city picks the route --------------------


def test_a_route_for_an_unregistered_city_fails_the_load() -> None:
    routing = RouterSettings(city_routes=(CityRoute("atlantis", stable_version=1),))
    with pytest.raises(ValueError, match="city_routes atlantis: not a registered city"):
        FusedDispatch.from_repository(MODEL_REPOSITORY, FusedSettings(routing))


def city_window(city: str, seed: int = 7, orders: int = 30, riders: int = 90) -> Tensors:
    from dispatch_service.offline.simulator import city_worlds

    config = city_worlds()[city]
    return window_to_wire(
        generate_window(np.random.default_rng(seed), orders, riders, config=config)
    )


def test_a_beijing_window_gets_its_citys_canary_and_a_shanghai_window_stable(
    fused: FusedDispatch,
) -> None:
    """The route is the city's the encoder found (run and run_batch alike), and the result
    names the city for the metrics."""
    routing = RouterSettings(
        stable_version=1,
        canary_version=2,
        canary_percent=0,
        city_routes=(CityRoute("beijing", canary_percent=100),),
    )
    per_city = dataclasses.replace(fused, settings=FusedSettings(routing))
    beijing, shanghai = city_window("beijing"), city_window("shanghai")
    alone = [run(per_city, beijing), run(per_city, shanghai)]
    together = per_city.run_batch([beijing, shanghai])
    for got in (alone, together):
        assert [result.city for result in got] == ["beijing", "shanghai"]  # type: ignore[union-attr]
        versions = [result.outputs["ORDER_MODEL_VERSION"] for result in got]  # type: ignore[union-attr]
        assert (versions[0] == 2).all() and (versions[1] == 1).all()
    for one, batched in zip(alone, together, strict=True):
        assert isinstance(batched, FusedResult)
        for name, value in one.outputs.items():
            np.testing.assert_array_equal(batched.outputs[name], value, err_msg=name)
