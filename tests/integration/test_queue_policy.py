"""Bounded queues, deadlines and priorities on a live server: refusals are immediate and
named, level 2 is served through a bulk overload, a flood of level 1 (which any caller may
claim) is refused at once past its few places instead of starving level 2, and the next
request is served.

The overload is made, not hoped for: the contract's largest windows at level 2 are sent
first and take the entry point's instances (each runs far longer than it takes to send a
small window), then a burst of small bulk windows arrives while they run. The bulk queue
fills, and what it cannot hold is refused at once ("Exceeds maximum queue size"); what it
holds is served when an instance frees or, past the bulk level's own deadline, refused as
expired. Every request gets one of those answers; a burst with no refusal fails the test.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from patience import wait_for
from tritonclient.utils import InferenceServerException

from dispatch_client import DispatchClient
from dispatch_client.errors import DispatchServerError
from dispatch_client.retry import DEFAULT_RETRY, UNAVAILABLE_STATUSES
from dispatch_contract import MAX_ORDERS, MAX_RIDERS
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.ops.server import TritonServer
from dispatch_service.ops.stubs import instance_count
from dispatch_service.ops.verified_load import read_config
from dispatch_service.routing.settings import FUSED_MODEL_NAME
from triton_helpers import OUTPUT_NAMES, grpc_inputs, infer_grpc, sim_window

# Entry point -> the model whose queue its requests wait in first.
ENTRY_POINTS = {"dispatch": "feature_encoder", FUSED_MODEL_NAME: FUSED_MODEL_NAME}
BULK, STANDARD, URGENT = 3, 2, 1
BURST = 120  # bulk requests sent at once: far above the bulk queue (16)
BLOCKER_DEADLINE_US = 60_000_000  # the large windows wait their turn whatever the host's pace
QUEUE_FULL = "Exceeds maximum queue size"
EXPIRED = "Request timeout expired"


def queue_policy(model: str, level: int) -> dict[str, Any]:
    """The queue policy of one priority level, as the model's config file sets it."""
    batching = read_config(MODEL_REPOSITORY / model)["dynamic_batching"]
    policy: dict[str, Any] = batching["priority_queue_policy"][str(level)]
    return policy


@dataclass
class Answers:
    """Async answers, by tag: (result, error) each."""

    got: dict[str, list[tuple[Any, Any]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def callback(self, tag: str) -> Any:
        def record(result: Any, error: Any) -> None:
            with self.lock:
                self.got.setdefault(tag, []).append((result, error))

        return record

    def count(self, tag: str) -> int:
        with self.lock:
            return len(self.got.get(tag, []))


@pytest.fixture(scope="module")
def largest_window() -> dict[str, np.ndarray[Any, Any]]:
    return sim_window(seed=1, orders=MAX_ORDERS, riders=MAX_RIDERS)


@contextmanager
def instances_busy(
    triton: TritonServer,
    model: str,
    window: dict[str, np.ndarray[Any, Any]],
    answers: Answers,
    rounds: int = 1,
) -> Iterator[grpcclient.InferenceServerClient]:
    """``rounds`` largest windows (level 2) for each instance of ``model``'s first queued
    step, sent ahead of what the caller sends on the client yielded (the same channel, so
    they arrive first, and level 2 is taken before bulk); on exit, all of them answered."""
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    blockers = rounds * instance_count(read_config(MODEL_REPOSITORY / ENTRY_POINTS[model]))
    try:
        outputs = [grpcclient.InferRequestedOutput(n) for n in OUTPUT_NAMES]
        inputs = grpc_inputs(window)
        for _ in range(blockers):
            client.async_infer(
                model,
                inputs,
                answers.callback("blocker"),
                outputs=outputs,
                priority=STANDARD,
                timeout=BLOCKER_DEADLINE_US,
            )
        yield client
        wait_for(lambda: answers.count("blocker") == blockers, "large windows answered", 120)
    finally:
        client.close()


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_a_bulk_burst_is_shed_at_once_and_the_server_stays_healthy(
    model: str,
    triton: TritonServer,
    grpc_client: grpcclient.InferenceServerClient,
    largest_window: dict[str, np.ndarray[Any, Any]],
) -> None:
    step = ENTRY_POINTS[model]
    bulk = queue_policy(step, BULK)
    window = sim_window(seed=5, orders=8, riders=20)
    expected = infer_grpc(grpc_client, window)
    answers = Answers()
    with instances_busy(triton, model, largest_window, answers, rounds=3) as client:
        outputs = [grpcclient.InferRequestedOutput(n) for n in OUTPUT_NAMES]
        inputs = grpc_inputs(window)
        for _ in range(BURST):
            client.async_infer(
                model, inputs, answers.callback("bulk"), outputs=outputs, priority=BULK
            )
        # Nothing is lost: every request of the burst gets an answer or a named refusal.
        wait_for(lambda: answers.count("bulk") == BURST, "every bulk request answered", 120)
    burst = answers.got["bulk"]
    reasons = Counter(
        "served" if error is None else QUEUE_FULL if QUEUE_FULL in error.message() else
        EXPIRED if EXPIRED in error.message() else error.message()
        for _, error in burst
    )  # fmt: skip
    print(f"\n{model}: a bulk burst of {BURST} on busy instances: {dict(reasons)}")
    # The premise: the bulk queue was full, and what it could not hold was refused at once.
    assert reasons[QUEUE_FULL] > 0, reasons
    # At most the bulk queue's size waited (then served or expired) beyond what the instances
    # took from it: everything else was refused.
    assert reasons[QUEUE_FULL] + reasons["served"] + reasons[EXPIRED] == BURST, reasons
    assert set(reasons) <= {"served", QUEUE_FULL, EXPIRED}, reasons
    assert int(bulk["max_queue_size"]) < BURST
    for _, error in burst:
        if error is not None:
            assert error.status() == "StatusCode.UNAVAILABLE", error
    for result, error in burst:
        if error is None:
            got = result.as_numpy("TOPK_RIDER_INDEX")[0]
            np.testing.assert_array_equal(got, expected["TOPK_RIDER_INDEX"])
    # Level 2 was served through the bulk overload (2.51 does not pass a request's own
    # deadline to an ensemble's steps: behind the largest windows some wait past the level's
    # 1 s there, and are refused as expired).
    blocked = [error.message() for _, error in answers.got["blocker"] if error is not None]
    assert len(blocked) < len(answers.got["blocker"]), blocked
    assert all(EXPIRED in message for message in blocked), blocked
    # The next request, at the standard level, is served with the right answer.
    again = infer_grpc(grpc_client, window, model=model)
    np.testing.assert_array_equal(again["TOPK_RIDER_INDEX"], expected["TOPK_RIDER_INDEX"])
    assert grpc_client.is_server_live() and grpc_client.is_model_ready(model)


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_a_level_1_flood_is_refused_past_its_few_places_and_level_2_still_served(
    model: str,
    triton: TritonServer,
    grpc_client: grpcclient.InferenceServerClient,
    largest_window: dict[str, np.ndarray[Any, Any]],
) -> None:
    """Any caller may claim level 1, so its queue holds a few windows: a burst of level-1
    windows on busy instances is refused at once beyond them ("Exceeds maximum queue
    size"), and a level-2 window sent behind the burst is served, not held until it
    expires."""
    places = int(queue_policy(ENTRY_POINTS[model], URGENT)["max_queue_size"])
    window = sim_window(seed=8, orders=4, riders=20)
    expected = infer_grpc(grpc_client, window)
    answers = Answers()
    with instances_busy(triton, model, largest_window, answers) as client:
        outputs = [grpcclient.InferRequestedOutput(n) for n in OUTPUT_NAMES]
        inputs = grpc_inputs(window)
        for _ in range(BURST):
            client.async_infer(
                model, inputs, answers.callback("flood"), outputs=outputs, priority=URGENT
            )
        # Its own deadline, as the large windows': on a loaded host the instances can stay
        # busy with them past level 2's 1 s, which is the host's pace, not the flood's.
        client.async_infer(
            model, inputs, answers.callback("standard"), outputs=outputs, priority=STANDARD,
            timeout=BLOCKER_DEADLINE_US,
        )  # fmt: skip
        wait_for(lambda: answers.count("flood") == BURST, "every level-1 window answered", 120)
        wait_for(lambda: answers.count("standard") == 1, "the level-2 window answered", 120)
    reasons = Counter(
        "served" if error is None else QUEUE_FULL if QUEUE_FULL in error.message() else
        EXPIRED if EXPIRED in error.message() else error.message()
        for _, error in answers.got["flood"]
    )  # fmt: skip
    print(f"\n{model}: a level-1 flood of {BURST} on busy instances: {dict(reasons)}")
    assert set(reasons) <= {"served", QUEUE_FULL, EXPIRED}, reasons
    # Beyond the few places (and what freed instances took meanwhile), refused at once.
    assert reasons[QUEUE_FULL] >= BURST // 2 and places <= 4, reasons
    ((result, error),) = answers.got["standard"]
    assert error is None, error.message()
    got = result.as_numpy("TOPK_RIDER_INDEX")[0]
    np.testing.assert_array_equal(got, expected["TOPK_RIDER_INDEX"])


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_an_expired_deadline_is_refused_as_unavailable(
    model: str,
    triton: TritonServer,
    grpc_client: grpcclient.InferenceServerClient,
    largest_window: dict[str, np.ndarray[Any, Any]],
) -> None:
    window = sim_window(seed=6, orders=4, riders=20)
    with instances_busy(triton, model, largest_window, Answers(), rounds=3):
        # 1 us cannot be met: the request waits in the queue while the instances are busy.
        for _ in range(3):
            with pytest.raises(InferenceServerException) as refused:
                grpc_client.infer(model, grpc_inputs(window), timeout=1, priority=STANDARD)
            assert refused.value.status() == "StatusCode.UNAVAILABLE", refused.value
            assert "timeout" in str(refused.value.message()).lower(), refused.value
        # The client knows these refusals for what they are (no work done) and sends them
        # again, over both protocols, before it gives up with the last one.
        for client in (
            DispatchClient.grpc(triton.grpc_url, model_name=model, deadline_ms=0.001),
            DispatchClient.http(triton.http_url, model_name=model, deadline_ms=0.001),
        ):
            with client, pytest.raises(DispatchServerError) as caught:
                client.dispatch(_logical(window))
            assert caught.value.status in UNAVAILABLE_STATUSES, caught.value
            assert caught.value.attempts == DEFAULT_RETRY.attempts
    with DispatchClient.grpc(triton.grpc_url, model_name=model, deadline_ms=5000) as client:
        assert len(client.dispatch(_logical(window)).orders) == 4


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_a_priority_level_beyond_the_configured_ones_is_served_at_the_default(
    model: str, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """Triton 2.51 serves a level above `priority_levels` at `default_priority_level`
    (neither refused nor dropped): the caller gets its answer."""
    window = sim_window(seed=7, orders=2, riders=10)
    expected = infer_grpc(grpc_client, window)
    result = grpc_client.infer(model, grpc_inputs(window), priority=9)
    np.testing.assert_array_equal(
        result.as_numpy("TOPK_RIDER_INDEX")[0], expected["TOPK_RIDER_INDEX"]
    )


def _logical(window: dict[str, Any]) -> dict[str, Any]:
    from dispatch_service.domain.window_wire import window_tensors_from_wire

    return {k: v for k, v in window_tensors_from_wire(window).items() if v is not None}


def test_the_burst_is_far_above_the_bulk_queue() -> None:
    """The premise of the burst test, from the config files it runs on."""
    for step in ENTRY_POINTS.values():
        assert 2 * int(queue_policy(step, BULK)["max_queue_size"]) <= BURST, step
