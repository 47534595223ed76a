"""Behaviour of dispatch_service.serving.step_adapters over a stand-in for Triton's `pb_utils`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from adapter_helpers import json_lines, logical_window, window_request
from dispatch_contract import (
    NUM_PAIR_FEATURES,
    OBJECTIVES,
    batched,
)
from dispatch_service.core.metrics import NullMetrics
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, ModelLayout, model_layout
from dispatch_service.core.settings import SettingsError
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline.step_metrics import (
    candidates_per_order,
    capacity_conflicts,
)
from dispatch_service.pipeline.steps import DispatchModelStep, FeatureEncoderStep, TopKResolverStep
from dispatch_service.routing.engine import ModelCallError
from dispatch_service.serving.step_adapters import (
    TritonBatchedModelAdapter,
    TritonEncoderAdapter,
    TritonResolverAdapter,
    TritonStepAdapter,
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

COMMITTED_MODEL = model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(1)
LOG_FIELDS = {"event", "model", "request_id", "tensor", "rule", "code"}


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


# ---- from_triton: the adapters built from Triton's initialize args ------------------


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


def test_from_triton_the_encoder(tmp_path: Path) -> None:
    adapter = TritonEncoderAdapter.from_triton(
        FakePbUtils(), triton_args("feature_encoder", {"candidates_per_order": "3"}, tmp_path)
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


def test_from_triton_the_resolver(tmp_path: Path) -> None:
    pb = FakePbUtils()
    adapter = TritonResolverAdapter.from_triton(pb, triton_args("topk", {"top_k": "2"}, tmp_path))
    assert isinstance(adapter.step, TopKResolverStep)
    assert adapter.step.settings.top_k == 2
    assert adapter.model_name == "topk"


def test_from_triton_the_model_loads_the_version_file(tmp_path: Path, contract_model: Path) -> None:
    ModelLayout(tmp_path).version(1).mkdir()
    shutil.copy(contract_model, ModelLayout(tmp_path).onnx(1))
    adapter = TritonBatchedModelAdapter.from_triton(
        FakePbUtils(), triton_args("dispatch_model", {"intra_op_num_threads": "2"}, tmp_path)
    )
    assert isinstance(adapter, TritonBatchedModelAdapter)
    assert adapter.step.scorer.session.get_session_options().intra_op_num_threads == 2
    (response,) = adapter.execute([model_request(pairs(3, 0))])
    assert response.outputs()["PAIR_OBJECTIVES"].shape == (3, len(OBJECTIVES))


def test_from_triton_rejects_unknown_parameters(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="bogus"):
        TritonEncoderAdapter.from_triton(FakePbUtils(), triton_args("fe", {"bogus": "1"}, tmp_path))


def test_from_triton_accepts_backend_parameters(tmp_path: Path) -> None:
    args = triton_args("fe", {"FORCE_CPU_ONLY_INPUT_TENSORS": "no"}, tmp_path)
    assert isinstance(
        TritonEncoderAdapter.from_triton(FakePbUtils(), args).step, FeatureEncoderStep
    )


# ---- custom metrics and load/unload logs ---------------------------------------------


def test_load_and_unload_are_one_json_line_each(tmp_path: Path) -> None:
    pb = FakePbUtils()
    adapter = TritonEncoderAdapter.from_triton(pb, triton_args("feature_encoder", {}, tmp_path))
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
    adapter = TritonEncoderAdapter.from_triton(pb, args)
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
    adapter = TritonResolverAdapter.from_triton(pb, triton_args("topk_resolver", {}, tmp_path))
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
        "dispatch_decision_records_total",
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
    adapter = TritonResolverAdapter.from_triton(pb, triton_args("topk_resolver", {}, tmp_path))
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
    adapter = TritonResolverAdapter.from_triton(pb, triton_args("topk_resolver", {}, tmp_path))
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
    adapter = TritonResolverAdapter.from_triton(pb, args)
    inputs, request = stacked_resolver_request()
    (response,) = adapter.execute([request])
    adapter.finalize()
    assert pb.calls == []
    expected = TopKResolverStep().run(inputs)
    for name, value in response.outputs().items():
        np.testing.assert_array_equal(value[0], expected[name], err_msg=name)


def test_the_batched_model_counts_rejections_by_rule(tmp_path: Path, contract_model: Path) -> None:
    ModelLayout(tmp_path).version(1).mkdir()
    shutil.copy(contract_model, ModelLayout(tmp_path).onnx(1))
    pb = FakePbUtils()
    adapter = TritonBatchedModelAdapter.from_triton(pb, triton_args("dispatch_model", {}, tmp_path))
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


class RefusingMetricFamilies(FakeMetricFamilies):
    def __call__(self, name: str, description: str, kind: str) -> FakeMetricFamily:
        raise RuntimeError("metrics are disabled")


def test_without_custom_metrics_the_model_still_loads(tmp_path: Path) -> None:
    pb = FakePbUtils()
    pb.MetricFamily = RefusingMetricFamilies()
    adapter = TritonResolverAdapter.from_triton(pb, triton_args("topk_resolver", {}, tmp_path))
    assert isinstance(adapter.metrics, NullMetrics)
    (warned,) = json_lines(pb, "warn")
    assert warned["event"] == "metrics_unavailable"
    assert "metrics are disabled" in warned["error"]
    assert json_lines(pb, "info")[0]["event"] == "model_loaded"


@pytest.mark.parametrize(
    ("model", "adapter"),
    [
        ("feature_encoder", TritonEncoderAdapter),
        ("dispatch_model", TritonBatchedModelAdapter),
        ("topk_resolver", TritonResolverAdapter),
    ],
)
def test_each_model_py_names_its_adapter_and_hands_it_every_call(
    model: str, adapter: type[TritonStepAdapter]
) -> None:
    layout = model_layout(MODEL_REPOSITORY, model)
    for version in layout.versions():
        source = layout.python_model(version).read_text()
        assert f"from dispatch_service.serving.step_adapters import {adapter.__name__}" in source
        assert f"self.adapter = {adapter.__name__}.from_triton(pb_utils, args)" in source
        assert "return self.adapter.execute(requests)" in source
        assert "self.adapter.finalize()" in source
        assert len(source.splitlines()) <= 20


# ---- the stub's shared-memory region ------------------------------------------------------


def test_every_adapter_seals_its_stubs_region_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sealed: list[str] = []
    monkeypatch.setattr(
        "dispatch_service.serving.backend_log.seal_own_region", lambda: sealed.append("x")
    )
    TritonResolverAdapter.from_triton(FakePbUtils(), triton_args("topk_resolver", {}, tmp_path))
    assert sealed == ["x"]
