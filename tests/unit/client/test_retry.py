"""RetryPolicy: which failures are sent again, the jittered waits, the attempt and time bounds."""

from __future__ import annotations

import random
from typing import Any

import pytest
from client_helpers import FakeTransport, outputs, window

from dispatch_client import DispatchClient
from dispatch_client.errors import (
    DispatchConnectionError,
    DispatchError,
    DispatchServerError,
    WindowJSONError,
)
from dispatch_client.retry import (
    DEFAULT_RETRY,
    NO_RETRY,
    RetryPolicy,
    RetryThrottle,
    is_retryable,
)

QUEUE_FULL = DispatchServerError("Exceeds maximum queue size", "StatusCode.UNAVAILABLE")


class Clock:
    """A fake monotonic clock that `sleep` advances, so waits are checked without waiting."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (QUEUE_FULL, True),
        (DispatchServerError("Request timeout expired", "StatusCode.UNAVAILABLE"), True),
        (DispatchServerError("model 'dispatch' is not ready", "503"), True),
        (DispatchConnectionError("cannot reach localhost:1 over gRPC: failed to connect"), True),
        # the request may still be running on the server: not sent twice
        (DispatchConnectionError("no answer from x within 2 s", timed_out=True), False),
        (DispatchServerError("ORDER_FIELDS: must be finite", "StatusCode.INVALID_ARGUMENT"), False),
        (DispatchServerError("ORDER_FIELDS: must be finite", "400"), False),
        # the instance died with the window: another serves it (sent again once: `call`)
        (DispatchServerError("Stub process 'x_0_1' is not healthy.", "StatusCode.INTERNAL"), True),
        (DispatchServerError("Stub process 'x_0_1' is not healthy.", "500"), True),
        (DispatchServerError("Stub process 'x_0_1' is not healthy.", "400"), False),
        (DispatchServerError("Failed to process the request(s)", "StatusCode.INTERNAL"), False),
        (DispatchServerError("malformed response: output X is missing"), False),
        (WindowJSONError("orders[0].pickup", "must be two numbers"), False),
        (RuntimeError("boom"), False),
    ],
)
def test_only_a_refusal_without_work_or_a_lost_instance_is_retryable(
    error: Exception, retryable: bool
) -> None:
    assert is_retryable(error) is retryable


def test_the_waits_grow_to_the_cap_with_full_jitter() -> None:
    policy = RetryPolicy(
        attempts=10, initial_backoff_ms=10, max_backoff_ms=80, rng=random.Random(1)
    )
    caps = [10, 20, 40, 80, 80, 80]
    for retry, cap in enumerate(caps, start=1):
        waits = [policy.backoff_ms(retry) for _ in range(400)]
        assert min(waits) >= 0.0 and max(waits) <= cap
        # drawn across the whole range, not a fixed wait (callers must not return together)
        assert min(waits) < 0.1 * cap and max(waits) > 0.9 * cap


def test_a_refused_send_is_retried_until_it_is_answered() -> None:
    clock = Clock()
    errors = [QUEUE_FULL, QUEUE_FULL]
    policy = RetryPolicy(
        attempts=3, initial_backoff_ms=10, max_backoff_ms=100, rng=random.Random(2)
    )

    def send() -> str:
        if errors:
            raise errors.pop(0)
        return "answer"

    assert policy.call(send, sleep=clock.sleep, clock=clock) == "answer"
    assert len(clock.sleeps) == 2
    assert 0 <= clock.sleeps[0] <= 0.010 and 0 <= clock.sleeps[1] <= 0.020


def test_the_last_error_is_raised_with_the_number_of_sends() -> None:
    clock = Clock()
    policy = RetryPolicy(attempts=4, rng=random.Random(3))
    sends: list[int] = []

    def send() -> str:
        sends.append(1)
        raise DispatchServerError(f"Exceeds maximum queue size #{len(sends)}", "503")

    with pytest.raises(DispatchServerError) as info:
        policy.call(send, sleep=clock.sleep, clock=clock)
    assert len(sends) == 4 and len(clock.sleeps) == 3
    assert info.value.attempts == 4 and info.value.message.endswith("#4")


def test_a_bad_window_is_sent_once() -> None:
    clock = Clock()
    sends: list[int] = []
    bad = DispatchServerError("ORDER_FIELDS: must be finite", "StatusCode.INVALID_ARGUMENT")

    def send() -> str:
        sends.append(1)
        raise bad

    with pytest.raises(DispatchServerError) as info:
        DEFAULT_RETRY.call(send, sleep=clock.sleep, clock=clock)
    assert info.value is bad and info.value.attempts == 1
    assert sends == [1] and clock.sleeps == []


def test_no_retry_runs_past_the_budget() -> None:
    clock = Clock()
    policy = RetryPolicy(
        attempts=10, initial_backoff_ms=100, max_backoff_ms=100, budget_ms=250, rng=random.Random(4)
    )
    sends: list[float] = []

    def send() -> str:
        sends.append(clock.now)
        clock.now += 0.040  # each refusal takes 40 ms to come back
        raise QUEUE_FULL

    with pytest.raises(DispatchServerError):
        policy.call(send, sleep=clock.sleep, clock=clock)
    assert len(sends) >= 2
    # every wait that was taken ended within the budget; the next one would not have
    assert all((start - sends[0]) * 1000 <= 250 for start in sends)
    assert (clock.now - sends[0]) * 1000 <= 250 + 40


def test_no_retry_sends_once() -> None:
    clock = Clock()
    sends: list[int] = []

    def send() -> str:
        sends.append(1)
        raise QUEUE_FULL

    with pytest.raises(DispatchServerError):
        NO_RETRY.call(send, sleep=clock.sleep, clock=clock)
    assert sends == [1]


def test_the_throttle_stops_retries_while_most_sends_are_refused_and_recovers() -> None:
    throttle = RetryThrottle(max_tokens=10, token_ratio=0.1)
    allowed = []
    for _ in range(6):
        throttle.refused()
        allowed.append(throttle.allows_retry())
    # 10 tokens: retries stop once half are spent (gRPC's retry throttling rule)
    assert allowed == [True, True, True, True, False, False]
    for _ in range(9):  # 4 tokens + 9 x 0.1 = 4.9: still not more than half
        throttle.succeeded()
    assert not throttle.allows_retry()
    for _ in range(20):
        throttle.succeeded()
    assert throttle.allows_retry() and throttle.tokens == pytest.approx(6.9)
    for _ in range(200):
        throttle.succeeded()
    assert throttle.tokens == 10  # capped at max_tokens


def test_a_client_refused_every_time_stops_retrying() -> None:
    transport = FakeTransport(outputs(), errors=[QUEUE_FULL] * 20)
    policy = RetryPolicy(attempts=3, initial_backoff_ms=0, max_backoff_ms=0)
    sends = []
    with DispatchClient(transport, retry=policy) as client:
        for _ in range(4):
            before = len(transport.request_ids)
            with pytest.raises(DispatchServerError):
                client.dispatch(window())
            sends.append(len(transport.request_ids) - before)
    # tokens 10 -> 7 (3 sends), -> 5 (the 2nd refusal leaves half: no retry), then 1 each
    assert sends == [3, 2, 1, 1]


def test_answers_give_a_throttled_client_its_retries_back() -> None:
    transport = FakeTransport(outputs(), errors=[QUEUE_FULL] * 5)
    policy = RetryPolicy(attempts=2, initial_backoff_ms=0, max_backoff_ms=0)
    client = DispatchClient(transport, retry=policy)
    for _ in range(3):  # 2 + 2 + 1 sends, all refused: 10 -> 5 tokens
        with pytest.raises(DispatchServerError):
            client.dispatch(window())
    assert not transport.errors
    assert not client.retry_throttle.allows_retry()
    for _ in range(20):  # answered at once: +0.1 each
        client.dispatch(window())
    assert client.retry_throttle.allows_retry()
    transport.errors = [QUEUE_FULL]
    client.dispatch(window())  # refused once, then answered on the retry
    assert len(transport.request_ids) == 5 + 20 + 2


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"attempts": 0}, "attempts"),
        ({"attempts": 11}, "attempts"),
        ({"attempts": 2.5}, "attempts"),
        ({"attempts": True}, "attempts"),
        ({"initial_backoff_ms": -1}, "initial_backoff_ms"),
        ({"max_backoff_ms": float("inf")}, "max_backoff_ms"),
        ({"budget_ms": float("nan")}, "budget_ms"),
        ({"initial_backoff_ms": 50, "max_backoff_ms": 10}, "max_backoff_ms"),
    ],
)
def test_a_bad_policy_is_refused_naming_its_field(settings: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        RetryPolicy(**settings)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": float("inf")}, "max_tokens"),
        ({"token_ratio": 0}, "token_ratio"),
        ({"token_ratio": float("nan")}, "token_ratio"),
    ],
)
def test_a_bad_throttle_is_refused_naming_its_field(settings: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        RetryThrottle(**settings)


def test_the_client_resends_a_refused_window_under_the_same_request_id() -> None:
    transport = FakeTransport(outputs(), errors=[QUEUE_FULL, QUEUE_FULL])
    policy = RetryPolicy(attempts=3, initial_backoff_ms=1, max_backoff_ms=2)
    with DispatchClient(transport, retry=policy) as client:
        result = client.dispatch(window(), request_id="req-7")
    assert result.request_id == "req-7"
    assert transport.request_ids == ["req-7"] * 3
    assert result.assignments() == {"o0": "ra", "o1": "rc", "o2": None}


def test_the_client_raises_the_last_refusal_with_its_id_and_attempts() -> None:
    transport = FakeTransport(outputs(), errors=[QUEUE_FULL] * 5)
    policy = RetryPolicy(attempts=2, initial_backoff_ms=1, max_backoff_ms=1)
    with pytest.raises(DispatchError) as info, DispatchClient(transport, retry=policy) as client:
        client.dispatch(window(), request_id="req-8")
    assert info.value is QUEUE_FULL
    assert info.value.request_id == "req-8" and info.value.attempts == 2
    assert len(transport.request_ids) == 2


def test_the_client_retries_by_default_and_not_with_no_retry() -> None:
    assert DispatchClient(FakeTransport(outputs())).retry is DEFAULT_RETRY
    assert DEFAULT_RETRY.attempts > 1
    transport = FakeTransport(outputs(), errors=[QUEUE_FULL])
    with pytest.raises(DispatchServerError), DispatchClient(transport, retry=NO_RETRY) as client:
        client.dispatch(window())
    assert len(transport.request_ids) == 1


def test_a_window_whose_instance_died_is_sent_again_once_only() -> None:
    """A window that itself kills the instance would kill one per send: two sends at most,
    whatever the policy allows for refusals."""
    clock = Clock()
    lost = DispatchServerError("Stub process 'dispatch_fused_0_0' is not healthy.", "500")
    sends: list[int] = []

    def send() -> str:
        sends.append(1)
        raise lost

    policy = RetryPolicy(attempts=5, rng=random.Random(3))
    with pytest.raises(DispatchServerError) as raised:
        policy.call(send, sleep=clock.sleep, clock=clock)
    assert len(sends) == 2 and raised.value.attempts == 2
    answers = iter([lost])

    def heals() -> str:
        for error in answers:
            raise error
        return "answer"

    assert policy.call(heals, sleep=clock.sleep, clock=clock) == "answer"
