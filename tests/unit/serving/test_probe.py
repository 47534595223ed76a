"""The launcher's probe windows are left out of the project's metrics (serving.probe)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from dispatch_contract import batched
from dispatch_service.core.metrics import ENCODER_LATENCY, InMemoryMetrics
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline.step_metrics import encoder_observations
from dispatch_service.pipeline.steps import FeatureEncoderStep
from dispatch_service.serving.probe import PROBE_PARAMETER, is_probe
from dispatch_service.serving.step_adapters import TritonEncoderAdapter
from pb_stand_in import FakePbUtils, FakeRequest


class ParameterRequest(FakeRequest):
    """A request with parameters, as `pb_utils` gives them: a JSON object as text."""

    def __init__(self, inputs: Any, parameters: dict[str, Any]) -> None:
        super().__init__(inputs)
        self._parameters = json.dumps(parameters)

    def parameters(self) -> str:
        return self._parameters


def window() -> dict[str, Any]:
    return batched(window_to_wire(generate_window(np.random.default_rng(4), 4, 10)))


def test_only_the_probe_mark_makes_a_probe() -> None:
    assert is_probe(ParameterRequest({}, {PROBE_PARAMETER: True}))
    assert not is_probe(ParameterRequest({}, {PROBE_PARAMETER: False}))
    assert not is_probe(ParameterRequest({}, {"other": 1}))
    assert not is_probe(FakeRequest({}))  # a request that cannot say


def test_a_probe_window_is_answered_but_not_counted() -> None:
    metrics = InMemoryMetrics()
    adapter = TritonEncoderAdapter(
        FakePbUtils(),
        "feature_encoder",
        FeatureEncoderStep(),
        metrics=metrics,
        observer=encoder_observations,
    )
    probe = ParameterRequest(window(), {PROBE_PARAMETER: True})
    user = ParameterRequest(window(), {})
    answers = adapter.execute([probe, user])
    assert not answers[0].has_error() and not answers[1].has_error()
    assert len(metrics.observed(ENCODER_LATENCY)) == 1  # the user's window only
