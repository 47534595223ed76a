"""DispatchClient over an in-memory transport: request shape, result parsing, lifecycle."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from client_helpers import Array, FakeTransport, answer, outputs, window

from dispatch_client.client import (
    Candidate,
    DispatchClient,
    DispatchResult,
    OrderResult,
    parse_dispatch_outputs,
)
from dispatch_client.errors import DispatchConnectionError, DispatchServerError
from dispatch_client.transport import GrpcTransport, HttpTransport, Transport
from dispatch_contract import DISPATCH_ENSEMBLE_OUTPUTS, batched, pack_window

RIDERS = np.array([b"ra", b"rb", b"rc"], dtype=object)


def test_fake_satisfies_the_transport_protocol() -> None:
    transport: Transport = FakeTransport()  # mypy checks the structural match
    assert callable(transport.infer)


def test_dispatch_sends_the_window_and_asks_for_every_output() -> None:
    fake = FakeTransport(outputs())
    tensors = window()
    DispatchClient(fake).dispatch(tensors)

    [(model, inputs, names)] = fake.calls
    assert model == "dispatch"
    assert names == tuple(spec.name for spec in DISPATCH_ENSEMBLE_OUTPUTS)
    # contract v2: the window packed, one window per request (batch dimension 1)
    expected = batched(pack_window(tensors))
    assert list(inputs) == list(expected)
    for name, array in expected.items():
        assert inputs[name].dtype == array.dtype
        assert inputs[name].tolist() == array.tolist()
    assert inputs["ORDER_FIELDS"].shape == (1, 3, 7)


def test_results_skip_padding_and_mark_unassigned_orders() -> None:
    result = DispatchClient(FakeTransport(outputs())).dispatch(window())

    assert result == DispatchResult(
        orders=(
            OrderResult(
                order_id="o0",
                top_k=(
                    Candidate("rb", 0.9, 12.5, 0.95, 6.5),
                    Candidate("ra", 0.8, 14.0, 0.9, 7.0),
                    Candidate("rc", 0.1, 30.0, 0.2, 9.0),
                ),
                assigned_rider_id="ra",
                assigned_score=0.8,
                assigned_eta_minutes=14.0,
                assigned_ontime_probability=0.9,
                assigned_cost=7.0,
            ),
            OrderResult(
                order_id="o1",
                top_k=(Candidate("rc", 0.7, 20.0, 0.8, 8.25),),
                assigned_rider_id="rc",
                assigned_score=0.7,
                assigned_eta_minutes=20.0,
                assigned_ontime_probability=0.8,
                assigned_cost=8.25,
            ),
            OrderResult(order_id="o2", top_k=(), assigned_rider_id=None, assigned_score=None),
        )
    )
    assert result.assignments() == {"o0": "ra", "o1": "rc", "o2": None}


def test_padding_in_the_middle_is_skipped_too() -> None:
    out = answer()
    out["TOPK_RIDER_INDEX"][0] = [1, -1, 2]
    result = parse_dispatch_outputs(np.array([b"a", b"b", b"c"], dtype=object), out, RIDERS)
    assert [c.rider_id for c in result.orders[0].top_k] == ["rb", "rc"]


def test_to_json_dict_is_plain_json() -> None:
    result = DispatchClient(FakeTransport(outputs())).dispatch(window())
    data = json.loads(json.dumps(result.to_json_dict()))

    assert data["orders"][0] == {
        "order_id": "o0",
        "assigned_rider_id": "ra",
        "assigned_score": 0.8,
        "assigned_eta_minutes": 14.0,
        "assigned_ontime_probability": 0.9,
        "assigned_cost": 7.0,
        "top_k": [
            {
                "rider_id": "rb",
                "score": 0.9,
                "eta_minutes": 12.5,
                "ontime_probability": 0.95,
                "cost": 6.5,
            },
            {
                "rider_id": "ra",
                "score": 0.8,
                "eta_minutes": 14.0,
                "ontime_probability": 0.9,
                "cost": 7.0,
            },
            {
                "rider_id": "rc",
                "score": 0.1,
                "eta_minutes": 30.0,
                "ontime_probability": 0.2,
                "cost": 9.0,
            },
        ],
    }
    assert data["orders"][2] == {
        "order_id": "o2",
        "assigned_rider_id": None,
        "assigned_score": None,
        "assigned_eta_minutes": None,
        "assigned_ontime_probability": None,
        "assigned_cost": None,
        "top_k": [],
    }


def test_the_assigned_pair_s_figures_come_even_when_its_rider_is_off_the_list() -> None:
    out = answer()
    out["TOPK_RIDER_INDEX"][0] = [1, 2, -1]  # ra, assigned to o0, ranks below the list
    result = parse_dispatch_outputs(np.array([b"a", b"b", b"c"], dtype=object), out, RIDERS)
    first = result.orders[0]
    assert "ra" not in [c.rider_id for c in first.top_k]
    assert (first.assigned_rider_id, first.assigned_eta_minutes, first.assigned_cost) == (
        "ra",
        14.0,
        7.0,
    )
    del out["ASSIGNED_OBJECTIVES"]  # an answer without them (an older server): None
    older = parse_dispatch_outputs(np.array([b"a", b"b", b"c"], dtype=object), out, RIDERS)
    assert older.orders[0].assigned_eta_minutes is None


def test_model_name_is_configurable_and_none_tensors_are_dropped() -> None:
    fake = FakeTransport(outputs())
    tensors: dict[str, Any] = dict(window())
    tensors["OBJECTIVE_WEIGHTS"] = None
    DispatchClient(fake, model_name="dispatch_canary").dispatch(tensors)

    [(model, inputs, _)] = fake.calls
    assert model == "dispatch_canary"
    assert "OBJECTIVE_WEIGHTS" not in inputs


def test_unknown_tensor_and_missing_order_ids_fail_before_sending() -> None:
    fake = FakeTransport(outputs())
    client = DispatchClient(fake)
    tensors: dict[str, Any] = dict(window())
    with pytest.raises(ValueError, match=r"unknown window tensor.*OBJECTIVE_WEIGHT"):
        client.dispatch({**tensors, "OBJECTIVE_WEIGHT": np.ones(3, np.float32)})
    del tensors["ORDER_IDS"]
    with pytest.raises(ValueError, match="lack ORDER_IDS"):
        client.dispatch(tensors)
    assert fake.calls == []


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("TOPK_OBJECTIVES", None, "malformed response: output TOPK_OBJECTIVES is missing"),
        (
            "TOPK_OBJECTIVES",
            np.zeros((1, 3, 2, 4), np.float32),
            "malformed response: TOPK_OBJECTIVES has shape (3, 2, 4), expected (3, 3, 4)",
        ),
        (
            "ASSIGNED_SCORE",
            np.zeros((1, 2), np.float32),
            "malformed response: ASSIGNED_SCORE has shape (2,), expected (3,)",
        ),
        (
            "ASSIGNED_OBJECTIVES",
            np.zeros((1, 3, 4), np.float32),
            "malformed response: ASSIGNED_OBJECTIVES has shape (3, 4), expected (3, 3)",
        ),
        (
            "TOPK_RIDER_INDEX",
            np.array([[[3, 0, 2], [2, -1, -1], [-1, -1, -1]]], np.int32),
            "malformed response: a rider index is not below the window's 3 riders",
        ),
        (
            "ASSIGNED_RIDER_INDEX",
            np.zeros((2, 3), np.int32),
            "malformed response: ASSIGNED_RIDER_INDEX has shape (2, 3), expected a batch of 1",
        ),
    ],
)
def test_response_against_the_contract_is_a_server_error(
    name: str, value: Array | None, message: str
) -> None:
    out = outputs()
    if value is None:
        del out[name]
    else:
        out[name] = value
    with pytest.raises(DispatchServerError) as info:
        DispatchClient(FakeTransport(out)).dispatch(window())
    assert info.value.message == message


@pytest.mark.parametrize(
    "error",
    [
        DispatchServerError("ORDER_PICKUP: latitude must be within [-90, 90]", "400"),
        DispatchConnectionError("cannot reach localhost:8000 over HTTP: Connection refused"),
    ],
)
def test_transport_errors_reach_the_caller_and_the_context_closes(error: Exception) -> None:
    fake = FakeTransport(error=error)
    with pytest.raises(type(error)) as info, DispatchClient(fake) as client:
        client.dispatch(window())
    assert info.value is error
    assert fake.closed


def test_context_manager_closes_the_transport() -> None:
    fake = FakeTransport(outputs())
    with DispatchClient(fake) as client:
        client.dispatch(window())
        assert not fake.closed
    assert fake.closed


def test_server_error_keeps_one_line_and_status() -> None:
    error = DispatchServerError("in ensemble 'dispatch':\n  ORDER_IDS: ids must be unique\n", "400")
    assert error.message == "in ensemble 'dispatch': ORDER_IDS: ids must be unique"
    assert str(error) == error.message
    assert error.status == "400"


def test_factories_build_transports_without_connecting() -> None:
    # tritonclient connects lazily, so nothing listens on these ports and nothing fails.
    with DispatchClient.http("localhost:1", timeout_s=5, model_name="m") as client:
        assert isinstance(client.transport, HttpTransport)
        assert client.transport.url == "localhost:1"
        assert client.model_name == "m"
    with DispatchClient.grpc("localhost:2", timeout_s=5) as client:
        assert isinstance(client.transport, GrpcTransport)
        assert client.transport.timeout_s == 5
        assert client.model_name == "dispatch"


def test_package_exports_the_public_api() -> None:
    import dispatch_client

    assert sorted(dispatch_client.__all__) == sorted(
        [
            "DEFAULT_MODEL_NAME",
            "Candidate",
            "DispatchClient",
            "DispatchConnectionError",
            "DispatchError",
            "DispatchResult",
            "DispatchServerError",
            "GrpcTransport",
            "HttpTransport",
            "NO_RETRY",
            "OrderResult",
            "PriorityMap",
            "ProtocolName",
            "RetryPolicy",
            "Transport",
            "WindowJSONError",
            "make_transport",
            "parse_dispatch_outputs",
            "window_from_dict",
            "window_from_json",
            "window_to_dict",
            "window_to_json",
        ]
    )
    for name in dispatch_client.__all__:
        assert hasattr(dispatch_client, name), name


def test_routing_outputs_label_each_order_with_its_version_and_level() -> None:
    out = outputs()
    out["ORDER_MODEL_VERSION"] = np.array([[2, 1, 0]], dtype=np.int32)
    out["ORDER_FALLBACK_LEVEL"] = np.array([[0, 1, 2]], dtype=np.int32)
    result = DispatchClient(FakeTransport(out)).dispatch(window())
    assert [(o.model_version, o.fallback_level) for o in result.orders] == [
        (2, 0),
        (1, 1),
        (0, 2),
    ]
    assert result.to_json_dict()["orders"][1]["model_version"] == 1
    assert result.to_json_dict()["orders"][2]["fallback_level"] == 2
    out["ORDER_FALLBACK_LEVEL"] = np.array([[0, 1]], dtype=np.int32)
    with pytest.raises(DispatchServerError, match="ORDER_FALLBACK_LEVEL"):
        DispatchClient(FakeTransport(out)).dispatch(window())


def test_location_sources_say_per_order_how_each_end_was_found() -> None:
    out = outputs()
    out["ORDER_LOCATION_SOURCE"] = np.array([[[0, 0], [3, 2], [1, 0]]], dtype=np.int32)
    result = DispatchClient(FakeTransport(out)).dispatch(window())
    assert [(o.pickup_source, o.dropoff_source) for o in result.orders] == [
        ("coordinates", "coordinates"),
        ("gazetteer", "geocoder"),
        ("cache", "coordinates"),
    ]
    assert result.to_json_dict()["orders"][1]["pickup_source"] == "gazetteer"
    out["ORDER_LOCATION_SOURCE"] = np.array([[[0, 0], [7, 0], [0, 0]]], dtype=np.int32)
    with pytest.raises(DispatchServerError, match="ORDER_LOCATION_SOURCE"):
        DispatchClient(FakeTransport(out)).dispatch(window())
    # an answer without it (the feature-level entry point) carries no source
    assert (
        "pickup_source"
        not in DispatchClient(FakeTransport(outputs()))
        .dispatch(window())
        .to_json_dict()["orders"][0]
    )


def test_the_city_that_served_the_window_is_on_the_result_and_first_in_the_json() -> None:
    out = outputs()
    out["WINDOW_CITY"] = np.array([[b"beijing"]], dtype=object)
    result = DispatchClient(FakeTransport(out)).dispatch(window())
    assert result.city == "beijing"
    assert list(result.to_json_dict()) == ["city", "orders"]
    assert result.to_json_dict()["city"] == "beijing"
    # the HTTP JSON form carries BYTES as text
    out["WINDOW_CITY"] = np.array([["chengdu"]], dtype=object)
    assert DispatchClient(FakeTransport(out)).dispatch(window()).city == "chengdu"
    out["WINDOW_CITY"] = np.array([[b"beijing", b"shanghai"]], dtype=object)
    with pytest.raises(DispatchServerError) as info:
        DispatchClient(FakeTransport(out)).dispatch(window())
    expected = "malformed response: WINDOW_CITY has shape (2,), expected (1,)"
    assert info.value.message == expected
    # an answer without it (the feature-level entry point encodes no window) names no city
    plain = DispatchClient(FakeTransport(outputs())).dispatch(window())
    assert plain.city is None and "city" not in plain.to_json_dict()


def test_the_version_tag_is_a_known_input() -> None:
    fake = FakeTransport(outputs())
    tensors: dict[str, Any] = dict(window())
    tensors["MODEL_VERSION_TAG"] = np.array([b"canary"], dtype=object)
    DispatchClient(fake).dispatch(tensors)
    [(_, inputs, _)] = fake.calls
    assert inputs["MODEL_VERSION_TAG"].tolist() == [[b"canary"]]


def test_the_request_id_rides_on_the_request_the_result_and_the_error() -> None:
    transport = FakeTransport(outputs={})
    client = DispatchClient(transport)
    with pytest.raises(DispatchServerError) as info:
        client.dispatch(window(), request_id="caller-1")  # no outputs: a malformed answer
    assert transport.request_ids == ["caller-1"]
    assert info.value.request_id == "caller-1"
    transport.error = DispatchConnectionError("cannot reach h:1")
    with pytest.raises(DispatchConnectionError) as refused:
        client.dispatch(window())
    fresh = transport.request_ids[-1]
    assert len(fresh) == 32 and refused.value.request_id == fresh
    # A success carries its id on the result (not in its JSON: that is the server's answer).
    transport.error = None
    transport.outputs = outputs()
    result = client.dispatch(window(), request_id="caller-2")
    assert result.request_id == "caller-2" and "request_id" not in result.to_json_dict()
