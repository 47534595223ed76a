"""Behaviour of dispatch_service.pipeline.onnx_runner: settings, the model-file check, scoring."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from numpy.typing import NDArray
from onnx import TensorProto, helper

from dispatch_contract import NUM_PAIR_FEATURES, OBJECTIVES
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.repository_layout import ONNX_FILE
from dispatch_service.pipeline.onnx_runner import OnnxScorer, OrtSettings, session_options

F = NUM_PAIR_FEATURES
Dims = Sequence[int | str]


def write_graph(
    path: Path,
    inputs: Sequence[tuple[str, Dims]],
    outputs: Sequence[tuple[str, Dims]],
    node_type: str = "Identity",
    input_type: int = TensorProto.FLOAT,
) -> Path:
    """A one-node graph (inputs -> node_type -> outputs) saved to ``path``."""
    in_names = [name for name, _ in inputs]
    out_names = [name for name, _ in outputs]
    graph = helper.make_graph(
        [helper.make_node(node_type, in_names, out_names)],
        "probe",
        [helper.make_tensor_value_info(name, input_type, list(dims)) for name, dims in inputs],
        [helper.make_tensor_value_info(name, input_type, list(dims)) for name, dims in outputs],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def slicing_graph(path: Path, in_name: str, width: int | str, out_name: str) -> Path:
    """[batch, width] -> first three columns, under the given names."""
    graph = helper.make_graph(
        [helper.make_node("Slice", [in_name, "starts", "ends", "axes"], [out_name])],
        "probe",
        [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, ["batch", 3])],
        initializer=[
            helper.make_tensor("starts", TensorProto.INT64, [1], [0]),
            helper.make_tensor("ends", TensorProto.INT64, [1], [3]),
            helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def features(rows: int, seed: int = 0) -> NDArray[np.float32]:
    return np.random.default_rng(seed).normal(size=(rows, F)).astype(np.float32)


# ---- OrtSettings ---------------------------------------------------------------------


def test_default_settings_use_one_thread_and_full_optimisation() -> None:
    settings = OrtSettings()
    assert settings.intra_op_num_threads == 1
    assert settings.inter_op_num_threads == 1
    assert settings.graph_optimization_level == "all"


@pytest.mark.parametrize("level", ["disable", "basic", "extended", "all"])
def test_each_graph_optimization_level_is_accepted(level: str, contract_model: Path) -> None:
    settings = OrtSettings(graph_optimization_level=level)
    scorer = OnnxScorer(contract_model, settings)
    assert scorer.score(features(2)).shape == (2, len(OBJECTIVES))


@pytest.mark.parametrize("level", ["ALL", "none", "", "99"])
def test_an_unknown_graph_optimization_level_is_rejected(level: str) -> None:
    with pytest.raises(ValueError, match="graph_optimization_level must be one of"):
        OrtSettings(graph_optimization_level=level)


@pytest.mark.parametrize(
    ("intra", "inter"), [(-1, 1), (1, -1), (-2, -2)], ids=["intra", "inter", "both"]
)
def test_negative_thread_counts_are_rejected(intra: int, inter: int) -> None:
    with pytest.raises(ValueError, match="thread counts must be >= 0"):
        OrtSettings(intra_op_num_threads=intra, inter_op_num_threads=inter)


def test_zero_threads_lets_onnx_runtime_choose(contract_model: Path) -> None:
    scorer = OnnxScorer(contract_model, OrtSettings(intra_op_num_threads=0, inter_op_num_threads=0))
    assert scorer.score(features(1)).shape == (1, len(OBJECTIVES))


def test_settings_reach_the_session(contract_model: Path) -> None:
    scorer = OnnxScorer(contract_model, OrtSettings(intra_op_num_threads=2))
    options = scorer.session.get_session_options()
    assert options.intra_op_num_threads == 2
    assert options.inter_op_num_threads == 1
    assert scorer.session.get_providers() == ["CPUExecutionProvider"]


# ---- the model file against the contract ---------------------------------------------


def test_a_contract_model_loads_and_scores(contract_model: Path) -> None:
    scorer = OnnxScorer(contract_model)
    scores = scorer.score(features(5))
    assert scores.shape == (5, len(OBJECTIVES))
    assert scores.dtype == np.float32
    assert np.isfinite(scores).all()


def test_a_wrong_input_name_is_rejected(tmp_path: Path) -> None:
    path = slicing_graph(tmp_path / "m.onnx", "FEATURES", F, "PAIR_OBJECTIVES")
    with pytest.raises(ValueError, match=r"expected one input PAIR_FEATURES \[batch, 34\]") as info:
        OnnxScorer(path)
    assert "FEATURES" in str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("width", [F - 1, F + 1, "features"], ids=["27", "29", "symbolic"])
def test_a_wrong_input_width_is_rejected(tmp_path: Path, width: int | str) -> None:
    path = slicing_graph(tmp_path / "m.onnx", "PAIR_FEATURES", width, "PAIR_OBJECTIVES")
    with pytest.raises(ValueError, match="expected one input PAIR_FEATURES") as info:
        OnnxScorer(path)
    assert repr(width) in str(info.value)


def test_two_inputs_are_rejected(tmp_path: Path) -> None:
    path = write_graph(
        tmp_path / "m.onnx",
        [("PAIR_FEATURES", ["batch", F]), ("EXTRA", ["batch", F])],
        [("PAIR_OBJECTIVES", ["batch", F])],
        node_type="Add",
    )
    with pytest.raises(ValueError, match="expected one input PAIR_FEATURES"):
        OnnxScorer(path)


@pytest.mark.parametrize("dims", [[F], ["batch", F, 1]], ids=["rank-1", "rank-3"])
def test_an_input_of_another_rank_is_rejected(tmp_path: Path, dims: list[int | str]) -> None:
    path = write_graph(tmp_path / "m.onnx", [("PAIR_FEATURES", dims)], [("PAIR_OBJECTIVES", dims)])
    with pytest.raises(ValueError, match="expected one input PAIR_FEATURES"):
        OnnxScorer(path)


def test_a_wrong_output_name_is_rejected(tmp_path: Path) -> None:
    path = slicing_graph(tmp_path / "m.onnx", "PAIR_FEATURES", F, "OBJECTIVES")
    with pytest.raises(ValueError, match=r"expected one output PAIR_OBJECTIVES") as info:
        OnnxScorer(path)
    assert "'OBJECTIVES'" in str(info.value)


def test_two_outputs_are_rejected(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["PAIR_FEATURES"], ["PAIR_OBJECTIVES"]),
            helper.make_node("Identity", ["PAIR_FEATURES"], ["EXTRA"]),
        ],
        "probe",
        [helper.make_tensor_value_info("PAIR_FEATURES", TensorProto.FLOAT, ["batch", F])],
        [
            helper.make_tensor_value_info("PAIR_OBJECTIVES", TensorProto.FLOAT, ["batch", F]),
            helper.make_tensor_value_info("EXTRA", TensorProto.FLOAT, ["batch", F]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ValueError, match="expected one output PAIR_OBJECTIVES"):
        OnnxScorer(path)


def test_a_missing_model_file_fails_to_load(tmp_path: Path) -> None:
    with pytest.raises(Exception, match=r"model\.onnx"):
        OnnxScorer(tmp_path / ONNX_FILE)


# ---- check and score -----------------------------------------------------------------


@pytest.fixture(scope="module")
def scorer(tmp_path_factory: pytest.TempPathFactory) -> OnnxScorer:
    path = slicing_graph(
        tmp_path_factory.mktemp("slice") / "m.onnx", "PAIR_FEATURES", F, "PAIR_OBJECTIVES"
    )
    return OnnxScorer(path)


@pytest.mark.parametrize(
    ("array", "rule"),
    [
        (np.zeros((4, F - 1), dtype=np.float32), "must have shape [*, 34], got (4, 33)"),
        (np.zeros((4, F + 5), dtype=np.float32), "must have shape [*, 34], got (4, 39)"),
        (np.zeros(F, dtype=np.float32), "must have shape [*, 34], got (34,)"),
        (np.zeros((2, 2, F), dtype=np.float32), "must have shape [*, 34], got (2, 2, 34)"),
        (np.zeros((4, F), dtype=np.float64), "must be FP32, got float64"),
        (np.zeros((4, F), dtype=np.float16), "must be FP32, got float16"),
    ],
    ids=["narrow", "wide", "rank-1", "rank-3", "fp64", "fp16"],
)
def test_check_names_pair_features(
    scorer: OnnxScorer, array: NDArray[np.float32], rule: str
) -> None:
    with pytest.raises(DispatchInputError) as info:
        scorer.check(array)
    assert info.value.tensor == "PAIR_FEATURES"
    assert rule in info.value.rule


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_check_rejects_non_finite_features(scorer: OnnxScorer, bad: float) -> None:
    array = features(6)
    array[4, 17] = bad
    with pytest.raises(DispatchInputError) as info:
        scorer.check(array)
    assert info.value.tensor == "PAIR_FEATURES"
    assert "must be finite" in info.value.rule


def test_score_checks_before_running(scorer: OnnxScorer) -> None:
    array = features(3)
    array[0, 0] = np.nan
    with pytest.raises(DispatchInputError, match="PAIR_FEATURES: must be finite"):
        scorer.score(array)


def test_check_accepts_good_features(scorer: OnnxScorer) -> None:
    scorer.check(features(3))
    scorer.check(np.zeros((0, F), dtype=np.float32))


def test_score_runs_the_graph(scorer: OnnxScorer) -> None:
    array = features(4)
    np.testing.assert_array_equal(scorer.score(array), array[:, :3])


@pytest.mark.parametrize("method", ["score", "infer"])
def test_zero_rows_give_an_empty_objectives_matrix(scorer: OnnxScorer, method: str) -> None:
    result = getattr(scorer, method)(np.zeros((0, F), dtype=np.float32))
    assert result.shape == (0, len(OBJECTIVES))
    assert result.dtype == np.float32


def test_rows_are_scored_independently_of_their_batch(contract_model: Path) -> None:
    scorer = OnnxScorer(contract_model)
    array = features(40, seed=5)
    together = scorer.score(array)
    for row in (0, 17, 39):
        np.testing.assert_array_equal(scorer.score(array[row : row + 1]), together[row : row + 1])


def test_session_options_carry_the_settings() -> None:
    options = session_options(OrtSettings(2, 3, "basic"))
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 3)
    assert options.graph_optimization_level.name == "ORT_ENABLE_BASIC"
    assert options.execution_mode.name == "ORT_SEQUENTIAL"
    assert not options.enable_profiling
