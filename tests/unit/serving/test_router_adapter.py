"""dispatch_service.serving.router_adapter over a stand-in for Triton's `pb_utils` and its BLS."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_service.core.metrics import VALIDATION_REJECTIONS, InMemoryMetrics
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import ROUTER_MODEL, model_layout
from dispatch_service.core.settings import SettingsError
from dispatch_service.domain.cities import default_registry
from dispatch_service.domain.features import encode_window
from dispatch_service.offline.simulator import generate_window
from dispatch_service.routing.fallback import rule_based_objectives
from dispatch_service.routing.live import write_routing_file
from dispatch_service.routing.metrics import MODEL_ERRORS, ROUTED_ORDERS
from dispatch_service.routing.settings import INITIAL_ROUTING, CityRoute, RouterSettings
from dispatch_service.serving.router_adapter import (
    DispatchRouterAdapter,
    registered_cities,
    router_adapter_for,
)
from pb_stand_in import FakeRequest, FakeTensor, FakeTritonError

SHANGHAI = default_registry().get("shanghai")


class Response:
    def __init__(
        self, output_tensors: list[FakeTensor] | None = None, error: FakeTritonError | None = None
    ) -> None:
        self.tensors = {t.name(): t for t in output_tensors or []}
        self._error = error

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> FakeTritonError:
        assert self._error is not None
        return self._error


class Logger:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def _add(self, level: str, message: str) -> None:
        self.lines.append((level, json.loads(message)))

    def log_info(self, message: str) -> None:
        self._add("info", message)

    def log_warn(self, message: str) -> None:
        self._add("warn", message)

    def log_error(self, message: str) -> None:
        self._add("error", message)


class FakePb:
    """pb_utils with a BLS whose `dispatch_model` answers through `model`."""

    Tensor = FakeTensor
    TritonError = FakeTritonError
    InferenceResponse = Response

    def __init__(self, model: Served) -> None:
        self.Logger = Logger()
        self.model = model
        self.bls: list[tuple[str, int]] = []
        pb = self

        class InferenceRequest:
            def __init__(
                self,
                model_name: str,
                inputs: list[FakeTensor],
                requested_output_names: list[str],
                model_version: int = -1,
            ) -> None:
                self.model_name = model_name
                self.version = model_version
                self.inputs = {t.name(): t.as_numpy() for t in inputs}
                self.outputs = requested_output_names

            async def async_exec(self) -> Response:
                pb.bls.append((self.model_name, self.version))
                return pb.model(self.version, self.inputs["PAIR_FEATURES"])

        self.InferenceRequest = InferenceRequest

    @staticmethod
    def get_output_tensor_by_name(response: Response, name: str) -> FakeTensor | None:
        return response.tensors.get(name)


class Served:
    """dispatch_model with these versions loaded; others answer an error response."""

    def __init__(self, versions: tuple[int, ...]) -> None:
        self.versions = versions

    def __call__(self, version: int, features: NDArray[np.float32]) -> Response:
        if version not in self.versions:
            return Response(error=FakeTritonError(f"Request for unknown model version {version}"))
        scores = rule_based_objectives(features) * np.float32(1.0 + version / 10.0)
        return Response([FakeTensor("PAIR_OBJECTIVES", scores)])


def served(*versions: int) -> Served:
    return Served(versions)


def window_inputs(seed: int = 5, orders: int = 12, **extra: NDArray[Any]) -> dict[str, Any]:
    window = generate_window(np.random.default_rng(seed), orders, 60)
    encoded = encode_window(window, SHANGHAI)
    return {
        "PAIR_FEATURES": encoded.pair_features,
        "CANDIDATE_RIDER_INDEX": encoded.candidate_rider_index,
        "ORDER_TEXT": np.array([[f"u{i}".encode()] for i in range(orders)], dtype=object),
        **extra,
    }


def run(adapter: DispatchRouterAdapter, *requests: FakeRequest) -> list[Response]:
    """Each request as Triton hands it over: one window behind a batch dimension of 1."""
    for request in requests:
        request.tensors = {
            name: None if value is None else np.asarray(value)[np.newaxis]
            for name, value in request.tensors.items()
        }
    return asyncio.run(adapter.execute(list(requests)))


def outputs(response: Response) -> dict[str, NDArray[Any]]:
    """The answer of one window (its batch dimension of 1 removed)."""
    assert not response.has_error(), response.error().message()
    tensors = {name: t.as_numpy() for name, t in response.tensors.items()}
    assert all(value.shape[0] == 1 for value in tensors.values())
    return {name: value[0] for name, value in tensors.items()}


def test_answers_objectives_versions_and_levels_through_bls() -> None:
    pb = FakePb(served(1, 2))
    metrics = InMemoryMetrics()
    settings = RouterSettings(canary_version=2, canary_percent=50)
    adapter = DispatchRouterAdapter(pb, "dispatch_router", settings, metrics=metrics)
    inputs = window_inputs()
    (response,) = run(adapter, FakeRequest(inputs))
    out = outputs(response)
    assert set(out) == {"PAIR_OBJECTIVES", "ORDER_MODEL_VERSION", "ORDER_FALLBACK_LEVEL"}
    assert out["PAIR_OBJECTIVES"].shape == (inputs["PAIR_FEATURES"].shape[0], 3)
    assert out["ORDER_MODEL_VERSION"].dtype == np.int32
    assert set(out["ORDER_MODEL_VERSION"].tolist()) == {1, 2}
    assert out["ORDER_FALLBACK_LEVEL"].tolist() == [0] * 12
    assert sorted(pb.bls) == [("dispatch_model", 1), ("dispatch_model", 2)]
    counts = (metrics.counter(ROUTED_ORDERS, model_version=v, level="0", city="none") for v in "12")
    assert sum(counts) == 12  # a window without WINDOW_CITY: the global routing


def test_each_window_is_routed_with_its_citys_settings_and_labelled_with_it() -> None:
    """WINDOW_CITY (the encoder's city): a Beijing window goes to Beijing's canary in the same
    execute where a Shanghai window stays on stable; a city the registry does not hold is a
    400 naming the tensor, and the other windows are answered."""
    pb = FakePb(served(1, 2))
    metrics = InMemoryMetrics()
    settings = RouterSettings(
        canary_version=2, city_routes=(CityRoute("beijing", canary_percent=100),)
    )
    adapter = DispatchRouterAdapter(pb, "dispatch_router", settings, metrics=metrics)

    def city(name: bytes) -> NDArray[Any]:
        return np.array([name], dtype=object)

    beijing, shanghai, nowhere, empty = run(
        adapter,
        FakeRequest(window_inputs(WINDOW_CITY=city(b"beijing"))),
        FakeRequest(window_inputs(WINDOW_CITY=city(b"shanghai"))),
        FakeRequest(window_inputs(WINDOW_CITY=city(b"atlantis"))),
        FakeRequest(window_inputs(WINDOW_CITY=city(b""))),
    )
    assert outputs(beijing)["ORDER_MODEL_VERSION"].tolist() == [2] * 12
    assert outputs(shanghai)["ORDER_MODEL_VERSION"].tolist() == [1] * 12
    assert outputs(empty)["ORDER_MODEL_VERSION"].tolist() == [1] * 12  # no city: global
    error = nowhere.error()
    assert error.code() == FakeTritonError.INVALID_ARG
    assert error.message().startswith("WINDOW_CITY: names no registered city")
    assert metrics.counter(ROUTED_ORDERS, model_version="2", level="0", city="beijing") == 12
    assert metrics.counter(ROUTED_ORDERS, model_version="1", level="0", city="shanghai") == 12
    assert metrics.counter(ROUTED_ORDERS, model_version="1", level="0", city="none") == 12


def test_the_router_knows_the_cities_the_repositorys_encoder_serves(tmp_path: Any) -> None:
    assert registered_cities(MODEL_REPOSITORY) == default_registry().ids
    assert registered_cities(tmp_path) == default_registry().ids  # no encoder config: shipped
    args = {**_args(), "model_repository": str(model_layout(MODEL_REPOSITORY, ROUTER_MODEL).folder)}
    adapter = router_adapter_for(NoMetricsPb(served(1)), args)
    assert adapter.cities == frozenset(default_registry().ids)
    adapter.finalize()


def test_an_error_response_of_the_canary_is_answered_by_the_stable_version() -> None:
    pb = FakePb(served(1))  # the settings do not say what is served: 2 is called, and fails
    settings = RouterSettings(canary_version=2, canary_percent=100)
    adapter = DispatchRouterAdapter(pb, "dispatch_router", settings)
    out = outputs(run(adapter, FakeRequest(window_inputs(), "req-9"))[0])
    assert out["ORDER_MODEL_VERSION"].tolist() == [1] * 12
    assert out["ORDER_FALLBACK_LEVEL"].tolist() == [1] * 12
    (warning,) = [fields for level, fields in pb.Logger.lines if level == "warn"]
    assert warning["event"] == "model_call_failed"
    assert warning["target_version"] == 2 and warning["request_id"] == "req-9"
    assert "unknown model version" in warning["error"]


def test_no_model_at_all_still_answers_with_the_rule_based_dispatcher() -> None:
    pb = FakePb(served())
    adapter = DispatchRouterAdapter(pb, "dispatch_router", RouterSettings(canary_version=2))
    inputs = window_inputs()
    out = outputs(run(adapter, FakeRequest(inputs))[0])
    assert out["ORDER_FALLBACK_LEVEL"].tolist() == [2] * 12
    assert out["ORDER_MODEL_VERSION"].tolist() == [0] * 12
    np.testing.assert_array_equal(
        out["PAIR_OBJECTIVES"], rule_based_objectives(inputs["PAIR_FEATURES"])
    )


def test_a_canary_the_settings_do_not_serve_is_out_of_routing() -> None:
    """Its users get the stable version at level 0 and nobody calls it; as a tag number it
    is not called either and the stable version answers at level 1 (as in dispatch_fused)."""
    pb = FakePb(served(1))
    metrics = InMemoryMetrics()
    settings = RouterSettings(canary_version=2, canary_percent=100, scoring_versions=(1,))
    adapter = DispatchRouterAdapter(pb, "dispatch_router", settings, metrics=metrics)
    routed, tagged = run(
        adapter,
        FakeRequest(window_inputs()),
        FakeRequest(window_inputs(MODEL_VERSION_TAG=np.array([b"2"], dtype=object))),
    )
    assert outputs(routed)["ORDER_MODEL_VERSION"].tolist() == [1] * 12
    assert outputs(routed)["ORDER_FALLBACK_LEVEL"].tolist() == [0] * 12
    assert outputs(tagged)["ORDER_MODEL_VERSION"].tolist() == [1] * 12
    assert outputs(tagged)["ORDER_FALLBACK_LEVEL"].tolist() == [1] * 12
    assert ("dispatch_model", 2) not in pb.bls
    errors = metrics.counter(MODEL_ERRORS, model_version="2", role="primary", reason="not_served")
    assert errors == 1


def test_the_tag_forces_a_version_and_a_bad_tag_is_invalid_arg() -> None:
    pb = FakePb(served(1, 2))
    metrics = InMemoryMetrics()
    adapter = DispatchRouterAdapter(
        pb, "dispatch_router", RouterSettings(canary_version=2), metrics=metrics
    )
    tag = np.array([b"canary"], dtype=object)
    bad = np.array([b"newest"], dtype=object)
    good, rejected = run(
        adapter,
        FakeRequest(window_inputs(MODEL_VERSION_TAG=tag)),
        FakeRequest(window_inputs(MODEL_VERSION_TAG=bad), "req-bad"),
    )
    assert outputs(good)["ORDER_MODEL_VERSION"].tolist() == [2] * 12
    assert rejected.error().code() == FakeTritonError.INVALID_ARG
    assert rejected.error().message().startswith("MODEL_VERSION_TAG: ")
    (logged,) = [fields for level, fields in pb.Logger.lines if level == "warn"]
    assert logged["event"] == "request_rejected" and logged["request_id"] == "req-bad"
    assert "newest" not in json.dumps(logged)
    assert (
        metrics.counter(VALIDATION_REJECTIONS, tensor="MODEL_VERSION_TAG", rule="unknown_value")
        == 1
    )


def test_a_missing_tensor_is_invalid_arg() -> None:
    inputs = window_inputs()
    del inputs["ORDER_TEXT"]
    adapter = DispatchRouterAdapter(FakePb(served(1)), "dispatch_router", RouterSettings())
    (response,) = run(adapter, FakeRequest(inputs))
    assert response.error().code() == FakeTritonError.INVALID_ARG
    assert response.error().message() == "ORDER_TEXT: is required but missing"


def test_shadow_draws_extra_calls_but_the_same_answer() -> None:
    settings = RouterSettings(canary_version=2, shadow_percent=100)
    plain = DispatchRouterAdapter(FakePb(served(1, 2)), "r", RouterSettings(canary_version=2))
    pb = FakePb(served(1, 2))
    shadowed = DispatchRouterAdapter(pb, "r", settings, draw=lambda: 0.5)
    inputs = window_inputs()
    a = outputs(run(plain, FakeRequest(inputs))[0])
    b = outputs(run(shadowed, FakeRequest(inputs))[0])
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert sorted(pb.bls) == [("dispatch_model", 1), ("dispatch_model", 2)]


def _args(**parameters: str) -> dict[str, str]:
    config = {"parameters": {k: {"string_value": v} for k, v in parameters.items()}}
    return {
        "model_config": json.dumps(config),
        "model_name": "dispatch_router",
        "model_version": "1",
        "model_instance_name": "dispatch_router_0_0",
    }


class NoMetricsPb(FakePb):
    class MetricFamily:
        COUNTER = GAUGE = HISTOGRAM = 0

        def __init__(self, **kwargs: Any) -> None:
            raise RuntimeError("metrics are disabled")


def test_initialize_parses_the_settings_once_and_logs_them() -> None:
    pb = NoMetricsPb(served(1, 2))
    adapter = router_adapter_for(pb, _args(bls_timeout_ms="1500"))
    assert adapter.settings == replace(INITIAL_ROUTING, bls_timeout_ms=1500)
    loaded = [fields for level, fields in pb.Logger.lines if level == "info"]
    assert loaded == [
        {
            "event": "model_loaded",
            "model": "dispatch_router",
            "version": "1",
            "instance": "dispatch_router_0_0",
        },
        {
            "event": "router_settings_loaded",
            "model": "dispatch_router",
            "version": "1",
            "instance": "dispatch_router_0_0",
            "stable_version": 1,
            "canary_version": 2,
            "canary_percent": 0,
            "shadow_percent": 0,
            "bls_timeout_ms": 1500,
            "scoring_versions": [],
            "cpu_scoring": 0,
            "city_routes": [],  # the routing's JSON form, as in a revision
        },
    ]
    adapter.finalize()


@pytest.mark.parametrize(
    "parameters",
    [{"canary_percent": "25"}, {"city_routes": ""}, {"bls_timeout_ms": "0"}, {"typo": "1"}],
)
def test_bad_settings_fail_initialize(parameters: dict[str, str]) -> None:
    """A bad value, an unknown key, or routing (only a fleet revision routes) fails the load
    naming the key; the old router keeps serving."""
    with pytest.raises((SettingsError, ValueError), match=next(iter(parameters))):
        router_adapter_for(NoMetricsPb(served(1)), _args(**parameters))


class RecordingPb(FakePb):
    """pb_utils whose MetricFamily records the labels each series is created with."""

    created: ClassVar[list[dict[str, str]]] = []

    class MetricFamily:
        COUNTER, GAUGE, HISTOGRAM = "COUNTER", "GAUGE", "HISTOGRAM"

        def __init__(self, name: str, description: str, kind: str) -> None:
            self.name = name

        def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> Any:  # noqa: N802
            RecordingPb.created.append({"__name__": self.name, **labels})

            class Series:
                def increment(self, value: float) -> None: ...

                def observe(self, value: float) -> None: ...

                def set(self, value: float) -> None: ...

            return Series()


def test_every_router_series_carries_the_process_id() -> None:
    RecordingPb.created.clear()
    pb = RecordingPb(served(1, 2))
    adapter = router_adapter_for(pb, _args())
    run(adapter, FakeRequest(window_inputs()))
    adapter.finalize()  # records what the metrics thread still holds
    assert RecordingPb.created, "no series recorded"
    for labels in RecordingPb.created:
        assert labels["model"] == "dispatch_router" and labels["version"] == "1"
        assert labels["pid"] == str(os.getpid()), labels["__name__"]
    names = {labels["__name__"] for labels in RecordingPb.created}
    assert {"dispatch_router_model_calls_total", "dispatch_router_orders_total"} <= names


def test_the_windows_of_one_execute_share_one_bls_call_per_version() -> None:
    settings = RouterSettings(canary_version=2, canary_percent=50)
    windows = [window_inputs(seed, orders) for seed, orders in ((1, 3), (2, 12), (3, 1), (4, 7))]
    bad = window_inputs(9, 4)
    bad["PAIR_FEATURES"] = bad["PAIR_FEATURES"][:-1]  # one row short: this request alone fails
    alone = []
    for inputs in windows:  # each window in an execute of its own
        single = FakePb(served(1, 2))
        (response,) = run(
            DispatchRouterAdapter(single, "dispatch_router", settings), FakeRequest(inputs)
        )
        alone.append(outputs(response))
    pb = FakePb(served(1, 2))
    adapter = DispatchRouterAdapter(pb, "dispatch_router", settings)
    requests = [FakeRequest(dict(inputs)) for inputs in windows[:2]]
    requests += [FakeRequest(bad), *(FakeRequest(dict(inputs)) for inputs in windows[2:])]
    responses = run(adapter, *requests)
    assert sorted(pb.bls) == [("dispatch_model", 1), ("dispatch_model", 2)]  # one call each
    assert responses[2].has_error() and "PAIR_FEATURES" in responses[2].error().message()
    got = [outputs(r) for n, r in enumerate(responses) if n != 2]
    for answer, expected in zip(got, alone, strict=True):
        for name, value in expected.items():
            assert answer[name].dtype == value.dtype and answer[name].tobytes() == value.tobytes()


def test_the_router_seals_its_stubs_region_before_anything_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class SealedError(Exception):
        pass

    def seal() -> None:
        raise SealedError

    monkeypatch.setattr("dispatch_service.serving.backend_log.seal_own_region", seal)
    with pytest.raises(SealedError):
        router_adapter_for(FakePb(served(1)), _args())


def test_the_launchers_routing_file_is_followed_from_the_next_execute(tmp_path: Any) -> None:
    """A fleet replica's routing change (`routing.live`): no reload, the next execute routes
    by the file; a file naming a city the registry does not hold is refused and logged."""
    pb = FakePb(served(1, 2))
    path = tmp_path / "routing.json"
    adapter = DispatchRouterAdapter(pb, "dispatch_router", RouterSettings(), routing_file=str(path))
    assert set(outputs(run(adapter, FakeRequest(window_inputs()))[0])["ORDER_MODEL_VERSION"]) == {1}
    write_routing_file(path, RouterSettings(1, 2, 100, scoring_versions=(1, 2)), revision=4)
    versions = outputs(run(adapter, FakeRequest(window_inputs()))[0])["ORDER_MODEL_VERSION"]
    assert versions.tolist() == [2] * 12
    write_routing_file(
        path, RouterSettings(1, city_routes=(CityRoute("atlantis", stable_version=2),)), 5
    )
    versions = outputs(run(adapter, FakeRequest(window_inputs()))[0])["ORDER_MODEL_VERSION"]
    assert versions.tolist() == [2] * 12  # the last good routing
    events = [(level, fields["event"]) for level, fields in pb.Logger.lines]
    assert ("info", "live_routing_applied") in events
    refused = [fields for _, fields in pb.Logger.lines if fields["event"] == "live_routing_refused"]
    assert len(refused) == 1 and "atlantis" in refused[0]["error"]
