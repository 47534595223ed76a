"""Behaviour of dispatch_service.serving.triton_adapter over a stand-in for Triton's `pb_utils`."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import (
    ENCODER_OUTPUTS,
    NUM_PAIR_FEATURES,
    OBJECTIVES,
    batched,
    pack_window,
)
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.metrics import (
    STEP_OBSERVERS,
    NullMetrics,
    candidates_per_order,
    capacity_conflicts,
)
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.settings import SettingsError
from dispatch_service.domain.window import window_to_tensors, window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline.steps import DispatchModelStep, FeatureEncoderStep, TopKResolverStep
from dispatch_service.routing.engine import ModelCallError
from dispatch_service.serving.triton_adapter import (
    TritonBatchedModelAdapter,
    TritonEncoderAdapter,
    TritonStepAdapter,
    adapter_for,
)
from pb_stand_in import (
    FakeMetricFamilies,
    FakeMetricFamily,
    FakePbUtils,
    FakeRequest,
    FakeResponse,
    FakeTensor,
    FakeTritonError,
)

COMMITTED_MODEL = MODEL_REPOSITORY / "dispatch_model" / "1" / "model.onnx"
LOG_FIELDS = {"event", "model", "request_id", "tensor", "rule", "code"}


# ---- steps for the generic adapter ---------------------------------------------------


class EchoStep:
    """Doubles X; raises on a marker value so tests can pick which request fails."""

    input_names: ClassVar[tuple[str, ...]] = ("X",)

    def __init__(self) -> None:
        self.calls = 0

    def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> dict[str, NDArray[Any]]:
        self.calls += 1
        x = inputs["X"]
        if x is None:
            raise DispatchInputError("X", "is required but missing", "missing")
        if (x < 0).any():
            raise DispatchInputError("X", f"must be >= 0 (row {int(np.argmax(x < 0))})", "range")
        if (x == 13).any():
            raise RuntimeError("unlucky number")
        return {"Y": x * 2, "N": np.array([x.size], dtype=np.int64)}


def echo_request(value: int, request_id: str = "") -> FakeRequest:
    # one "window" per request: the batch dimension of 1 every window-level model gets
    return FakeRequest({"X": np.array([[value, value + 1]])}, request_id)


def json_lines(pb: FakePbUtils, level: str) -> list[dict[str, Any]]:
    return [json.loads(line) for lvl, line in pb.Logger.lines if lvl == level]


def logical_window(seed: int) -> dict[str, NDArray[Any]]:
    return dict(window_to_tensors(generate_window(np.random.default_rng(seed), 4, 10)))


def window_request(
    seed: int,
    request_id: str = "",
    wire: dict[str, NDArray[Any]] | None = None,
    **changes: NDArray[Any],
) -> FakeRequest:
    """A v2 request (batch of 1) of a simulated window, with fields changed before packing
    (by WINDOW_INPUTS name) and wire tensors replaced after."""
    tensors = logical_window(seed)
    tensors.update(changes)
    packed = {**pack_window(tensors), **(wire or {})}
    return FakeRequest(batched(packed), request_id)


# ---- TritonStepAdapter ---------------------------------------------------------------


def test_one_response_per_request_in_order() -> None:
    pb = FakePbUtils()
    adapter = TritonStepAdapter(pb, "echo", EchoStep())
    responses = adapter.execute([echo_request(v) for v in (1, 5, 9)])
    assert [r.outputs()["Y"][0].tolist() for r in responses] == [[2, 4], [10, 12], [18, 20]]
    assert all(r.outputs()["N"][0].tolist() == [2] for r in responses)
    assert pb.Logger.lines == []


def test_no_requests_no_responses() -> None:
    assert TritonStepAdapter(FakePbUtils(), "echo", EchoStep()).execute([]) == []


def test_bad_input_fails_only_its_own_request() -> None:
    pb = FakePbUtils()
    responses = TritonStepAdapter(pb, "echo", EchoStep()).execute(
        [echo_request(1), echo_request(-3, "bad"), echo_request(2)]
    )
    assert responses[0].outputs()["Y"][0].tolist() == [2, 4]
    assert responses[2].outputs()["Y"][0].tolist() == [4, 6]
    error = responses[1].error()
    assert error.code() == FakeTritonError.INVALID_ARG
    assert error.message() == "X: must be >= 0 (row 0)"


def test_a_bad_window_is_answered_with_invalid_arg_naming_the_tensor() -> None:
    pb = FakePbUtils()
    adapter = TritonStepAdapter(pb, "feature_encoder", FeatureEncoderStep())
    good = window_request(1, "a")
    pickup = np.array(logical_window(1)["ORDER_PICKUP"], copy=True)
    pickup[2, 0] = 95.0
    responses = adapter.execute(
        [good, window_request(1, "b", ORDER_PICKUP=pickup), window_request(2, "c")]
    )
    assert len(responses) == 3
    for ok in (responses[0], responses[2]):
        outputs = ok.outputs()
        assert set(outputs) == {spec.name for spec in ENCODER_OUTPUTS}
        assert outputs["PAIR_FEATURES"].shape[-1] == NUM_PAIR_FEATURES
    error = responses[1].error()
    assert error.code() == FakeTritonError.INVALID_ARG
    assert error.message().startswith(
        "ORDER_FIELDS[pickup_lat, pickup_lon]: latitude must be within"
    )
    assert "(row 2)" in error.message()


def test_a_missing_tensor_is_answered_with_invalid_arg() -> None:
    pb = FakePbUtils()
    request = window_request(1)
    del request.tensors["RIDER_FIELDS"]
    (response,) = TritonStepAdapter(pb, "feature_encoder", FeatureEncoderStep()).execute([request])
    assert response.error().code() == FakeTritonError.INVALID_ARG
    assert response.error().message() == "RIDER_FIELDS: is required but missing"


def test_the_optional_input_is_passed_as_none_when_absent() -> None:
    seen: list[Mapping[str, NDArray[Any] | None]] = []

    class Recorder:
        input_names: ClassVar[tuple[str, ...]] = ("A", "B")

        def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> dict[str, NDArray[Any]]:
            seen.append(inputs)
            return {}

    TritonStepAdapter(FakePbUtils(), "m", Recorder()).execute([FakeRequest({"A": np.zeros(1)})])
    assert set(seen[0]) == {"A", "B"}
    assert seen[0]["B"] is None


def test_an_unexpected_exception_is_internal_and_names_the_model() -> None:
    pb = FakePbUtils()
    responses = TritonStepAdapter(pb, "topk_resolver", EchoStep()).execute(
        [echo_request(1), echo_request(13, "req-13"), echo_request(3)]
    )
    assert responses[0].outputs()["Y"][0].tolist() == [2, 4]
    assert responses[2].outputs()["Y"][0].tolist() == [6, 8]
    error = responses[1].error()
    assert error.code() == FakeTritonError.INTERNAL
    assert error.message() == "topk_resolver: internal error (RuntimeError: unlucky number)"
    (logged,) = json_lines(pb, "error")
    assert logged["event"] == "request_failed"
    assert logged["model"] == "topk_resolver"
    assert logged["request_id"] == "req-13"
    assert "RuntimeError: unlucky number" in logged["error"]
    assert json_lines(pb, "warn") == []


def test_a_request_whose_inputs_cannot_be_read_fails_alone() -> None:
    # Not a rule the window broke: reading the request itself failed. That request gets an
    # internal error (its own traceback logged); the others of the execute are answered.
    class Unreadable(FakeRequest):
        def inputs(self) -> list[Any]:
            raise RuntimeError("tensor handle gone")

    pb = FakePbUtils()
    responses = TritonStepAdapter(pb, "echo", EchoStep()).execute(
        [echo_request(1), Unreadable({}, "lost"), echo_request(2)]
    )
    assert responses[0].outputs()["Y"][0].tolist() == [2, 4]
    assert responses[2].outputs()["Y"][0].tolist() == [4, 6]
    error = responses[1].error()
    assert error.code() == FakeTritonError.INTERNAL
    assert error.message() == "echo: internal error (RuntimeError: tensor handle gone)"
    (logged,) = json_lines(pb, "error")
    assert logged["request_id"] == "lost" and "tensor handle gone" in logged["trace"]


def test_a_cancelled_request_is_answered_cancelled_unworked_and_the_others_served() -> None:
    # Triton 2.51's dynamic batcher hands requests whose client already gave up to execute
    #: each is answered CANCELLED at once, never run, never logged as an error.
    pb = FakePbUtils()
    step = EchoStep()
    gone = FakeRequest({"X": np.array([[7, 8]])}, "gone", cancelled=True)
    requests = [echo_request(1), gone, echo_request(2)]
    responses = TritonStepAdapter(pb, "echo", step).execute(requests)
    assert responses[0].outputs()["Y"][0].tolist() == [2, 4]
    assert responses[2].outputs()["Y"][0].tolist() == [4, 6]
    error = responses[1].error()
    assert error.code() == FakeTritonError.CANCELLED
    assert "cancelled" in error.message()
    assert step.calls == 2
    assert all(r.cancel_asks == 1 for r in requests)
    assert pb.Logger.lines == []


def test_a_failed_cancellation_ask_serves_the_request() -> None:
    class Unaskable(FakeRequest):
        def is_cancelled(self) -> bool:
            raise RuntimeError("stub lost the server")

    pb = FakePbUtils()
    (response,) = TritonStepAdapter(pb, "echo", EchoStep()).execute(
        [Unaskable({"X": np.array([[1, 2]])})]
    )
    assert response.outputs()["Y"][0].tolist() == [2, 4]


def test_each_request_is_run_once_in_order() -> None:
    pb = FakePbUtils()
    step = EchoStep()
    responses = TritonStepAdapter(pb, "echo", step).execute(
        [echo_request(1), echo_request(2), echo_request(3)]
    )
    assert [r.outputs()["Y"][0].tolist() for r in responses] == [[2, 4], [4, 6], [6, 8]]
    assert step.calls == 3


def test_a_rejection_logs_one_json_line_without_payload() -> None:
    pb = FakePbUtils()
    secret_order = b"order-SECRET-4711"
    pickup = np.array(logical_window(1)["ORDER_PICKUP"], copy=True)
    pickup[3] = [123.4567891, 121.4737]
    request = window_request(
        1,
        "req-42",
        ORDER_PICKUP=pickup,
        ORDER_IDS=np.array([secret_order, b"o2", b"o3", b"o4"], dtype=object),
    )
    (response,) = TritonStepAdapter(pb, "feature_encoder", FeatureEncoderStep()).execute([request])
    assert response.error().code() == FakeTritonError.INVALID_ARG

    assert len(pb.Logger.lines) == 1
    level, line = pb.Logger.lines[0]
    assert level == "warn"
    assert "\n" not in line
    logged = json.loads(line)
    assert set(logged) == LOG_FIELDS
    assert logged == {
        "event": "request_rejected",
        "model": "feature_encoder",
        "request_id": "req-42",
        "tensor": "ORDER_FIELDS[pickup_lat, pickup_lon]",
        "rule": "latitude must be within [-90.0, 90.0] (row 3)",
        "code": "range",
    }
    for payload in ("SECRET", "123.45", "121.47", "o2"):
        assert payload not in line


def _rider_column(value: int) -> NDArray[np.int32]:
    column = np.zeros(10, dtype=np.int32)
    column[2] = value
    return column


REJECTIONS_WITH_PAYLOAD: dict[str, tuple[NDArray[Any], str]] = {
    "RIDER_LOAD": (_rider_column(-7777), "7777"),
    "RIDER_CAPACITY": (_rider_column(-6666), "6666"),
    "RIDER_EQUIPMENT": (_rider_column(-5555), "5555"),
    "RIDER_VEHICLE": (_rider_column(4444), "4444"),
    "ORDER_CREATED_AT": (np.array([1, 2, -3333, 4], dtype=np.int64), "3333"),
    "ORDER_CONSTRAINTS": (np.array([0, 2222, 0, 0], dtype=np.int32), "2222"),
    "ORDER_PROMISED_MINUTES": (np.array([30, 999.25, 30, 30], dtype=np.float32), "999"),
}
# Where each field travels in contract v2 (errors name the column).
WIRE_NAMES = {
    "RIDER_LOAD": "RIDER_FIELDS[load]",
    "RIDER_CAPACITY": "RIDER_FIELDS[capacity]",
    "RIDER_EQUIPMENT": "RIDER_FIELDS[equipment]",
    "RIDER_VEHICLE": "RIDER_FIELDS[vehicle]",
    "ORDER_CREATED_AT": "ORDER_FIELDS[created_at]",
    "ORDER_CONSTRAINTS": "ORDER_FIELDS[constraints]",
    "ORDER_PROMISED_MINUTES": "ORDER_FIELDS[promised_minutes]",
}


@pytest.mark.parametrize("tensor", sorted(REJECTIONS_WITH_PAYLOAD))
def test_rejection_logs_never_echo_request_values(tensor: str) -> None:
    pb = FakePbUtils()
    value, payload = REJECTIONS_WITH_PAYLOAD[tensor]
    request = window_request(1, "req-7", **{tensor: value})
    (response,) = TritonStepAdapter(pb, "feature_encoder", FeatureEncoderStep()).execute([request])
    assert response.error().code() == FakeTritonError.INVALID_ARG
    assert response.error().message().startswith(f"{WIRE_NAMES[tensor]}: ")
    ((_, line),) = pb.Logger.lines
    assert json.loads(line)["tensor"] == WIRE_NAMES[tensor]
    assert payload not in line


def test_a_bad_datum_code_is_refused_without_echoing_it() -> None:
    pb = FakePbUtils()
    wire = {"WINDOW_FIELDS": np.array([1_764_400_000.0, 7777.0])}
    request = window_request(1, "req-8", wire=wire)
    (response,) = TritonStepAdapter(pb, "feature_encoder", FeatureEncoderStep()).execute([request])
    message = response.error().message()
    assert message.startswith("WINDOW_FIELDS[coord_system]: must be one of 0 (WGS84)")
    ((_, line),) = pb.Logger.lines
    assert "7777" not in line and "7777" not in message


def test_a_request_without_the_batch_dimension_is_refused_naming_the_shape() -> None:
    pb = FakePbUtils()
    request = window_request(1)
    request.tensors["ORDER_FIELDS"] = request.tensors["ORDER_FIELDS"][0]
    (response,) = TritonStepAdapter(pb, "feature_encoder", FeatureEncoderStep()).execute([request])
    message = response.error().message()
    assert message.startswith("ORDER_FIELDS: must have a batch dimension of 1")
    assert "shape [1, *, 7], got [4, 7]" in message


# ---- TritonBatchedModelAdapter -------------------------------------------------------


def pairs(rows: int, seed: int) -> NDArray[np.float32]:
    """Realistic pair features: the encoder's own output for a simulated window."""
    window = generate_window(np.random.default_rng(seed), max(rows, 1), 20)
    encoded = FeatureEncoderStep().run(dict(window_to_wire(window)))
    features: NDArray[np.float32] = encoded["PAIR_FEATURES"][:rows]
    return features


def model_request(features: NDArray[Any] | None, request_id: str = "") -> FakeRequest:
    return FakeRequest({"PAIR_FEATURES": features}, request_id)


@pytest.fixture(
    params=[
        pytest.param("contract", id="contract-model"),
        pytest.param("committed", id="committed-model"),
    ]
)
def model_step(request: pytest.FixtureRequest, contract_model: Path) -> DispatchModelStep:
    return DispatchModelStep(contract_model if request.param == "contract" else COMMITTED_MODEL)


def test_batched_adapter_scores_every_request_in_one_call(
    model_step: DispatchModelStep, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    infer = model_step.scorer.infer

    def counting_infer(features: NDArray[np.float32]) -> NDArray[np.float32]:
        calls.append(features.shape[0])
        return infer(features)

    alone = {
        seed: model_step.scorer.score(pairs(rows, seed)) for seed, rows in enumerate((3, 16, 1))
    }
    monkeypatch.setattr(model_step.scorer, "infer", counting_infer)
    pb = FakePbUtils()
    adapter = TritonBatchedModelAdapter(pb, "dispatch_model", model_step)
    requests = [model_request(pairs(rows, seed)) for seed, rows in enumerate((3, 16, 1))]
    responses = adapter.execute(requests)

    assert calls == [3 + 16 + 1]
    assert len(responses) == 3
    for seed, response in enumerate(responses):
        (name, scores), *rest = response.outputs().items()
        assert (name, rest) == ("PAIR_OBJECTIVES", [])
        assert scores.dtype == np.float32
        assert scores.shape == (alone[seed].shape[0], len(OBJECTIVES))
        np.testing.assert_array_equal(scores, alone[seed])
    assert pb.Logger.lines == []


def test_batched_adapter_rejects_bad_requests_and_scores_the_others(
    model_step: DispatchModelStep,
) -> None:
    pb = FakePbUtils()
    adapter = TritonBatchedModelAdapter(pb, "dispatch_model", model_step)
    good = [pairs(rows, seed) for seed, rows in enumerate((5, 2, 7))]
    with_nan = pairs(4, 10)
    with_nan[1, 3] = np.nan
    requests = [
        model_request(good[0], "g0"),
        model_request(with_nan, "nan"),
        model_request(good[1], "g1"),
        model_request(pairs(4, 11)[:, :-1], "narrow"),
        model_request(pairs(4, 12).astype(np.float64), "fp64"),
        model_request(None, "missing"),
        model_request(good[2], "g2"),
    ]
    responses = adapter.execute(requests)

    assert len(responses) == len(requests)
    for index, features in zip((0, 2, 6), good, strict=True):
        np.testing.assert_array_equal(
            responses[index].outputs()["PAIR_OBJECTIVES"], model_step.scorer.score(features)
        )
    width = NUM_PAIR_FEATURES
    expected = {
        1: "PAIR_FEATURES: must be finite",
        3: f"PAIR_FEATURES: must have shape [*, {width}], got (4, {width - 1})",
        4: "PAIR_FEATURES: must be FP32, got float64",
        5: "PAIR_FEATURES: is required but missing",
    }
    for index, message in expected.items():
        error = responses[index].error()
        assert error.code() == FakeTritonError.INVALID_ARG
        assert error.message().startswith(message)
    logged = json_lines(pb, "warn")
    assert [entry["request_id"] for entry in logged] == ["nan", "narrow", "fp64", "missing"]
    assert all(set(entry) == LOG_FIELDS for entry in logged)


def test_batched_adapter_answers_empty_requests(contract_model: Path) -> None:
    adapter = TritonBatchedModelAdapter(
        FakePbUtils(), "dispatch_model", DispatchModelStep(contract_model)
    )
    empty = np.zeros((0, NUM_PAIR_FEATURES), dtype=np.float32)
    responses = adapter.execute([model_request(empty), model_request(pairs(2, 1))])
    assert responses[0].outputs()["PAIR_OBJECTIVES"].shape == (0, len(OBJECTIVES))
    assert responses[1].outputs()["PAIR_OBJECTIVES"].shape == (2, len(OBJECTIVES))


def test_batched_adapter_with_only_bad_requests_does_not_score(
    contract_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = DispatchModelStep(contract_model)

    def no_scoring(batch: object) -> None:
        raise AssertionError("nothing should be scored")

    monkeypatch.setattr(step, "run_batch", no_scoring)
    responses = TritonBatchedModelAdapter(FakePbUtils(), "dispatch_model", step).execute(
        [model_request(None), model_request(pairs(1, 0).astype(np.float64))]
    )
    assert [r.error().code() for r in responses] == ["INVALID_ARG", "INVALID_ARG"]


def test_a_failing_batch_is_internal_for_its_members_only(
    contract_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = DispatchModelStep(contract_model)

    def broken(batch: object) -> None:
        raise MemoryError("out of arena")

    monkeypatch.setattr(step, "run_batch", broken)
    pb = FakePbUtils()
    responses = TritonBatchedModelAdapter(pb, "dispatch_model", step).execute(
        [model_request(pairs(2, 0), "a"), model_request(None, "b"), model_request(pairs(2, 1), "c")]
    )
    assert responses[1].error().code() == FakeTritonError.INVALID_ARG
    for index in (0, 2):
        error = responses[index].error()
        assert error.code() == FakeTritonError.INTERNAL
        assert error.message() == "dispatch_model: internal error (MemoryError: out of arena)"
    assert [entry["request_id"] for entry in json_lines(pb, "error")] == ["a", "c"]


# ---- adapter_for ---------------------------------------------------------------------


def triton_args(name: str, parameters: dict[str, str], repository: Path) -> dict[str, str]:
    config = {
        "name": name,
        "parameters": {key: {"string_value": value} for key, value in parameters.items()},
    }
    return {
        "model_config": json.dumps(config),
        "model_name": name,
        "model_repository": str(repository),
        "model_version": "1",
        "model_instance_name": f"{name}_0_0",
    }


def test_adapter_for_the_encoder(tmp_path: Path) -> None:
    adapter = adapter_for(
        FakePbUtils(),
        triton_args("feature_encoder", {"candidates_per_order": "3"}, tmp_path),
        "feature_encoder",
    )
    assert type(adapter) is TritonEncoderAdapter
    assert adapter.model_name == "feature_encoder"
    assert isinstance(adapter.step, FeatureEncoderStep)
    assert adapter.step.encoder.candidates_per_order == 3


def test_the_encoder_answers_a_batch_byte_for_byte_like_each_window_alone() -> None:
    # One execute of several windows (their pair features built in one pass), one of them
    # bad and one without the batch dimension: each good one gets exactly what the step
    # gives it alone, each bad one its own error.
    step = FeatureEncoderStep()
    pickup = np.array(logical_window(3)["ORDER_PICKUP"], copy=True)
    pickup[1, 0] = 95.0
    unbatched = window_request(4, "d")
    unbatched.tensors = {name: value[0] for name, value in unbatched.tensors.items()}
    requests = [
        window_request(1, "a"),
        window_request(2, "b"),
        window_request(3, "c", ORDER_PICKUP=pickup),
        unbatched,
        window_request(5, "e"),
    ]
    responses = TritonEncoderAdapter(FakePbUtils(), "feature_encoder", step).execute(requests)
    assert len(responses) == len(requests)
    for i in (0, 1, 4):
        alone = step.run({k: v[0] for k, v in requests[i].tensors.items()})
        got = responses[i].outputs()
        assert got.keys() == alone.keys()
        for name, value in alone.items():
            assert got[name][0].dtype == value.dtype and got[name][0].shape == value.shape
            if value.dtype == object:  # WINDOW_CITY: the bytes, not the object pointers
                assert got[name][0].tolist() == value.tolist(), name
            else:
                assert got[name][0].tobytes() == value.tobytes(), name
    for i, tensor in ((2, "ORDER_FIELDS[pickup_lat, pickup_lon]"), (3, "ORDER_IDS")):
        error = responses[i].error()
        assert error.code() == FakeTritonError.INVALID_ARG
        assert error.message().startswith(tensor), error.message()


def test_adapter_for_the_resolver(tmp_path: Path) -> None:
    pb = FakePbUtils()
    adapter = adapter_for(pb, triton_args("topk", {"top_k": "2"}, tmp_path), "topk_resolver")
    assert isinstance(adapter.step, TopKResolverStep)
    assert adapter.step.settings.top_k == 2
    assert adapter.model_name == "topk"


def test_adapter_for_the_model_loads_the_version_file(tmp_path: Path, contract_model: Path) -> None:
    (tmp_path / "1").mkdir()
    shutil.copy(contract_model, tmp_path / "1" / "model.onnx")
    adapter = adapter_for(
        FakePbUtils(),
        triton_args("dispatch_model", {"intra_op_num_threads": "2"}, tmp_path),
        "dispatch_model",
    )
    assert isinstance(adapter, TritonBatchedModelAdapter)
    assert adapter.step.scorer.session.get_session_options().intra_op_num_threads == 2
    (response,) = adapter.execute([model_request(pairs(3, 0))])
    assert response.outputs()["PAIR_OBJECTIVES"].shape == (3, len(OBJECTIVES))


def test_adapter_for_rejects_unknown_parameters(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="bogus"):
        adapter_for(FakePbUtils(), triton_args("fe", {"bogus": "1"}, tmp_path), "feature_encoder")


def test_adapter_for_accepts_backend_parameters(tmp_path: Path) -> None:
    args = triton_args("fe", {"FORCE_CPU_ONLY_INPUT_TENSORS": "no"}, tmp_path)
    assert isinstance(adapter_for(FakePbUtils(), args, "feature_encoder").step, FeatureEncoderStep)


def test_adapter_for_an_unknown_model(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no adapter for model 'dispatch'"):
        adapter_for(FakePbUtils(), triton_args("dispatch", {}, tmp_path), "dispatch")


# ---- custom metrics and load/unload logs ---------------------------------------------


def test_load_and_unload_are_one_json_line_each(tmp_path: Path) -> None:
    pb = FakePbUtils()
    adapter = adapter_for(pb, triton_args("feature_encoder", {}, tmp_path), "feature_encoder")
    loaded = {
        "event": "model_loaded",
        "model": "feature_encoder",
        "version": "1",
        "instance": "feature_encoder_0_0",
    }
    assert json_lines(pb, "info") == [loaded]
    adapter.finalize()
    assert json_lines(pb, "info") == [loaded, {**loaded, "event": "model_unloaded"}]
    assert all("\n" not in line for _, line in pb.Logger.lines)
    assert isinstance(adapter.metrics, NullMetrics)  # the Triton metrics are released


def test_the_encoder_records_latency_candidates_and_rejections(tmp_path: Path) -> None:
    pb = FakePbUtils()
    args = triton_args("feature_encoder", {"candidates_per_order": "3"}, tmp_path)
    adapter = adapter_for(pb, args, "feature_encoder")
    good = [window_request(1, "a"), window_request(2, "c")]
    pickup = np.array(logical_window(1)["ORDER_PICKUP"], copy=True)
    pickup[0, 1] = 200.0
    twice = np.array([b"o1", b"o2", b"o1", b"o4"], dtype=object)
    responses = adapter.execute(
        [
            good[0],
            window_request(1, "b", ORDER_PICKUP=pickup),
            good[1],
            window_request(3, "d", ORDER_IDS=twice),
            window_request(4, "e", ORDER_IDS=twice),
        ]
    )
    adapter.finalize()  # the metrics thread records what it still holds
    families = pb.MetricFamily
    labels = {"model": "feature_encoder", "version": "1"}
    latency = families.series("dispatch_encoder_latency_ms", **labels)
    assert len(latency.observations) == 2 and min(latency.observations) >= 0.0
    assert latency.buckets is not None and latency.buckets[0] > 0
    candidates = families.series("dispatch_candidates_per_order", **labels)
    expected = [
        candidates_per_order(responses[i].outputs()["CANDIDATE_RIDER_INDEX"][0]) for i in (0, 2)
    ]
    assert candidates.observations == expected
    rejections = families.created["dispatch_validation_rejections_total"].metrics
    counted = {(m.labels["tensor"], m.labels["rule"]): m.value for m in rejections}
    pickup = "ORDER_FIELDS[pickup_lat, pickup_lon]"
    assert counted == {(pickup, "range"): 1.0, ("ORDER_IDS", "unique"): 2.0}
    assert all(m.labels["model"] == "feature_encoder" for m in rejections)
    codes = [entry["code"] for entry in json_lines(pb, "warn")]
    assert codes == ["range", "unique", "unique"]


def test_the_resolver_records_capacity_conflicts(tmp_path: Path) -> None:
    pb = FakePbUtils()
    adapter = adapter_for(pb, triton_args("topk_resolver", {}, tmp_path), "topk_resolver")
    window = dict(window_to_wire(generate_window(np.random.default_rng(5), 30, 6)))
    encoded = FeatureEncoderStep().run(window)
    scored = DispatchModelStep(COMMITTED_MODEL).run(encoded)
    inputs = {**window, "CANDIDATE_RIDER_INDEX": encoded["CANDIDATE_RIDER_INDEX"], **scored}
    request = FakeRequest(  # without PAIR_FEATURES: the stand-alone objectives, no BLS call
        batched({name: inputs[name] for name in adapter.step.input_names if name in inputs})
    )
    (response,) = adapter.execute([request])
    adapter.finalize()  # the metrics thread records what it still holds
    out = {name: value[0] for name, value in response.outputs().items()}
    expected = capacity_conflicts(
        out["TOPK_RIDER_INDEX"],
        out["TOPK_OBJECTIVES"][..., 0],
        out["ASSIGNED_RIDER_INDEX"],
        out["ASSIGNED_SCORE"],
    )
    assert expected > 0  # 30 orders, 6 riders
    labels = {"model": "topk_resolver", "version": "1"}
    assert pb.MetricFamily.series("dispatch_capacity_conflicts_total", **labels).value == expected
    latency = pb.MetricFamily.series("dispatch_resolver_latency_ms", **labels)
    assert len(latency.observations) == 1
    # a model exposes only its own families (plus rejections)
    assert set(pb.MetricFamily.created) == {
        "dispatch_resolver_latency_ms",
        "dispatch_capacity_conflicts_total",
        "dispatch_validation_rejections_total",
    }


class ScoringPbUtils(FakePbUtils):
    """pb_utils whose BLS `dispatch_model` scores with the committed model; `refused`
    versions answer an error, as Triton does for a version it does not serve."""

    def __init__(self, refused: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.calls: list[tuple[str, int, int]] = []
        model, calls = DispatchModelStep(COMMITTED_MODEL), self.calls

        class InferenceRequest:
            def __init__(
                self,
                model_name: str,
                inputs: list[FakeTensor],
                requested_output_names: list[str],
                model_version: int = -1,
                timeout: int = 0,
            ) -> None:
                self.model, self.version = model_name, model_version
                self.features = {t.name(): t.as_numpy() for t in inputs}["PAIR_FEATURES"]
                assert requested_output_names == ["PAIR_OBJECTIVES"]
                assert timeout == 2_000_000  # rescore_timeout_ms, in microseconds

            def exec(self) -> FakeResponse:
                calls.append((self.model, self.version, len(self.features)))
                if self.version in refused:
                    return FakeResponse(error=FakeTritonError("unknown model version"))
                scores = model.scorer.infer(self.features)
                return FakeResponse([FakeTensor("PAIR_OBJECTIVES", scores)])

        self.InferenceRequest = InferenceRequest

    @staticmethod
    def get_output_tensor_by_name(response: FakeResponse, name: str) -> FakeTensor | None:
        return FakeTensor(name, response.outputs()[name])


def stacked_resolver_request() -> tuple[dict[str, Any], FakeRequest]:
    """A scarce window as the ensemble hands it to topk_resolver (versions 1 and 2)."""
    window = dict(window_to_wire(generate_window(np.random.default_rng(3), 24, 10)))
    encoded = FeatureEncoderStep().run(window)
    scored = DispatchModelStep(COMMITTED_MODEL).run(encoded)
    versions = np.where(np.arange(24) % 2 == 0, 1, 2).astype(np.int32)
    inputs = {**window, **encoded, **scored, "ORDER_MODEL_VERSION": versions}
    names = TopKResolverStep.input_names
    return inputs, FakeRequest(batched({n: inputs[n] for n in names if n in inputs}))


@pytest.mark.parametrize("refused", [(), (2,)])
def test_the_resolver_re_scores_stacked_orders_through_bls(
    tmp_path: Path, refused: tuple[int, ...]
) -> None:
    """One BLS call of dispatch_model per version the window's orders were scored with; the
    answer is the step's with that model, and a refused version's pairs keep what they had."""
    pb = ScoringPbUtils(refused)
    adapter = adapter_for(pb, triton_args("topk_resolver", {}, tmp_path), "topk_resolver")
    inputs, request = stacked_resolver_request()
    (response,) = adapter.execute([request])
    adapter.finalize()
    assert sorted({(model, version) for model, version, _ in pb.calls}) == [
        ("dispatch_model", 1),
        ("dispatch_model", 2),
    ]
    assert len(pb.calls) == 2

    def expected_score(version: int, features: NDArray[np.float32]) -> NDArray[np.float32]:
        if version in refused:
            raise ModelCallError("refused")
        return DispatchModelStep(COMMITTED_MODEL).scorer.infer(features)

    expected = TopKResolverStep().run(inputs, score=expected_score)
    for name, value in response.outputs().items():
        np.testing.assert_array_equal(value[0], expected[name], err_msg=name)
    failed = [line for line in json_lines(pb, "warn") if line["event"] == "rescore_failed"]
    assert [(line["target_version"], line["error"]) for line in failed] == [
        (version, "ModelCallError: unknown model version") for version in refused
    ]


def test_the_resolver_answers_a_batch_byte_for_byte_like_each_window_alone(
    tmp_path: Path,
) -> None:
    # One execute: small windows where nothing stacks (resolved together), a scarce window
    # whose stacked orders are re-scored through BLS, and a bad one: each good window gets
    # exactly what the step gives it alone, the bad one its own error.
    pb = ScoringPbUtils()
    adapter = adapter_for(pb, triton_args("topk_resolver", {}, tmp_path), "topk_resolver")
    names = TopKResolverStep.input_names

    def small(seed: int) -> dict[str, Any]:
        window = dict(window_to_wire(generate_window(np.random.default_rng(seed), 1, 20)))
        encoded = FeatureEncoderStep().run(window)
        scored = DispatchModelStep(COMMITTED_MODEL).run(encoded)
        return {**window, **encoded, **scored, "ORDER_MODEL_VERSION": np.ones(1, np.int32)}

    stacked, _ = stacked_resolver_request()
    bad = small(13)
    bad["ORDER_MODEL_VERSION"] = np.ones(2, np.int32)  # one row per order, not two
    windows = [small(11), stacked, bad, small(12), small(14)]
    requests = [FakeRequest(batched({n: w[n] for n in names if n in w})) for w in windows]
    responses = adapter.execute(requests)
    adapter.finalize()

    def expected_score(version: int, features: NDArray[np.float32]) -> NDArray[np.float32]:
        return DispatchModelStep(COMMITTED_MODEL).scorer.infer(features)

    for i in (0, 1, 3, 4):
        alone = TopKResolverStep().run(windows[i], score=expected_score)
        got = responses[i].outputs()
        assert got.keys() == alone.keys()
        for name, value in alone.items():
            assert got[name][0].dtype == value.dtype, name
            assert got[name][0].tobytes() == value.tobytes(), name
    error = responses[2].error()
    assert error.code() == FakeTritonError.INVALID_ARG
    assert error.message().startswith("ORDER_MODEL_VERSION: must have one row per order")


def test_the_resolver_with_stack_aware_off_makes_no_bls_call(tmp_path: Path) -> None:
    pb = ScoringPbUtils()
    args = triton_args("topk_resolver", {"stack_aware": "false"}, tmp_path)
    adapter = adapter_for(pb, args, "topk_resolver")
    inputs, request = stacked_resolver_request()
    (response,) = adapter.execute([request])
    adapter.finalize()
    assert pb.calls == []
    expected = TopKResolverStep().run(inputs)
    for name, value in response.outputs().items():
        np.testing.assert_array_equal(value[0], expected[name], err_msg=name)


def test_the_batched_model_counts_rejections_by_rule(tmp_path: Path, contract_model: Path) -> None:
    (tmp_path / "1").mkdir()
    shutil.copy(contract_model, tmp_path / "1" / "model.onnx")
    pb = FakePbUtils()
    adapter = adapter_for(pb, triton_args("dispatch_model", {}, tmp_path), "dispatch_model")
    with_nan = pairs(4, 10)
    with_nan[1, 3] = np.inf
    adapter.execute(
        [
            model_request(pairs(3, 0)),
            model_request(with_nan),
            model_request(pairs(4, 11)[:, :-1]),
            model_request(pairs(4, 12).astype(np.float64)),
            model_request(None),
        ]
    )
    adapter.finalize()  # the metrics thread records what it still holds
    assert set(pb.MetricFamily.created) == {"dispatch_validation_rejections_total"}
    rejections = pb.MetricFamily.created["dispatch_validation_rejections_total"].metrics
    counted = {m.labels["rule"]: m.value for m in rejections}
    assert counted == {"not_finite": 1.0, "shape": 1.0, "dtype": 1.0, "missing": 1.0}
    assert {m.labels["tensor"] for m in rejections} == {"PAIR_FEATURES"}


class BrokenMetrics:
    def record(self, observations: object) -> None:
        raise RuntimeError("metrics IPC failed")


def test_a_metrics_failure_never_fails_a_request() -> None:
    pb = FakePbUtils()
    adapter = TritonStepAdapter(
        pb,
        "feature_encoder",
        FeatureEncoderStep(),
        metrics=BrokenMetrics(),
        observer=STEP_OBSERVERS["feature_encoder"],
    )
    responses = adapter.execute([window_request(1), window_request(2)])
    assert all(not r.has_error() for r in responses)
    (logged,) = json_lines(pb, "error")  # logged once, not per request
    assert logged["event"] == "metrics_failed"
    assert "metrics IPC failed" in logged["error"]


class RefusingMetricFamilies(FakeMetricFamilies):
    def __call__(self, name: str, description: str, kind: str) -> FakeMetricFamily:
        raise RuntimeError("metrics are disabled")


def test_without_custom_metrics_the_model_still_loads(tmp_path: Path) -> None:
    pb = FakePbUtils()
    pb.MetricFamily = RefusingMetricFamilies()
    adapter = adapter_for(pb, triton_args("topk_resolver", {}, tmp_path), "topk_resolver")
    assert isinstance(adapter.metrics, NullMetrics)
    (warned,) = json_lines(pb, "warn")
    assert warned["event"] == "metrics_unavailable"
    assert "metrics are disabled" in warned["error"]
    assert json_lines(pb, "info")[0]["event"] == "model_loaded"


@pytest.mark.parametrize("model", ["feature_encoder", "dispatch_model", "topk_resolver"])
def test_each_model_py_hands_initialize_execute_and_finalize_to_the_adapter(model: str) -> None:
    source = (MODEL_REPOSITORY / model / "1" / "model.py").read_text()
    assert f'adapter_for(pb_utils, args, "{model}")' in source
    assert "return self.adapter.execute(requests)" in source
    assert "self.adapter.finalize()" in source
    assert len(source.splitlines()) <= 20


# ---- what client text reaches the log --------------------------------------------------


class AddressStep:
    """Refuses every window as the geocoding chain does an unknown address: the message to
    the client quotes the address."""

    input_names: ClassVar[tuple[str, ...]] = ("X",)

    def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> dict[str, NDArray[Any]]:
        raise DispatchInputError(
            "ORDER_PICKUP_ADDRESS",
            "row 0: address 'No. 7 Secret Lane' must name a district, road or place",
            "unknown_value",
        )


def test_a_megabyte_request_id_costs_a_few_hundred_bytes_of_log() -> None:
    pb = FakePbUtils()
    huge = "r\n" * (1 << 19)  # 1 MiB, newlines included
    (response,) = TritonStepAdapter(pb, "echo", EchoStep()).execute([echo_request(-1, huge)])
    assert response.error().code() == FakeTritonError.INVALID_ARG
    ((level, line),) = pb.Logger.lines
    assert level == "warn" and len(line.encode()) < 400 and "\n" not in line
    logged = json.loads(line)["request_id"]
    assert logged.startswith("r\\nr\\n") and logged.endswith(f"...[{1 << 20} chars]")


def test_an_address_the_client_sent_reaches_the_client_but_not_the_log() -> None:
    pb = FakePbUtils()
    (response,) = TritonStepAdapter(pb, "feature_encoder", AddressStep()).execute(
        [echo_request(1, "req-7")]
    )
    assert "No. 7 Secret Lane" in response.error().message()
    ((_, line),) = pb.Logger.lines
    assert "Secret" not in line
    assert json.loads(line)["rule"] == "row 0: address '...' must name a district, road or place"


def test_an_internal_error_logs_no_quoted_value_and_a_capped_message() -> None:
    class Leaky(EchoStep):
        def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> dict[str, NDArray[Any]]:
            x = inputs["X"]
            assert x is not None
            raise KeyError(f"user-{int(x.sum()) * 10_000} at {where!r}" + "!" * 10_000)

    where = "Secret Lane"

    pb = FakePbUtils()
    TritonStepAdapter(pb, "echo", Leaky()).execute([echo_request(1, "req-1")])
    ((level, line),) = pb.Logger.lines  # the payload: user 30000 at Secret Lane
    assert level == "error" and "30000" not in line and "Secret" not in line
    assert len(line) < 2048 + 1024
    assert json.loads(line)["error"].startswith("KeyError: '...'")


def test_rejection_lines_are_rate_limited_with_a_count_of_those_dropped() -> None:
    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    from dispatch_service.core.log_text import LogRateLimit

    pb = FakePbUtils()
    adapter = TritonStepAdapter(pb, "echo", EchoStep())
    clock = Clock()
    adapter.request_lines = LogRateLimit(per_s=1.0, burst=5, clock=clock)
    responses = adapter.execute([echo_request(-1, f"r{i}") for i in range(1000)])
    assert all(r.error().code() == FakeTritonError.INVALID_ARG for r in responses)
    assert len(pb.Logger.lines) == 5  # every request refused, five lines
    clock.now += 1.0
    adapter.execute([echo_request(-1, "later")])
    dropped, later = (json.loads(line) for _, line in pb.Logger.lines[5:])
    assert dropped == {"event": "log_lines_dropped", "model": "echo", "lines": 995}
    assert later["request_id"] == "later"


# ---- the stub's shared-memory region ------------------------------------------------------


def test_every_adapter_seals_its_stubs_region_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sealed: list[str] = []
    monkeypatch.setattr(
        "dispatch_service.serving.triton_adapter.seal_own_region", lambda: sealed.append("x")
    )
    adapter_for(FakePbUtils(), triton_args("topk_resolver", {}, tmp_path), "topk_resolver")
    assert sealed == ["x"]


def test_a_region_that_cannot_be_sealed_is_logged_and_the_load_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse() -> None:
        raise PermissionError("/dev/shm/dispatchsrv_1_ab_x is not a region of this server")

    monkeypatch.setattr("dispatch_service.serving.triton_adapter.seal_own_region", refuse)
    pb = FakePbUtils()
    adapter_for(pb, triton_args("topk_resolver", {}, tmp_path), "topk_resolver")
    (warning,) = json_lines(pb, "warn")
    assert warning["event"] == "shm_region_not_sealed" and warning["model"] == "topk_resolver"
    assert warning["error"].startswith("PermissionError: /dev/shm/dispatchsrv_1_ab_x")
