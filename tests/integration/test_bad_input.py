"""Bad input gets an error naming the tensor and the rule; the next good request is served."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from dispatch_contract import DISPATCH_ENSEMBLE_INPUTS, MAX_ORDERS, MAX_RIDERS, NUM_PAIR_FEATURES
from dispatch_service.domain.window import MAX_RIDER_LOAD, window_to_tensors
from dispatch_service.offline.simulator import generate_window
from dispatch_service.routing.settings import FUSED_MODEL_NAME
from triton_helpers import infer_grpc, infer_http, sim_window

Arrays = dict[str, np.ndarray[Any, Any]]
Mutation = Callable[[Arrays], None]


def _set(name: str, value: Any) -> Mutation:
    def mutate(w: Arrays) -> None:
        w[name] = value(w) if callable(value) else value

    return mutate


def _drop(name: str) -> Mutation:
    def mutate(w: Arrays) -> None:
        del w[name]

    return mutate


def _cell(name: str, index: tuple[int, ...], value: Any) -> Mutation:
    def mutate(w: Arrays) -> None:
        array = w[name].copy()
        array[index] = value
        w[name] = array

    return mutate


def _ids(n: int, prefix: str) -> np.ndarray[Any, Any]:
    return np.array([f"{prefix}{i}".encode() for i in range(n)], dtype=object)


def _orders(n: int) -> Mutation:
    """A window with n orders (all order tensors resized consistently)."""

    def mutate(w: Arrays) -> None:
        take = np.arange(n) % len(w["ORDER_IDS"])
        for name in ("ORDER_IDS", "ORDER_TEXT", "ORDER_FIELDS"):
            w[name] = w[name][take]
        w["ORDER_IDS"] = _ids(n, "o")

    return mutate


def _riders(n: int) -> Mutation:
    def mutate(w: Arrays) -> None:
        take = np.arange(n) % len(w["RIDER_IDS"])
        for name in ("RIDER_IDS", "RIDER_FIELDS"):
            w[name] = w[name][take]
        w["RIDER_IDS"] = _ids(n, "r")

    return mutate


# Columns of the packed matrices (dispatch_contract ORDER_/RIDER_/WINDOW_FIELD_COLUMNS).
PICKUP_LAT, DROPOFF_LAT, CREATED_AT, PROMISED, CONSTRAINTS = 0, 2, 4, 5, 6
RIDER_LON, LOAD, CAPACITY, VEHICLE = 1, 2, 3, 4
PICKUP = "ORDER_FIELDS[pickup_lat, pickup_lon]"
DROPOFF = "ORDER_FIELDS[dropoff_lat, dropoff_lon]"
POSITION = "RIDER_FIELDS[lat, lon]"

# A rider's load or capacity: one rule, the bound and the offending row in the message.
RIDER_COUNT = (f"must be within [0, {MAX_RIDER_LOAD}]", "(row 4)")

# (case id, mutation of the v2 wire tensors of one window, words the error must contain)
CASES: list[tuple[str, Mutation, tuple[str, ...]]] = [
    ("missing tensor", _drop("RIDER_FIELDS"), ("RIDER_FIELDS",)),
    (
        "wrong dtype",
        _set("ORDER_FIELDS", lambda w: w["ORDER_FIELDS"].astype(np.float32)),
        ("ORDER_FIELDS", "FP"),
    ),
    (
        "wrong width",
        _set("ORDER_FIELDS", lambda w: w["ORDER_FIELDS"][:, :6].copy()),
        ("ORDER_FIELDS", "7"),
    ),
    (
        "row count mismatch",
        _set("ORDER_FIELDS", lambda w: w["ORDER_FIELDS"][:-1].copy()),
        ("ORDER_FIELDS", "rows"),
    ),
    ("zero orders", _orders(0), ("ORDER_IDS", "between 1 and")),
    ("too many orders", _orders(MAX_ORDERS + 1), ("ORDER_IDS", f"{MAX_ORDERS}")),
    ("zero riders", _riders(0), ("RIDER_IDS", "between 1 and")),
    ("too many riders", _riders(MAX_RIDERS + 1), ("RIDER_IDS", f"{MAX_RIDERS}")),
    ("NaN coordinate", _cell("ORDER_FIELDS", (3, PICKUP_LAT), np.nan), (PICKUP, "finite")),
    ("infinite coordinate", _cell("RIDER_FIELDS", (1, RIDER_LON), np.inf), (POSITION, "finite")),
    (
        "NaN promise",
        _cell("ORDER_FIELDS", (0, PROMISED), np.nan),
        ("ORDER_FIELDS[promised_minutes]", "finite"),
    ),
    ("latitude out of range", _cell("ORDER_FIELDS", (2, DROPOFF_LAT), 91.0), (DROPOFF, "latitude")),
    (
        "longitude out of range",
        _cell("RIDER_FIELDS", (0, RIDER_LON), -181.0),
        (POSITION, "longitude"),
    ),
    (
        "unknown coordinate system",
        _cell("WINDOW_FIELDS", (1,), 7.0),
        ("WINDOW_FIELDS[coord_system]", "must be one of"),
    ),
    (
        "fraction in an integer column",
        _cell("RIDER_FIELDS", (4, CAPACITY), 2.5),
        ("RIDER_FIELDS[capacity]", "whole number"),
    ),
    (
        "negative capacity",
        _cell("RIDER_FIELDS", (4, CAPACITY), -1),
        ("RIDER_FIELDS[capacity]", *RIDER_COUNT),
    ),
    ("negative load", _cell("RIDER_FIELDS", (4, LOAD), -2), ("RIDER_FIELDS[load]", *RIDER_COUNT)),
    (
        "load above the bound",
        _cell("RIDER_FIELDS", (4, LOAD), MAX_RIDER_LOAD + 1),
        ("RIDER_FIELDS[load]", *RIDER_COUNT),
    ),
    ("empty order id", _cell("ORDER_IDS", (0,), b""), ("ORDER_IDS", "empty")),
    ("over-long rider id", _cell("RIDER_IDS", (0,), b"r" * 65), ("RIDER_IDS", "64 bytes")),
    (
        "duplicate rider id",
        _set(
            "RIDER_IDS", lambda w: np.array([w["RIDER_IDS"][0], *w["RIDER_IDS"][:-1]], dtype=object)
        ),
        ("RIDER_IDS", "unique"),
    ),
    (
        "unknown constraint bit",
        _cell("ORDER_FIELDS", (0, CONSTRAINTS), 64),
        ("ORDER_FIELDS[constraints]", "bits"),
    ),
    ("unknown vehicle", _cell("RIDER_FIELDS", (0, VEHICLE), 7), ("RIDER_FIELDS[vehicle]",)),
    (
        "zero promise",
        _cell("ORDER_FIELDS", (0, PROMISED), 0.0),
        ("ORDER_FIELDS[promised_minutes]",),
    ),
    (
        "negative weights",
        _set("OBJECTIVE_WEIGHTS", np.array([-1.0, 1.0, 1.0], dtype=np.float32)),
        ("OBJECTIVE_WEIGHTS", ">= 0"),
    ),
    (
        "NaN weights",
        _set("OBJECTIVE_WEIGHTS", np.array([np.nan, 1.0, 1.0], dtype=np.float32)),
        ("OBJECTIVE_WEIGHTS", "finite"),
    ),
    (
        "created far after dispatch time",
        _set(
            "ORDER_FIELDS",
            lambda w: w["ORDER_FIELDS"] + np.eye(1, 7, CREATED_AT) * 10_000,
        ),
        ("ORDER_FIELDS[created_at]",),
    ),
]


@pytest.fixture(scope="module")
def good() -> Arrays:
    return sim_window(seed=77, orders=12, riders=40)


@pytest.fixture(scope="module")
def good_answer(good: Arrays, http_client: httpclient.InferenceServerClient) -> Arrays:
    return infer_http(http_client, good)


def _bad(good: Arrays, mutate: Mutation) -> Arrays:
    window = {name: array.copy() for name, array in good.items()}
    mutate(window)
    return window


@pytest.mark.parametrize("model", ["dispatch", FUSED_MODEL_NAME])
@pytest.mark.parametrize(("case", "mutate", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_window_is_rejected_with_a_clear_error_over_http(
    case: str,
    mutate: Mutation,
    words: tuple[str, ...],
    model: str,
    good: Arrays,
    good_answer: Arrays,
    http_client: httpclient.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as info:
        infer_http(http_client, _bad(good, mutate), model=model)
    message = info.value.message()
    for word in words:
        assert word in message, f"{case}: {message!r} lacks {word!r}"
    assert http_client.is_server_live() and http_client.is_model_ready(model)
    again = infer_http(http_client, good, model=model)
    for name, expected in good_answer.items():
        np.testing.assert_array_equal(again[name], expected, err_msg=name)


@pytest.mark.parametrize(
    ("case", "mutate", "words"),
    [c for c in CASES if c[0] in {"NaN coordinate", "unknown coordinate system", "wrong dtype"}],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_window_is_rejected_over_grpc_too(
    case: str,
    mutate: Mutation,
    words: tuple[str, ...],
    good: Arrays,
    good_answer: Arrays,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    with pytest.raises(InferenceServerException) as info:
        infer_grpc(grpc_client, _bad(good, mutate))
    for word in words:
        assert word in info.value.message()
    again = infer_grpc(grpc_client, good)
    np.testing.assert_array_equal(
        again["ASSIGNED_RIDER_INDEX"], good_answer["ASSIGNED_RIDER_INDEX"]
    )


REQUIRED = [spec.name for spec in DISPATCH_ENSEMBLE_INPUTS if not spec.optional]
OPTIONAL_SENT = {
    "OBJECTIVE_WEIGHTS": np.array([0.5, 0.3, 0.2], dtype=np.float32),
    "MODEL_VERSION_TAG": np.array([b"stable"], dtype=object),
}


@pytest.mark.parametrize("optional", [[], ["OBJECTIVE_WEIGHTS"], list(OPTIONAL_SENT)])
@pytest.mark.parametrize("model", ["dispatch", FUSED_MODEL_NAME])
def test_a_missing_required_input_is_named_whatever_else_is_sent(
    model: str,
    optional: list[str],
    good: Arrays,
    good_answer: Arrays,
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    """Triton 2.51 answered `dispatch` "unexpected deadlock" (no name) when an optional
    input came with a required one missing; declared optional in the ensemble, the step
    that needs the tensor refuses it by name."""
    for missing in REQUIRED:
        tensors = {n: a for n, a in good.items() if n != missing}
        tensors |= {name: OPTIONAL_SENT[name] for name in optional}
        for protocol in ("http", "grpc"):
            with pytest.raises(InferenceServerException) as info:
                if protocol == "http":
                    infer_http(http_client, tensors, model=model)
                else:
                    infer_grpc(grpc_client, tensors, model=model)
            message = f"{protocol}: {info.value.message()}"
            assert missing in message, message
            assert "deadlock" not in message
            assert "missing" in message, message
    again = infer_grpc(grpc_client, good, model=model)
    np.testing.assert_array_equal(again["TOPK_RIDER_INDEX"], good_answer["TOPK_RIDER_INDEX"])


@pytest.mark.parametrize("model", ["dispatch", FUSED_MODEL_NAME])
def test_an_old_form_request_gets_one_error_naming_the_tensor_count(
    model: str, good: Arrays, good_answer: Arrays, http_client: httpclient.InferenceServerClient
) -> None:
    old = window_to_tensors(generate_window(np.random.default_rng(77), 12, 40))
    with pytest.raises(InferenceServerException) as info:
        infer_http(http_client, old, model=model, batch=False)
    message = str(info.value.message())
    assert f"inputs between {0 if model == 'dispatch' else 6} and 8 but got {len(old)}" in message
    if model == FUSED_MODEL_NAME:  # the ensemble requires none itself (declared_by_ensemble)
        for word in ("ORDER_FIELDS", "RIDER_FIELDS", "WINDOW_FIELDS", "missing required input"):
            assert word in message, message
    # ids in the v1 shape [B], without the batch dimension: Triton names the expected shape
    with pytest.raises(InferenceServerException) as info:
        infer_http(http_client, good, model=model, batch=False)
    assert "ORDER_IDS" in info.value.message() or "batch size" in info.value.message()
    again = infer_http(http_client, good, model=model)
    np.testing.assert_array_equal(again["TOPK_RIDER_INDEX"], good_answer["TOPK_RIDER_INDEX"])


@pytest.mark.parametrize("model", ["dispatch", FUSED_MODEL_NAME])
def test_a_request_from_before_order_text_is_refused_naming_it(
    model: str, good: Arrays, good_answer: Arrays, http_client: httpclient.InferenceServerClient
) -> None:
    """A client of the first v2 contract sends ORDER_USER_IDS [B] where ORDER_TEXT now is."""
    old = {name: value for name, value in good.items() if name != "ORDER_TEXT"}
    old["ORDER_USER_IDS"] = good["ORDER_TEXT"][:, 0]
    with pytest.raises(InferenceServerException) as info:
        infer_http(http_client, old, model=model)
    assert f"unexpected inference input 'ORDER_USER_IDS' for model '{model}'" in str(
        info.value.message()
    )
    again = infer_http(http_client, good, model=model)
    np.testing.assert_array_equal(again["TOPK_RIDER_INDEX"], good_answer["TOPK_RIDER_INDEX"])


@pytest.mark.parametrize("model", ["dispatch", FUSED_MODEL_NAME])
def test_two_windows_in_one_request_are_refused_naming_the_shape(
    model: str, good: Arrays, good_answer: Arrays, http_client: httpclient.InferenceServerClient
) -> None:
    two = {name: np.stack([value, value]) for name, value in good.items()}
    with pytest.raises(InferenceServerException) as info:
        infer_http(http_client, two, model=model, batch=False)
    message = info.value.message()
    assert "must have a batch dimension of 1" in message and "[1, " in message, message
    again = infer_http(http_client, good, model=model)
    np.testing.assert_array_equal(again["TOPK_RIDER_INDEX"], good_answer["TOPK_RIDER_INDEX"])


def test_intermediate_model_rejects_malformed_features_directly(
    http_client: httpclient.InferenceServerClient,
) -> None:
    features = np.full((4, NUM_PAIR_FEATURES), np.nan, dtype=np.float32)
    tensor = httpclient.InferInput("PAIR_FEATURES", list(features.shape), "FP32")
    tensor.set_data_from_numpy(features)
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("dispatch_model", [tensor])
    assert "PAIR_FEATURES" in info.value.message()
    assert "finite" in info.value.message()
