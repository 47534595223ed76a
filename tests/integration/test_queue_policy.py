"""Bounded queues, deadlines and priorities on a live server: refusals are immediate and
named, level 1 is served through a bulk overload, and the next request is served."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from dispatch_client import DispatchClient
from dispatch_client.errors import DispatchServerError
from dispatch_client.retry import DEFAULT_RETRY, UNAVAILABLE_STATUSES
from dispatch_service.ops.server import TritonServer
from dispatch_service.routing.settings import FUSED_MODEL_NAME
from triton_helpers import OUTPUT_NAMES, grpc_inputs, infer_grpc, sim_window

ENTRY_POINTS = ("dispatch", FUSED_MODEL_NAME)
BURST = 120  # bulk requests sent at once: far above the bulk queue (16), bounded in count


def _burst(
    triton: TritonServer, model: str, window: dict[str, Any], priority: int, count: int
) -> list[tuple[Any, Any, float]]:
    """`count` requests in flight at once; (result, error, seconds to the answer) each."""
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    answers: list[tuple[Any, Any, float]] = []
    lock = threading.Lock()
    done = threading.Event()
    try:
        outputs = [grpcclient.InferRequestedOutput(n) for n in OUTPUT_NAMES]
        # Built once: each call serialises them anew, and the burst arrives faster than the
        # server drains it (building them per request let a slow host keep the queue short).
        inputs = grpc_inputs(window)
        for _ in range(count):
            sent = time.monotonic()

            def record(result: Any, error: Any, sent: float = sent) -> None:
                with lock:
                    answers.append((result, error, time.monotonic() - sent))
                    if len(answers) == count:
                        done.set()

            client.async_infer(model, inputs, record, outputs=outputs, priority=priority)
        assert done.wait(120), f"{count - len(answers)} answers missing"
    finally:
        client.close()
    return answers


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_a_bulk_burst_is_shed_at_once_and_the_server_stays_healthy(
    model: str, triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    window = sim_window(seed=5, orders=64, riders=200)
    answers = _burst(triton, model, window, priority=3, count=BURST)
    refused = [(error, seconds) for _, error, seconds in answers if error is not None]
    served = [result for result, error, _ in answers if error is None]
    assert refused, "a bulk burst far above its queue refused nothing"
    assert served, "the bulk burst was refused entirely"
    for error, _ in refused:
        assert error.status() == "StatusCode.UNAVAILABLE", error
        assert "Exceeds maximum queue size" in error.message() or "timeout" in error.message()
    # the next request, at the standard level, is served with the right answer
    expected = infer_grpc(grpc_client, window)
    again = infer_grpc(grpc_client, window, model=model)
    np.testing.assert_array_equal(again["TOPK_RIDER_INDEX"], expected["TOPK_RIDER_INDEX"])
    assert grpc_client.is_server_live() and grpc_client.is_model_ready(model)


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_an_expired_deadline_is_refused_as_unavailable(
    model: str, triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    window = sim_window(seed=6, orders=4, riders=20)
    refused = 0
    for _ in range(5):  # 1 us cannot be met: the request waits longer than that to be batched
        try:
            grpc_client.infer(model, grpc_inputs(window), timeout=1, priority=2)
        except InferenceServerException as exc:
            assert exc.status() == "StatusCode.UNAVAILABLE", exc
            assert "timeout" in str(exc.message()).lower()
            refused += 1
    assert refused >= 1
    # The client knows these refusals for what they are (no work done) and sends them again,
    # over both protocols, before it gives up with the last one.
    for client in (
        DispatchClient.grpc(triton.grpc_url, model_name=model, deadline_ms=0.001),
        DispatchClient.http(triton.http_url, model_name=model, deadline_ms=0.001),
    ):
        with client:
            try:
                client.dispatch(_logical(window))
            except DispatchServerError as exc:
                assert exc.status in UNAVAILABLE_STATUSES, exc
                assert exc.attempts == DEFAULT_RETRY.attempts
    with DispatchClient.grpc(triton.grpc_url, model_name=model, deadline_ms=5000) as client:
        assert len(client.dispatch(_logical(window)).orders) == 4


def test_an_unknown_priority_level_is_refused_by_the_server_too(
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    window = sim_window(seed=7, orders=2, riders=10)
    try:
        result = grpc_client.infer(FUSED_MODEL_NAME, grpc_inputs(window), priority=9)
    except InferenceServerException as exc:
        assert "priority" in str(exc.message()).lower(), exc
    else:  # Triton may map an out-of-range level to the default: then it must answer
        assert result.as_numpy("TOPK_RIDER_INDEX").shape[:2] == (1, 2)


def _logical(window: dict[str, Any]) -> dict[str, Any]:
    from dispatch_service.domain.window import window_tensors_from_wire

    return {k: v for k, v in window_tensors_from_wire(window).items() if v is not None}
