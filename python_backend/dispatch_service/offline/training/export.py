"""The MLP as an ONNX graph, and the checks that ONNX Runtime runs it as numpy does."""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import onnx
import onnxruntime as ort
from numpy.typing import NDArray
from onnx import TensorProto, helper, numpy_helper

from dispatch_contract import (
    FEATURE_LAYOUT_VERSION,
    MODEL_INPUTS,
    MODEL_OUTPUTS,
    NUM_PAIR_FEATURES,
    OBJECTIVES,
    PAIR_FEATURE_NAMES,
)
from dispatch_service.offline.training.config import LOG_COST_RANGE, LOG_ETA_RANGE
from dispatch_service.offline.training.data import F32
from dispatch_service.offline.training.mlp import MLP

__all__ = [
    "IR_VERSION",
    "OPSET",
    "max_relative_difference",
    "ort_predict",
    "to_onnx",
]

OPSET: Final = 17
IR_VERSION: Final = 8  # opset 17's IR; loads in the ONNX Runtime of Triton 24.10 as well


def to_onnx(model: MLP, doc: str = "") -> onnx.ModelProto:
    """The MLP as an opset-17 graph: PAIR_FEATURES [batch, F] -> PAIR_OBJECTIVES [batch, 3]."""
    in_name, out_name = MODEL_INPUTS[0].name, MODEL_OUTPUTS[0].name
    inits: list[TensorProto] = []

    def const(name: str, value: NDArray[Any]) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    nodes = []
    parts = [in_name]
    if model.derived is not None:  # log(1 + relu(x @ derived))
        nodes += [
            helper.make_node("MatMul", [in_name, const("derived", model.derived)], ["d_lin"]),
            helper.make_node("Relu", ["d_lin"], ["d_pos"]),
            helper.make_node("Add", [const("one", np.asarray(1.0, np.float32)), "d_pos"], ["d_1p"]),
            helper.make_node("Log", ["d_1p"], ["d_log"]),
        ]
        parts.append("d_log")
    columns = in_name
    if len(parts) > 1:
        columns = "x_all"
        nodes.append(helper.make_node("Concat", parts, [columns], axis=1))
    nodes += [
        helper.make_node("Sub", [columns, const("feature_mean", model.feature_mean)], ["x_c"]),
        helper.make_node("Mul", ["x_c", const("feature_scale", model.feature_scale)], ["h0"]),
    ]
    last = len(model.weights) - 1
    current = "h0"
    for i, (w, b) in enumerate(zip(model.weights, model.biases, strict=True)):
        if i == last:  # fold the output affine map into the last layer
            w = w * model.out_scale[None, :]
            b = b * model.out_scale + model.out_offset
        gemm_out = "heads" if i == last else f"a{i + 1}"
        nodes.append(
            helper.make_node(
                "Gemm",
                [current, const(f"w{i + 1}", w.astype(np.float32)), const(f"b{i + 1}", b)],
                [gemm_out],
            )
        )
        if i != last:
            nodes.append(helper.make_node("Relu", [gemm_out], [f"h{i + 1}"]))
            current = f"h{i + 1}"

    def column(c: int) -> str:
        nodes.append(
            helper.make_node(
                "Slice",
                [
                    "heads",
                    const(f"start_{c}", np.asarray([c], dtype=np.int64)),
                    const(f"end_{c}", np.asarray([c + 1], dtype=np.int64)),
                    const(f"axis_{c}", np.asarray([1], dtype=np.int64)),
                ],
                [f"col_{c}"],
            )
        )
        return f"col_{c}"

    def clipped_exp(c: int, bounds: tuple[float, float]) -> str:
        low = const(f"low_{c}", np.asarray(bounds[0], dtype=np.float32))
        high = const(f"high_{c}", np.asarray(bounds[1], dtype=np.float32))
        nodes.append(helper.make_node("Clip", [column(c), low, high], [f"clip_{c}"]))
        nodes.append(helper.make_node("Exp", [f"clip_{c}"], [f"out_{c}"]))
        return f"out_{c}"

    eta = clipped_exp(0, LOG_ETA_RANGE)
    nodes.append(helper.make_node("Sigmoid", [column(1)], ["out_1"]))
    cost = clipped_exp(2, LOG_COST_RANGE)
    nodes.append(helper.make_node("Concat", [eta, "out_1", cost], [out_name], axis=1))

    graph = helper.make_graph(
        nodes,
        "dispatch_mlp",
        [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, ["batch", NUM_PAIR_FEATURES])],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, ["batch", len(OBJECTIVES)])],
        initializer=inits,
    )
    onnx_model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="dispatch_service.offline.training",
        doc_string=doc,
    )
    onnx_model.ir_version = IR_VERSION
    helper.set_model_props(
        onnx_model,
        {
            "feature_layout_version": FEATURE_LAYOUT_VERSION,
            "pair_feature_names": ",".join(PAIR_FEATURE_NAMES),
            "objectives": ",".join(OBJECTIVES),
        },
    )
    onnx.checker.check_model(onnx_model, full_check=True)
    return onnx_model


def max_relative_difference(a: F32, b: F32) -> float:
    """max |a - b| / max(|b|, 1): absolute for probabilities, relative for minutes and CNY."""
    if a.size == 0:
        return 0.0
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
    return float(np.max(diff / np.maximum(np.abs(b.astype(np.float64)), 1.0)))


def ort_predict(model_bytes: bytes, features: F32) -> F32:
    """Run a serialized model on the CPU exactly as the serving path would."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        model_bytes, sess_options=options, providers=["CPUExecutionProvider"]
    )
    out = session.run([MODEL_OUTPUTS[0].name], {MODEL_INPUTS[0].name: features})[0]
    return np.asarray(out, dtype=np.float32)
