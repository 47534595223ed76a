"""Behaviour of dispatch_service.serving.bls: a scoring request and its answer read back."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dispatch_service.routing.engine import ModelCallError
from dispatch_service.serving.bls import scored_objectives, scoring_request
from pb_stand_in import FakePbUtils, FakeResponse, FakeTensor, FakeTritonError


class RequestPb(FakePbUtils):
    """pb_utils whose InferenceRequest keeps what it was built with."""

    @staticmethod
    def InferenceRequest(**kwargs: Any) -> dict[str, Any]:  # noqa: N802 (pb_utils' name)
        return kwargs

    @staticmethod
    def get_output_tensor_by_name(response: FakeResponse, name: str) -> FakeTensor | None:
        outputs = response.outputs()
        return FakeTensor(name, outputs[name]) if name in outputs else None


def test_a_scoring_request_names_the_version_and_the_tensors() -> None:
    features = np.zeros((3, 4), dtype=np.float32)
    request = scoring_request(RequestPb(), "dispatch_model", np.int32(2), features)
    assert request["model_name"] == "dispatch_model" and request["model_version"] == 2
    assert type(request["model_version"]) is int
    (tensor,) = request["inputs"]
    assert tensor.name() == "PAIR_FEATURES" and tensor.as_numpy() is features
    assert request["requested_output_names"] == ["PAIR_OBJECTIVES"]
    assert "timeout" not in request


def test_a_queue_timeout_is_passed_only_when_set() -> None:
    features = np.zeros((1, 4), dtype=np.float32)
    request = scoring_request(RequestPb(), "m", 1, features, timeout_us=2_000)
    assert request["timeout"] == 2_000


def test_an_answer_gives_its_objectives() -> None:
    scores = np.ones((2, 3), dtype=np.float32)
    answer = FakeResponse([FakeTensor("PAIR_OBJECTIVES", scores)])
    np.testing.assert_array_equal(scored_objectives(RequestPb(), answer), scores)


def test_an_error_answer_or_one_without_objectives_raises_model_call_error() -> None:
    with pytest.raises(ModelCallError, match="unknown model version"):
        scored_objectives(RequestPb(), FakeResponse(error=FakeTritonError("unknown model version")))
    with pytest.raises(ModelCallError, match="lacks PAIR_OBJECTIVES"):
        scored_objectives(RequestPb(), FakeResponse([]))
