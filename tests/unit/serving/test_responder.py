"""Behaviour of dispatch_service.serving.responder (through the generic step adapter) over a
stand-in for Triton's `pb_utils`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pytest
from numpy.typing import NDArray

from adapter_helpers import EchoStep, echo_request, json_lines, logical_window, window_request
from dispatch_contract import (
    ENCODER_OUTPUTS,
    NUM_PAIR_FEATURES,
)
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.pipeline.step_metrics import (
    STEP_OBSERVERS,
)
from dispatch_service.pipeline.steps import FeatureEncoderStep
from dispatch_service.serving.responder import BACK_TO_BACK_S
from dispatch_service.serving.step_adapters import (
    TritonStepAdapter,
)
from pb_stand_in import (
    FakePbUtils,
    FakeRequest,
    FakeTritonError,
)

LOG_FIELDS = {"event", "model", "request_id", "tensor", "rule", "code"}


# ---- TritonStepAdapter ---------------------------------------------------------------


def test_one_response_per_request_in_order() -> None:
    pb = FakePbUtils()
    adapter = TritonStepAdapter(pb, "echo", EchoStep())
    responses = adapter.execute([echo_request(v) for v in (1, 5, 9)])
    assert [r.outputs()["Y"][0].tolist() for r in responses] == [[2, 4], [10, 12], [18, 20]]
    assert all(r.outputs()["N"][0].tolist() == [2] for r in responses)
    assert pb.Logger.lines == []


def test_no_requests_no_responses() -> None:
    assert TritonStepAdapter(FakePbUtils(), "echo", EchoStep()).execute([]) == []


def test_bad_input_fails_only_its_own_request() -> None:
    pb = FakePbUtils()
    responses = TritonStepAdapter(pb, "echo", EchoStep()).execute(
        [echo_request(1), echo_request(-3, "bad"), echo_request(2)]
    )
    assert responses[0].outputs()["Y"][0].tolist() == [2, 4]
    assert responses[2].outputs()["Y"][0].tolist() == [4, 6]
    error = responses[1].error()
    assert error.code() == FakeTritonError.INVALID_ARG
    assert error.message() == "X: must be >= 0 (row 0)"


def test_a_bad_window_is_answered_with_invalid_arg_naming_the_tensor() -> None:
    pb = FakePbUtils()
    adapter = TritonStepAdapter(pb, "feature_encoder", FeatureEncoderStep())
    good = window_request(1, "a")
    pickup = np.array(logical_window(1)["ORDER_PICKUP"], copy=True)
    pickup[2, 0] = 95.0
    responses = adapter.execute(
        [good, window_request(1, "b", ORDER_PICKUP=pickup), window_request(2, "c")]
    )
    assert len(responses) == 3
    for ok in (responses[0], responses[2]):
        outputs = ok.outputs()
        assert set(outputs) == {spec.name for spec in ENCODER_OUTPUTS}
        assert outputs["PAIR_FEATURES"].shape[-1] == NUM_PAIR_FEATURES
    error = responses[1].error()
    assert error.code() == FakeTritonError.INVALID_ARG
    assert error.message().startswith(
        "ORDER_FIELDS[pickup_lat, pickup_lon]: latitude must be within"
    )
    assert "(row 2)" in error.message()


def test_a_missing_tensor_is_answered_with_invalid_arg() -> None:
    pb = FakePbUtils()
    request = window_request(1)
    del request.tensors["RIDER_FIELDS"]
    (response,) = TritonStepAdapter(pb, "feature_encoder", FeatureEncoderStep()).execute([request])
    assert response.error().code() == FakeTritonError.INVALID_ARG
    assert response.error().message() == "RIDER_FIELDS: is required but missing"


def test_the_optional_input_is_passed_as_none_when_absent() -> None:
    seen: list[Mapping[str, NDArray[Any] | None]] = []

    class Recorder:
        input_names: ClassVar[tuple[str, ...]] = ("A", "B")

        def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> dict[str, NDArray[Any]]:
            seen.append(inputs)
            return {}

    TritonStepAdapter(FakePbUtils(), "m", Recorder()).execute([FakeRequest({"A": np.zeros(1)})])
    assert set(seen[0]) == {"A", "B"}
    assert seen[0]["B"] is None


def test_an_unexpected_exception_is_internal_and_names_the_model() -> None:
    pb = FakePbUtils()
    responses = TritonStepAdapter(pb, "topk_resolver", EchoStep()).execute(
        [echo_request(1), echo_request(13, "req-13"), echo_request(3)]
    )
    assert responses[0].outputs()["Y"][0].tolist() == [2, 4]
    assert responses[2].outputs()["Y"][0].tolist() == [6, 8]
    error = responses[1].error()
    assert error.code() == FakeTritonError.INTERNAL
    assert error.message() == "topk_resolver: internal error (RuntimeError: unlucky number)"
    (logged,) = json_lines(pb, "error")
    assert logged["event"] == "request_failed"
    assert logged["model"] == "topk_resolver"
    assert logged["request_id"] == "req-13"
    assert "RuntimeError: unlucky number" in logged["error"]
    assert json_lines(pb, "warn") == []


def test_a_request_whose_inputs_cannot_be_read_fails_alone() -> None:
    # Not a rule the window broke: reading the request itself failed. That request gets an
    # internal error (its own traceback logged); the others of the execute are answered.
    class Unreadable(FakeRequest):
        def inputs(self) -> list[Any]:
            raise RuntimeError("tensor handle gone")

    pb = FakePbUtils()
    responses = TritonStepAdapter(pb, "echo", EchoStep()).execute(
        [echo_request(1), Unreadable({}, "lost"), echo_request(2)]
    )
    assert responses[0].outputs()["Y"][0].tolist() == [2, 4]
    assert responses[2].outputs()["Y"][0].tolist() == [4, 6]
    error = responses[1].error()
    assert error.code() == FakeTritonError.INTERNAL
    assert error.message() == "echo: internal error (RuntimeError: tensor handle gone)"
    (logged,) = json_lines(pb, "error")
    assert logged["request_id"] == "lost" and "tensor handle gone" in logged["trace"]


def test_a_cancelled_request_is_answered_cancelled_unworked_and_the_others_served() -> None:
    # Triton 2.51's dynamic batcher hands requests whose client already gave up to execute
    #: each is answered CANCELLED at once, never run, never logged as an error.
    pb = FakePbUtils()
    step = EchoStep()
    gone = FakeRequest({"X": np.array([[7, 8]])}, "gone", cancelled=True)
    requests = [echo_request(1), gone, echo_request(2)]
    responses = TritonStepAdapter(pb, "echo", step).execute(requests)
    assert responses[0].outputs()["Y"][0].tolist() == [2, 4]
    assert responses[2].outputs()["Y"][0].tolist() == [4, 6]
    error = responses[1].error()
    assert error.code() == FakeTritonError.CANCELLED
    assert "cancelled" in error.message()
    assert step.calls == 2
    assert all(r.cancel_asks == 1 for r in requests)
    assert pb.Logger.lines == []


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_only_a_batch_that_may_have_queued_is_asked_about_cancellation() -> None:
    """Each ask is a round trip to the server: a batch reaching an idle instance (no queue
    delay) is served unasked; one taken back to back with the previous answers is asked."""
    adapter = TritonStepAdapter(FakePbUtils(), "echo", EchoStep())
    clock = Clock()
    adapter.clock = clock
    first = [echo_request(1)]
    adapter.execute(first)  # an instance's first batch may have queued during its load
    assert first[0].cancel_asks == 1
    clock.now += 1.0  # idle for a second: the next batch was dispatched as it came
    idle = [echo_request(1), FakeRequest({"X": np.array([[7, 8]])}, "gone", cancelled=True)]
    responses = adapter.execute(idle)
    assert [r.cancel_asks for r in idle] == [0, 0]
    assert responses[1].outputs()["Y"][0].tolist() == [14, 16]  # served, as before the ask
    clock.now += BACK_TO_BACK_S / 2  # straight on: these queued while the instance worked
    busy = [echo_request(1), FakeRequest({"X": np.array([[7, 8]])}, "gone", cancelled=True)]
    responses = adapter.execute(busy)
    assert [r.cancel_asks for r in busy] == [1, 1]
    assert responses[1].error().code() == FakeTritonError.CANCELLED


def test_a_batch_begun_while_another_is_in_flight_is_asked() -> None:
    """An async `execute` (the router) may overlap another: the instance is busy then."""
    adapter = TritonStepAdapter(FakePbUtils(), "echo", EchoStep())
    clock = Clock()
    adapter.clock = clock
    adapter.execute([echo_request(1)])
    clock.now += 1.0
    adapter.read_batch([echo_request(1)], ("X",))  # its answers not yet given
    second = [echo_request(2)]
    adapter.read_batch(second, ("X",))
    assert second[0].cancel_asks == 1


def test_a_failed_cancellation_ask_serves_the_request() -> None:
    class Unaskable(FakeRequest):
        def is_cancelled(self) -> bool:
            raise RuntimeError("stub lost the server")

    pb = FakePbUtils()
    (response,) = TritonStepAdapter(pb, "echo", EchoStep()).execute(
        [Unaskable({"X": np.array([[1, 2]])})]
    )
    assert response.outputs()["Y"][0].tolist() == [2, 4]


def test_each_request_is_run_once_in_order() -> None:
    pb = FakePbUtils()
    step = EchoStep()
    responses = TritonStepAdapter(pb, "echo", step).execute(
        [echo_request(1), echo_request(2), echo_request(3)]
    )
    assert [r.outputs()["Y"][0].tolist() for r in responses] == [[2, 4], [4, 6], [6, 8]]
    assert step.calls == 3


def test_a_rejection_logs_one_json_line_without_payload() -> None:
    pb = FakePbUtils()
    secret_order = b"order-SECRET-4711"
    pickup = np.array(logical_window(1)["ORDER_PICKUP"], copy=True)
    pickup[3] = [123.4567891, 121.4737]
    request = window_request(
        1,
        "req-42",
        ORDER_PICKUP=pickup,
        ORDER_IDS=np.array([secret_order, b"o2", b"o3", b"o4"], dtype=object),
    )
    (response,) = TritonStepAdapter(pb, "feature_encoder", FeatureEncoderStep()).execute([request])
    assert response.error().code() == FakeTritonError.INVALID_ARG

    assert len(pb.Logger.lines) == 1
    level, line = pb.Logger.lines[0]
    assert level == "warn"
    assert "\n" not in line
    logged = json.loads(line)
    assert set(logged) == LOG_FIELDS
    assert logged == {
        "event": "request_rejected",
        "model": "feature_encoder",
        "request_id": "req-42",
        "tensor": "ORDER_FIELDS[pickup_lat, pickup_lon]",
        "rule": "latitude must be within [-90.0, 90.0] (row 3)",
        "code": "range",
    }
    for payload in ("SECRET", "123.45", "121.47", "o2"):
        assert payload not in line


def _rider_column(value: int) -> NDArray[np.int32]:
    column = np.zeros(10, dtype=np.int32)
    column[2] = value
    return column


REJECTIONS_WITH_PAYLOAD: dict[str, tuple[NDArray[Any], str]] = {
    "RIDER_LOAD": (_rider_column(-7777), "7777"),
    "RIDER_CAPACITY": (_rider_column(-6666), "6666"),
    "RIDER_EQUIPMENT": (_rider_column(-5555), "5555"),
    "RIDER_VEHICLE": (_rider_column(4444), "4444"),
    "ORDER_CREATED_AT": (np.array([1, 2, -3333, 4], dtype=np.int64), "3333"),
    "ORDER_CONSTRAINTS": (np.array([0, 2222, 0, 0], dtype=np.int32), "2222"),
    "ORDER_PROMISED_MINUTES": (np.array([30, 999.25, 30, 30], dtype=np.float32), "999"),
}
# Where each field travels in contract v2 (errors name the column).
WIRE_NAMES = {
    "RIDER_LOAD": "RIDER_FIELDS[load]",
    "RIDER_CAPACITY": "RIDER_FIELDS[capacity]",
    "RIDER_EQUIPMENT": "RIDER_FIELDS[equipment]",
    "RIDER_VEHICLE": "RIDER_FIELDS[vehicle]",
    "ORDER_CREATED_AT": "ORDER_FIELDS[created_at]",
    "ORDER_CONSTRAINTS": "ORDER_FIELDS[constraints]",
    "ORDER_PROMISED_MINUTES": "ORDER_FIELDS[promised_minutes]",
}


@pytest.mark.parametrize("tensor", sorted(REJECTIONS_WITH_PAYLOAD))
def test_rejection_logs_never_echo_request_values(tensor: str) -> None:
    pb = FakePbUtils()
    value, payload = REJECTIONS_WITH_PAYLOAD[tensor]
    request = window_request(1, "req-7", **{tensor: value})
    (response,) = TritonStepAdapter(pb, "feature_encoder", FeatureEncoderStep()).execute([request])
    assert response.error().code() == FakeTritonError.INVALID_ARG
    assert response.error().message().startswith(f"{WIRE_NAMES[tensor]}: ")
    ((_, line),) = pb.Logger.lines
    assert json.loads(line)["tensor"] == WIRE_NAMES[tensor]
    assert payload not in line


def test_a_bad_datum_code_is_refused_without_echoing_it() -> None:
    pb = FakePbUtils()
    wire = {"WINDOW_FIELDS": np.array([1_764_400_000.0, 7777.0])}
    request = window_request(1, "req-8", wire=wire)
    (response,) = TritonStepAdapter(pb, "feature_encoder", FeatureEncoderStep()).execute([request])
    message = response.error().message()
    assert message.startswith("WINDOW_FIELDS[coord_system]: must be one of 0 (WGS84)")
    ((_, line),) = pb.Logger.lines
    assert "7777" not in line and "7777" not in message


def test_a_request_without_the_batch_dimension_is_refused_naming_the_shape() -> None:
    pb = FakePbUtils()
    request = window_request(1)
    request.tensors["ORDER_FIELDS"] = request.tensors["ORDER_FIELDS"][0]
    (response,) = TritonStepAdapter(pb, "feature_encoder", FeatureEncoderStep()).execute([request])
    message = response.error().message()
    assert message.startswith("ORDER_FIELDS: must have a batch dimension of 1")
    assert "shape [1, *, 7], got [4, 7]" in message


class BrokenMetrics:
    def record(self, observations: object) -> None:
        raise RuntimeError("metrics IPC failed")


def test_a_metrics_failure_never_fails_a_request() -> None:
    pb = FakePbUtils()
    adapter = TritonStepAdapter(
        pb,
        "feature_encoder",
        FeatureEncoderStep(),
        metrics=BrokenMetrics(),
        observer=STEP_OBSERVERS["feature_encoder"],
    )
    responses = adapter.execute([window_request(1), window_request(2)])
    assert all(not r.has_error() for r in responses)
    (logged,) = json_lines(pb, "error")  # logged once, not per request
    assert logged["event"] == "metrics_failed"
    assert "metrics IPC failed" in logged["error"]


# ---- what client text reaches the log --------------------------------------------------


class AddressStep:
    """Refuses every window as the geocoding chain does an unknown address: the message to
    the client quotes the address."""

    input_names: ClassVar[tuple[str, ...]] = ("X",)

    def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> dict[str, NDArray[Any]]:
        raise DispatchInputError(
            "ORDER_PICKUP_ADDRESS",
            "row 0: address 'No. 7 Secret Lane' must name a district, road or place",
            "unknown_value",
        )


def test_a_megabyte_request_id_costs_a_few_hundred_bytes_of_log() -> None:
    pb = FakePbUtils()
    huge = "r\n" * (1 << 19)  # 1 MiB, newlines included
    (response,) = TritonStepAdapter(pb, "echo", EchoStep()).execute([echo_request(-1, huge)])
    assert response.error().code() == FakeTritonError.INVALID_ARG
    ((level, line),) = pb.Logger.lines
    assert level == "warn" and len(line.encode()) < 400 and "\n" not in line
    logged = json.loads(line)["request_id"]
    assert logged.startswith("r\\nr\\n") and logged.endswith(f"...[{1 << 20} chars]")


def test_an_address_the_client_sent_reaches_the_client_but_not_the_log() -> None:
    pb = FakePbUtils()
    (response,) = TritonStepAdapter(pb, "feature_encoder", AddressStep()).execute(
        [echo_request(1, "req-7")]
    )
    assert "No. 7 Secret Lane" in response.error().message()
    ((_, line),) = pb.Logger.lines
    assert "Secret" not in line
    assert json.loads(line)["rule"] == "row 0: address '...' must name a district, road or place"


def test_an_internal_error_logs_no_quoted_value_and_a_capped_message() -> None:
    class Leaky(EchoStep):
        def run(self, inputs: Mapping[str, NDArray[Any] | None]) -> dict[str, NDArray[Any]]:
            x = inputs["X"]
            assert x is not None
            raise KeyError(f"user-{int(x.sum()) * 10_000} at {where!r}" + "!" * 10_000)

    where = "Secret Lane"

    pb = FakePbUtils()
    TritonStepAdapter(pb, "echo", Leaky()).execute([echo_request(1, "req-1")])
    ((level, line),) = pb.Logger.lines  # the payload: user 30000 at Secret Lane
    assert level == "error" and "30000" not in line and "Secret" not in line
    assert len(line) < 2048 + 1024
    assert json.loads(line)["error"].startswith("KeyError: '...'")


def test_rejection_lines_are_rate_limited_with_a_count_of_those_dropped() -> None:
    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    from dispatch_service.core.log_text import LogRateLimit

    pb = FakePbUtils()
    adapter = TritonStepAdapter(pb, "echo", EchoStep())
    clock = Clock()
    adapter.request_lines = LogRateLimit(per_s=1.0, burst=5, clock=clock)
    responses = adapter.execute([echo_request(-1, f"r{i}") for i in range(1000)])
    assert all(r.error().code() == FakeTritonError.INVALID_ARG for r in responses)
    assert len(pb.Logger.lines) == 5  # every request refused, five lines
    clock.now += 1.0
    adapter.execute([echo_request(-1, "later")])
    dropped, later = (json.loads(line) for _, line in pb.Logger.lines[5:])
    assert dropped == {"event": "log_lines_dropped", "model": "echo", "lines": 995}
    assert later["request_id"] == "later"
