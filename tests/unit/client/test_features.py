"""`DispatchClient.dispatch_features`: what it sends to `dispatch_features` and what it refuses."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_client import DispatchClient
from dispatch_contract import (
    FEATURE_ENTRY_INPUTS,
    FEATURE_ENTRY_MODEL_NAME,
    NUM_PAIR_FEATURES,
)

Array = NDArray[Any]


class Recorder:
    """A transport answering K = 1 with the first candidate of each order."""

    def __init__(self) -> None:
        self.request_ids: list[str] = []
        self.calls: list[tuple[str, dict[str, Array]]] = []

    def infer(
        self,
        model_name: str,
        inputs: dict[str, Array],
        output_names: Sequence[str],
        *,
        request_id: str = "",
    ) -> dict[str, Array]:
        self.request_ids.append(request_id)
        self.calls.append((model_name, inputs))
        assert all(value.shape[0] == 1 for value in inputs.values())  # one window per request
        index = inputs["CANDIDATE_RIDER_INDEX"][0, :, :1].astype(np.int32)
        n = len(index)
        objectives = np.tile(np.array([0.5, 20, 0.9, 7], np.float32), (n, 1, 1))
        answer = {
            "TOPK_RIDER_INDEX": index,
            "TOPK_OBJECTIVES": objectives,
            "ASSIGNED_RIDER_INDEX": index[:, 0],
            "ASSIGNED_SCORE": np.full(n, 0.5, np.float32),
        }
        return {name: value[np.newaxis] for name, value in answer.items()}

    def close(self) -> None:
        pass


def features(orders: int = 2, candidates: int = 3, riders: int = 4) -> dict[str, Any]:
    return {
        "PAIR_FEATURES": np.zeros((orders * candidates, NUM_PAIR_FEATURES), np.float64),
        "CANDIDATE_RIDER_INDEX": np.arange(orders * candidates).reshape(orders, -1) % riders,
        "ORDER_USER_IDS": [b"u%d" % i for i in range(orders)],
        "RIDER_IDS": [f"r{i}".encode() for i in range(riders)],
        # RIDER_FIELD_COLUMNS: lat, lon, load, capacity, vehicle, equipment
        "RIDER_FIELDS": [[31.2, 121.4, 0, 2, 0, 0]] * riders,
    }


def test_sends_contract_dtypes_to_the_feature_entry_point() -> None:
    transport = Recorder()
    result = DispatchClient(transport).dispatch_features(["o1", "o2"], features())
    ((model, sent),) = transport.calls
    assert model == FEATURE_ENTRY_MODEL_NAME == "dispatch_features"
    specs = {spec.name: spec for spec in FEATURE_ENTRY_INPUTS}
    assert set(sent) == set(specs) - {"OBJECTIVE_WEIGHTS", "MODEL_VERSION_TAG", "ORDER_FIELDS"}
    for name, array in sent.items():
        expected = object if specs[name].triton_dtype == "BYTES" else specs[name].numpy_dtype
        assert array.dtype == expected, name
    assert sent["RIDER_FIELDS"].shape == (1, 4, 6)
    assert [o.order_id for o in result.orders] == ["o1", "o2"]
    assert result.assignments() == {"o1": "r0", "o2": "r3"}


def test_creation_times_are_sent_when_given() -> None:
    transport = Recorder()
    fields = [[31.2, 121.4, 31.21, 121.41, 1_764_399_700, 30, 0]] * 2  # ORDER_FIELD_COLUMNS
    DispatchClient(transport).dispatch_features(["a", "b"], {**features(), "ORDER_FIELDS": fields})
    sent = transport.calls[0][1]["ORDER_FIELDS"]
    assert sent.dtype == np.float64 and sent.shape == (1, 2, 7)


def test_weights_are_sent_when_given() -> None:
    transport = Recorder()
    tensors = {**features(), "OBJECTIVE_WEIGHTS": [1, 0, 0]}
    DispatchClient(transport).dispatch_features(["a", "b"], tensors)
    assert transport.calls[0][1]["OBJECTIVE_WEIGHTS"].tolist() == [[1.0, 0.0, 0.0]]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"EXTRA": [1]}, "unknown feature tensor"),
        ({"RIDER_IDS": None}, "feature tensors lack RIDER_IDS"),
        ({"PAIR_FEATURES": np.zeros((6, 27))}, r"PAIR_FEATURES must have shape \[P, 34\]"),
        ({"PAIR_FEATURES": np.zeros((5, 34))}, "must have B x N = 6 rows, got 5"),
        ({"CANDIDATE_RIDER_INDEX": np.zeros((3, 2))}, "with B = 2 orders"),
        ({"ORDER_USER_IDS": [b"u"]}, r"ORDER_TEXT must have shape \[2, \*\]"),
    ],
)
def test_inconsistent_tensors_are_refused_before_sending(
    change: dict[str, Any], message: str
) -> None:
    transport = Recorder()
    tensors = {**features(), **change}
    with pytest.raises(ValueError, match=message):
        DispatchClient(transport).dispatch_features(["a", "b"], tensors)
    assert transport.calls == []
