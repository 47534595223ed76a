"""Shared unit-test fixtures.

`contract_model` is a tiny ONNX graph that honours the dispatch_model contract
(PAIR_FEATURES [batch, 28] FP32 -> PAIR_OBJECTIVES [batch, 3] FP32, every output positive
and the on-time column in (0, 1)), so the scorer, the steps, the pipeline and the Triton
adapter can be tested without the trained model file.

The adapters' factories lower their process's CPU priority and limit its BLAS threads
(`serving.stub_setup`); the first a process cannot take back. Both are recorded here
instead (`stub_priorities`, `stub_blas_limits`), so the test process, and the servers the
integration tests start from it, keep their own.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dispatch_contract import (
    MODEL_INPUTS,
    MODEL_OUTPUTS,
    NUM_PAIR_FEATURES,
    OBJECTIVES,
)
from dispatch_service.core.repository_layout import ONNX_FILE
from dispatch_service.serving import stub_setup

CONTRACT_MODEL_HIDDEN = 32
# Sigmoid outputs times these give ETA in (0, 60) min, P(on time) in (0, 1), cost in (0, 20).
CONTRACT_MODEL_OUTPUT_SCALE = (60.0, 1.0, 20.0)


def write_contract_model(path: Path, seed: int = 7) -> Path:
    """Save a small random MLP with the contract's input and output to ``path``."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    in_name, out_name = MODEL_INPUTS[0].name, MODEL_OUTPUTS[0].name
    arrays = {
        "w1": rng.normal(0.0, 0.3, (NUM_PAIR_FEATURES, CONTRACT_MODEL_HIDDEN)),
        "b1": rng.normal(0.0, 0.1, CONTRACT_MODEL_HIDDEN),
        "w2": rng.normal(0.0, 0.3, (CONTRACT_MODEL_HIDDEN, len(OBJECTIVES))),
        "b2": rng.normal(0.0, 0.1, len(OBJECTIVES)),
        "scale": np.asarray(CONTRACT_MODEL_OUTPUT_SCALE),
    }
    initializers = [
        numpy_helper.from_array(value.astype(np.float32), name) for name, value in arrays.items()
    ]
    nodes = [
        helper.make_node("Gemm", [in_name, "w1", "b1"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["h1"]),
        helper.make_node("Gemm", ["h1", "w2", "b2"], ["a2"]),
        helper.make_node("Sigmoid", ["a2"], ["s2"]),
        helper.make_node("Mul", ["s2", "scale"], [out_name]),
    ]
    graph = helper.make_graph(
        nodes,
        "contract_test_model",
        [helper.make_tensor_value_info(in_name, TensorProto.FLOAT, ["batch", NUM_PAIR_FEATURES])],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, ["batch", len(OBJECTIVES)])],
        initializer=initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="session")
def contract_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path of a contract-conforming ONNX model (not the trained one)."""
    return write_contract_model(tmp_path_factory.mktemp("contract_model") / ONNX_FILE)


@pytest.fixture(autouse=True)
def _no_ambient_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unit tests see no control-plane keys from the environment.

    The integration session exports the live server's shm key (`make test` runs both suites in
    one process); a unit test's stand-in server must not receive it as a request header.
    """
    from dispatch_client.keys import (
        ADMIN_KEY_ENV,
        ADMIN_KEY_FILE_ENV,
        SHM_KEY_ENV,
        SHM_KEY_FILE_ENV,
    )

    for name in (ADMIN_KEY_ENV, ADMIN_KEY_FILE_ENV, SHM_KEY_ENV, SHM_KEY_FILE_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def stub_priorities(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The niceness each `stub_setup.prepare_stub` of the test asked for, in order."""
    asked: list[int] = []

    def record(nice: int, tasks: Path = Path()) -> list[int]:
        asked.append(nice)
        return []

    monkeypatch.setattr(stub_setup, "lower_cpu_priority", record)
    return asked


@pytest.fixture(autouse=True)
def stub_blas_limits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One entry per `stub_setup.prepare_stub` of the test that limited BLAS."""
    limited: list[str] = []
    monkeypatch.setattr(stub_setup, "single_threaded_blas", lambda: limited.append("blas"))
    return limited
