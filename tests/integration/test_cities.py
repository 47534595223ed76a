"""Windows are served in their own city, and every entry point's answer names it; a window no
registered city serves is refused by name on every transport and entry point, and the server
answers the next one."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import shapely
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from test_cli import EXAMPLE, run_cli
from tritonclient.utils import InferenceServerException

from dispatch_client import DispatchClient
from dispatch_contract import PRIORITY_LANE_MODEL_NAME, CoordSystem
from dispatch_contract.keys import PRIORITY_KEY_HEADER
from dispatch_service.domain.cities import DEFAULT_REGISTRY
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline import simulator
from dispatch_service.ops.server import TritonServer
from dispatch_service.routing.settings import FUSED_MODEL_NAME
from triton_helpers import ROUTED_OUTPUT_NAMES, infer_grpc, infer_http

Arrays = dict[str, np.ndarray[Any, Any]]
NEW_YORK = (40.7128, -74.0060)
BEIJING = (39.9042, 116.4074)


def _window(city: str, seed: int = 5) -> Arrays:
    world = simulator.city_worlds()[city]
    return dict(
        window_to_wire(simulator.generate_window(np.random.default_rng(seed), 6, 30, config=world))
    )


def _outside(w: Arrays) -> None:
    w["ORDER_FIELDS"][2, 2:4] = NEW_YORK


def _two_cities(w: Arrays) -> None:
    w["RIDER_FIELDS"][7, :2] = BEIJING


def _named_elsewhere(w: Arrays) -> None:
    text = w["ORDER_TEXT"]
    blank = np.full((text.shape[0], 1), b"", dtype=object)
    city = blank.copy()
    city[3, 0] = "北京".encode()
    w["ORDER_TEXT"] = np.concatenate([text[:, :1], blank, blank, city], axis=1)


CASES: list[tuple[str, Callable[[Arrays], None], str]] = [
    ("outside", _outside, "ORDER_FIELDS[dropoff_lat, dropoff_lon] row 2: lies outside every city"),
    ("two cities", _two_cities, "RIDER_FIELDS[lat, lon] row 7: lies in beijing, the window's"),
    ("named elsewhere", _named_elsewhere, "row 0: lies in shanghai, not in beijing named by"),
]


def _send(transport: str, clients: tuple[Any, Any], window: Arrays, model: str) -> Arrays:
    http_client, grpc_client = clients
    if transport == "grpc":
        return infer_grpc(grpc_client, window, model=model)
    return infer_http(http_client, window, model=model, binary=transport == "http-binary")


@pytest.mark.parametrize("model", ["dispatch", FUSED_MODEL_NAME])
@pytest.mark.parametrize("transport", ["grpc", "http-binary", "http-json"])
@pytest.mark.parametrize(("case", "mutate", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_window_no_city_serves_is_refused_by_name(
    case: str,
    mutate: Callable[[Arrays], None],
    words: str,
    transport: str,
    model: str,
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    good = _window("shanghai")
    bad = {name: array.copy() for name, array in good.items()}
    mutate(bad)
    clients = (http_client, grpc_client)
    with pytest.raises(InferenceServerException) as info:
        _send(transport, clients, bad, model)
    assert words in info.value.message(), info.value.message()
    assert http_client.is_model_ready(model)
    assert _send(transport, clients, good, model)["ASSIGNED_RIDER_INDEX"].shape == (6,)


def registry_city_of(window: Arrays) -> str:
    """The shipped registry file's own answer for a WGS-84 window, read here with shapely and
    nothing of the server's code: the one service area covering every pickup, drop-off and
    rider position."""
    assert window["WINDOW_FIELDS"][1] == CoordSystem.WGS84
    orders, riders = window["ORDER_FIELDS"], window["RIDER_FIELDS"]
    lat_lon = np.concatenate([orders[:, 0:2], orders[:, 2:4], riders[:, 0:2]])
    points = shapely.MultiPoint(lat_lon[:, ::-1])  # GeoJSON positions are [lon, lat]
    features = json.loads(DEFAULT_REGISTRY.read_text())["features"]
    covering = [
        feature["properties"]["city"]
        for feature in features
        if feature["properties"]["feature"] == "service_area"
        and shapely.geometry.shape(feature["geometry"]).covers(points)
    ]
    assert len(covering) == 1, covering
    return str(covering[0])


SERVED_CITIES = ("shanghai", "beijing", "chengdu")


@pytest.mark.parametrize("model", ["dispatch", FUSED_MODEL_NAME, PRIORITY_LANE_MODEL_NAME])
@pytest.mark.parametrize("transport", ["grpc", "http-binary", "http-json"])
def test_every_entry_point_names_the_city_that_served_the_window(
    transport: str,
    model: str,
    triton: TritonServer,
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    """WINDOW_CITY of windows drawn in three cities is, for each, the city whose area in the
    registry file holds all its points."""
    lane = model == PRIORITY_LANE_MODEL_NAME
    headers = {PRIORITY_KEY_HEADER: str(triton.priority_key)} if lane else None
    named: set[str] = set()
    for city in SERVED_CITIES:
        window = _window(city, seed=11)
        expected = registry_city_of(window)
        named.add(expected)
        if transport == "grpc":
            answer = infer_grpc(grpc_client, window, model, ROUTED_OUTPUT_NAMES, headers=headers)
        else:
            binary = transport == "http-binary"
            answer = infer_http(
                http_client, window, model, binary, ROUTED_OUTPUT_NAMES, headers=headers
            )
        assert answer["WINDOW_CITY"].tolist() == [expected.encode()], (city, model)
        assert answer["ASSIGNED_RIDER_INDEX"].shape == (6,)
    assert len(named) == len(SERVED_CITIES)  # three different cities answered


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_client_returns_the_city_that_served_each_window(
    protocol: str, triton: TritonServer
) -> None:
    """`DispatchResult.city` and its JSON, through the client's own transports (level 1 goes
    to the priority lane with the key, the others to `dispatch`)."""
    make = DispatchClient.grpc if protocol == "grpc" else DispatchClient.http
    url = triton.grpc_url if protocol == "grpc" else triton.http_url
    for level in (1, 2):
        with make(url, priority=level, priority_key=triton.priority_key) as client:
            for city in SERVED_CITIES:
                window = _window(city, seed=12)
                result = client.dispatch(window)
                assert result.city == registry_city_of(window), (city, level)
                assert result.to_json_dict()["city"] == result.city


@pytest.mark.parametrize("city", ["beijing", "shenzhen", "chengdu"])
def test_every_registered_city_is_answered_by_the_model_unclamped(
    city: str, grpc_client: grpcclient.InferenceServerClient
) -> None:
    answer = infer_grpc(
        grpc_client, _window(city), model=FUSED_MODEL_NAME, output_names=ROUTED_OUTPUT_NAMES
    )
    assert (answer["ORDER_FALLBACK_LEVEL"] == 0).all() and (answer["ORDER_MODEL_VERSION"] > 0).all()
    objectives = answer["TOPK_OBJECTIVES"]  # score, ETA, on-time, cost
    served = answer["TOPK_RIDER_INDEX"] >= 0
    eta, ontime = objectives[..., 1][served], objectives[..., 2][served]
    # The graph clamps ETA at 0.5 minutes: real predictions lie well inside.
    assert eta.min() > 5.0 and eta.max() < 180.0
    assert ontime.min() > 0.0 and ontime.max() < 1.0 and np.unique(eta).size > 1


def test_the_client_cli_prints_the_refusal_and_exits_2(triton: TritonServer) -> None:
    window = json.loads(EXAMPLE.read_text())
    window["orders"][1]["pickup"] = list(NEW_YORK)
    done = run_cli("--url", triton.grpc_url, "--protocol", "grpc", "-", stdin=json.dumps(window))
    assert done.returncode == 2, done.stderr
    assert "ORDER_FIELDS[pickup_lat, pickup_lon] row 1: lies outside every city" in done.stderr
