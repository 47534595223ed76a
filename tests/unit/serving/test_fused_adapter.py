"""dispatch_service.serving.fused_adapter over a stand-in for Triton's `pb_utils`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import batched
from dispatch_contract.keys import PRIORITY_KEY_DIGEST_ENV, PRIORITY_KEY_HEADER
from dispatch_service.core.metrics import (
    CANDIDATES_PER_ORDER,
    ENCODER_LATENCY,
    RESOLVER_LATENCY,
    VALIDATION_REJECTIONS,
)
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import (
    FUSED_MODEL,
    PRIORITY_MODEL,
    SCORING_MODEL,
    model_layout,
)
from dispatch_service.core.settings import SettingsError
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from dispatch_service.routing.live import ROUTING_FILE_ENV, write_routing_file
from dispatch_service.routing.metrics import ROUTED_ORDERS
from dispatch_service.routing.settings import RouterSettings
from dispatch_service.serving.fused_adapter import (
    FUSED_METRICS,
    FusedDispatchAdapter,
    fused_adapter_for,
)
from pb_stand_in import FakePbUtils, FakeRequest, FakeResponse


def args(**parameters: str) -> dict[str, str]:
    config = {"parameters": {k: {"string_value": v} for k, v in parameters.items()}}
    return {
        "model_config": json.dumps(config),
        "model_name": "dispatch_fused",
        "model_version": "1",
        "model_instance_name": "dispatch_fused_0",
        "model_repository": str(model_layout(MODEL_REPOSITORY, FUSED_MODEL).folder),
    }


def window(seed: int, orders: int = 10) -> dict[str, NDArray[Any]]:
    return window_to_wire(generate_window(np.random.default_rng(seed), orders, 50))


def execute(adapter: FusedDispatchAdapter, *requests: FakeRequest) -> list[FakeResponse]:
    responses = adapter.execute(list(requests))
    assert len(responses) == len(requests)
    return responses


@pytest.fixture
def pb() -> FakePbUtils:
    return FakePbUtils()


def test_each_request_gets_its_answer(pb: FakePbUtils) -> None:
    adapter = fused_adapter_for(pb, args())  # the initial routing: version 1 for all
    requests = [FakeRequest(batched(window(seed)), request_id=f"r{seed}") for seed in (1, 2)]
    for seed, response in zip((1, 2), execute(adapter, *requests), strict=True):
        got = {name: value[0] for name, value in response.outputs().items()}  # batch of 1
        expected = DispatchPipeline.from_repository().run(window(seed))
        for name, value in expected.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
        assert (got["ORDER_MODEL_VERSION"] == 1).all()


def test_a_bad_request_gets_its_own_error_and_its_neighbours_their_answers(
    pb: FakePbUtils,
) -> None:
    adapter = fused_adapter_for(pb, args())
    bad = window(3)
    bad["ORDER_FIELDS"] = bad["ORDER_FIELDS"].astype(np.float32)
    requests = [
        FakeRequest(batched(window(1))),
        FakeRequest(batched(bad), request_id="bad"),
        FakeRequest(batched(window(2))),
    ]
    first, error, last = execute(adapter, *requests)
    assert error.has_error()
    assert error.error().code() == "INVALID_ARG"
    assert "ORDER_FIELDS: must be FP64" in error.error().message()
    assert not first.has_error() and not last.has_error()
    rejected = [json.loads(line) for level, line in pb.Logger.lines if level == "warn"]
    assert [(r["event"], r["request_id"], r["tensor"]) for r in rejected] == [
        ("request_rejected", "bad", "ORDER_FIELDS")
    ]


def test_a_request_of_two_windows_is_refused_naming_the_shape(pb: FakePbUtils) -> None:
    adapter = fused_adapter_for(pb, args())
    two = {name: np.stack([value, value]) for name, value in window(1).items()}
    (error, good) = execute(adapter, FakeRequest(two), FakeRequest(batched(window(2))))
    assert error.error().code() == "INVALID_ARG"
    assert "ORDER_IDS: must have a batch dimension of 1" in error.error().message()
    assert "[1, *]" in error.error().message()
    assert not good.has_error()


def test_records_the_encoder_router_and_resolver_metrics_per_answer(pb: FakePbUtils) -> None:
    adapter = fused_adapter_for(pb, args())
    assert set(pb.MetricFamily.created) == {spec.name for spec in FUSED_METRICS}
    bad = window(3)
    del bad["RIDER_IDS"]
    execute(adapter, FakeRequest(batched(window(1, orders=7))), FakeRequest(batched(bad)))
    adapter.finalize()  # stops the recording thread after it recorded what was queued
    families = pb.MetricFamily
    for spec in (ENCODER_LATENCY, RESOLVER_LATENCY, CANDIDATES_PER_ORDER):
        assert len(families.series(spec.name).observations) == 1, spec.name
    routed = families.series(ROUTED_ORDERS.name, model_version="1", level="0")
    assert routed.value == 7
    rejected = families.series(VALIDATION_REJECTIONS.name, tensor="RIDER_IDS")
    assert rejected.value == 1
    assert routed.labels["model"] == "dispatch_fused"
    assert routed.labels["city"] == "shanghai"  # the city the encoder found serving the window


def test_logs_its_settings_and_each_version_it_could_not_load(
    pb: FakePbUtils, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "routing.json"
    monkeypatch.setenv(ROUTING_FILE_ENV, str(path))
    write_routing_file(path, RouterSettings(1, 9), revision=1)  # a canary with no folder
    fused_adapter_for(pb, args())
    lines = [(level, json.loads(line)) for level, line in pb.Logger.lines]
    events = {record["event"]: (level, record) for level, record in lines}
    assert events["model_loaded"][1]["model"] == "dispatch_fused"
    level, missing = events["version_unavailable"]
    assert level == "warn" and missing["target_version"] == 9
    missing_file = model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(9)
    assert missing_file.relative_to(MODEL_REPOSITORY).as_posix() in missing["error"]


def test_bad_settings_fail_the_load(pb: FakePbUtils) -> None:
    with pytest.raises(SettingsError, match="bls_timeout_ms"):
        fused_adapter_for(pb, args(bls_timeout_ms="lots"))
    # Routing is a fleet revision's, never a model config's (a config from before is refused).
    with pytest.raises(SettingsError, match="canary_percent are routing"):
        fused_adapter_for(pb, args(canary_percent="10"))


def test_the_fused_model_seals_its_stubs_region_before_anything_else(
    pb: FakePbUtils, monkeypatch: pytest.MonkeyPatch
) -> None:
    class SealedError(Exception):
        pass

    def seal() -> None:
        raise SealedError

    monkeypatch.setattr("dispatch_service.serving.backend_log.seal_own_region", seal)
    with pytest.raises(SealedError):
        fused_adapter_for(pb, args())


def test_the_launchers_routing_file_is_followed_from_load_and_each_execute(
    pb: FakePbUtils, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet replica (`routing.live`): a stub started after a change routes by the file
    from its first window; a later change applies from the next execute, no reload."""
    path = tmp_path / "routing.json"
    monkeypatch.setenv(ROUTING_FILE_ENV, str(path))
    write_routing_file(path, RouterSettings(1, 2, 100, scoring_versions=(1, 2)), revision=3)
    adapter = fused_adapter_for(pb, args())  # the initial routing: canary 2 at 0 %
    (response,) = execute(adapter, FakeRequest(batched(window(1))))
    assert (response.outputs()["ORDER_MODEL_VERSION"] == 2).all()
    write_routing_file(path, RouterSettings(1, scoring_versions=(1, 2)), revision=4)
    (response,) = execute(adapter, FakeRequest(batched(window(1))))
    assert (response.outputs()["ORDER_MODEL_VERSION"] == 1).all()
    applied = [json.loads(line) for _, line in pb.Logger.lines if "live_routing_applied" in line]
    assert [record["revision"] for record in applied] == [3, 4]


def test_the_stub_lowers_its_priority_as_configured_and_limits_blas(
    pb: FakePbUtils, stub_priorities: list[int], stub_blas_limits: list[str]
) -> None:
    fused_adapter_for(pb, args())
    fused_adapter_for(pb, args(stub_nice="3"))
    assert stub_priorities == [10, 3]
    assert stub_blas_limits == ["blas", "blas"]
    with pytest.raises(SettingsError, match="stub_nice"):
        fused_adapter_for(pb, args(stub_nice="-5"))


# ---- the priority lane: level 1 is an entitlement -----------------------------------------

KEY = "the-priority-key"


def lane_args() -> dict[str, str]:
    lane = model_layout(MODEL_REPOSITORY, PRIORITY_MODEL)
    return args() | {
        "model_name": PRIORITY_MODEL,
        "model_instance_name": f"{PRIORITY_MODEL}_0",
        "model_repository": str(lane.folder),
    }


def test_the_lane_refuses_a_window_without_the_priority_key_unworked(
    pb: FakePbUtils, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PRIORITY_KEY_DIGEST_ENV, hashlib.sha256(KEY.encode()).hexdigest())
    adapter = fused_adapter_for(pb, lane_args())
    sent = batched(window(1))
    keyed = {PRIORITY_KEY_HEADER: KEY}
    requests = [
        FakeRequest(sent, request_id="none"),
        FakeRequest(sent, request_id="keyed", parameters=keyed),
        FakeRequest(sent, request_id="wrong", parameters={PRIORITY_KEY_HEADER: "guess"}),
        FakeRequest(sent, request_id="not-text", parameters={PRIORITY_KEY_HEADER: 7}),
        FakeRequest(sent, request_id="keyed-2", parameters=keyed),
    ]
    responses = execute(adapter, *requests)
    expected = DispatchPipeline.from_repository().run(window(1))
    for index in (1, 4):
        got = responses[index].outputs()["ASSIGNED_RIDER_INDEX"][0]
        np.testing.assert_array_equal(got, expected["ASSIGNED_RIDER_INDEX"])
    for index in (0, 2, 3):
        error = responses[index].error()
        assert error.code() == "INVALID_ARG"
        assert error.message().startswith("dispatch_priority: the priority lane takes only")
        assert "'dispatch-priority-key'" in error.message()


def test_without_the_launchers_digest_the_lane_is_closed(
    pb: FakePbUtils, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PRIORITY_KEY_DIGEST_ENV, raising=False)
    adapter = fused_adapter_for(pb, lane_args())
    keyed = FakeRequest(batched(window(1)), parameters={PRIORITY_KEY_HEADER: KEY})
    (response,) = execute(adapter, keyed)
    assert response.error().code() == "INVALID_ARG"


def test_dispatch_fused_asks_no_key(pb: FakePbUtils, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PRIORITY_KEY_DIGEST_ENV, hashlib.sha256(KEY.encode()).hexdigest())
    adapter = fused_adapter_for(pb, args())
    (response,) = execute(adapter, FakeRequest(batched(window(1))))
    assert not response.has_error()


def test_the_lane_serves_tritons_warm_up_before_any_client_without_the_key(
    pb: FakePbUtils, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Triton warms a new instance up (samples without a key) before it gives the instance
    any client's window: those executions, one per sample and count, are served."""
    monkeypatch.setenv(PRIORITY_KEY_DIGEST_ENV, hashlib.sha256(KEY.encode()).hexdigest())
    config = json.loads(lane_args()["model_config"])
    config["model_warmup"] = [{"name": "a", "count": 2}, {"name": "b"}]
    adapter = fused_adapter_for(pb, lane_args() | {"model_config": json.dumps(config)})
    sent = batched(window(1))
    for _ in range(3):  # a count of 2, and a sample without one: once
        (response,) = execute(adapter, FakeRequest(sent))
        assert not response.has_error()
    (response,) = execute(adapter, FakeRequest(sent))
    assert response.error().code() == "INVALID_ARG"
