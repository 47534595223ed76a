"""Orders sent with addresses on a real Triton: geocoded by the encoder of both
entry points against a real loopback geocoding server, with sources, failover to the
gazetteer, errors that name column and row, and no hold-up of windows with coordinates.

The server here has its own copy of the repository whose feature_encoder names the loopback
server as both providers (amap shape primary, baidu shape secondary); dispatch_fused reads
the same settings.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from dispatch_contract import LocationSource
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import ENCODER_MODEL, model_layout
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer
from dispatch_service.offline import gazetteer_build
from dispatch_service.offline.geocoding_server import GeocodingServer, use_as_providers
from dispatch_service.offline.simulator import generate_window
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from triton_helpers import ROUTED_OUTPUT_NAMES, infer_grpc, infer_http

KEY = "integration-key"
# Long enough that a provider slower than every coordinate window is still awaited: the
# hold-up test needs the address window to wait while others are answered.
DEADLINE_MS = 2500
ATTEMPT_MS = 2200
SLOW_PROVIDER_MS = 2000
ENTRY_POINTS = ("dispatch", "dispatch_fused")
SOURCE = "ORDER_LOCATION_SOURCE"


@dataclass
class GeocodingStack:
    server: TritonServer
    geocoder: GeocodingServer
    book: gazetteer_build.AddressBook


def geocoding_repository(root: Path, url: str) -> Path:
    repository = root / "repo"
    shutil.copytree(MODEL_REPOSITORY, repository, ignore=shutil.ignore_patterns("__pycache__"))
    settings = {
        "geocoder_deadline_ms": str(DEADLINE_MS),
        "geocoder_attempt_timeout_ms": str(ATTEMPT_MS),
        # the failover tests make every call fail: keep the breakers out of their way
        "geocoder_breaker_failures": "1000",
    }
    # the key as a deployment keeps it: in a file only its owner can read
    use_as_providers(repository, url, KEY, settings, key_file=root / "geocoder.key")
    assert KEY not in model_layout(repository, ENCODER_MODEL).config.read_text()
    return repository


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GeocodingStack]:
    root = tmp_path_factory.mktemp("geocoding")
    gazetteer, recogniser = Gazetteer.load(), AdminRecogniser()
    with GeocodingServer(key=KEY, gazetteer=gazetteer, recogniser=recogniser) as geocoder:
        repository = geocoding_repository(root, geocoder.url)
        options = ServerOptions(model_repository=repository, ports=Ports.free())
        server = TritonServer(TritonRuntime.from_venv(), options, root / "server.log")
        with server:
            yield GeocodingStack(
                server, geocoder, gazetteer_build.AddressBook(gazetteer, recogniser)
            )
        print(f"geocoding tritonserver log: {server.log_path}")


@pytest.fixture()
def providers(stack: GeocodingStack) -> Iterator[GeocodingServer]:
    """Both provider shapes healthy and fast at the start and the end of each test."""
    for kind in ("amap", "baidu"):
        stack.geocoder.set_mode(kind)
    yield stack.geocoder
    for kind in ("amap", "baidu"):
        stack.geocoder.set_mode(kind)


def address_window(stack: GeocodingStack, seed: int, share: float = 0.5) -> DispatchWindow:
    window = generate_window(np.random.default_rng(seed), 8, 30)
    return gazetteer_build.window_with_addresses(window, stack.book, share=share)


def answer(stack: GeocodingStack, model: str, tensors: dict[str, Any]) -> dict[str, Any]:
    if model == "dispatch":
        with httpclient.InferenceServerClient(stack.server.http_url) as client:
            return infer_http(client, tensors, model, output_names=ROUTED_OUTPUT_NAMES)
    with grpcclient.InferenceServerClient(stack.server.grpc_url) as client:
        return infer_grpc(client, tensors, model, output_names=ROUTED_OUTPUT_NAMES)


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_addresses_are_geocoded_then_cached_and_the_source_says_so(
    stack: GeocodingStack, providers: GeocodingServer, model: str
) -> None:
    seed = 1 if model == "dispatch" else 2  # each its own addresses: nothing cached yet
    tensors = window_to_wire(address_window(stack, seed))
    first = answer(stack, model, tensors)
    assert first[SOURCE].tolist() == [[LocationSource.GEOCODER] * 2] * 4 + [[0, 0]] * 4
    assert (first["ASSIGNED_RIDER_INDEX"] >= 0).any()
    # each model instance has its own cache: within a few calls one answers from it
    for _ in range(8):
        again = answer(stack, model, tensors)
        if (again[SOURCE][:4] == LocationSource.CACHE).all():
            break
    else:
        pytest.fail(f"no answer came from the cache: {again[SOURCE].tolist()}")
    np.testing.assert_array_equal(again["TOPK_RIDER_INDEX"], first["TOPK_RIDER_INDEX"])


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_with_both_providers_down_the_gazetteer_answers(
    stack: GeocodingStack, providers: GeocodingServer, model: str
) -> None:
    providers.set_mode("amap", failure="http_500")
    providers.set_mode("baidu", failure="garbage")
    tensors = window_to_wire(address_window(stack, 10 + len(model), share=1.0))
    got = answer(stack, model, tensors)
    assert got[SOURCE].tolist() == [[LocationSource.GAZETTEER] * 2] * 8
    assert (got["ASSIGNED_RIDER_INDEX"] >= 0).any()


def refusal(stack: GeocodingStack, model: str, tensors: dict[str, Any]) -> str:
    with pytest.raises(InferenceServerException) as caught:
        answer(stack, model, tensors)
    return str(caught.value.message())


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_bad_addresses_are_refused_naming_column_rule_and_row(
    stack: GeocodingStack, providers: GeocodingServer, model: str
) -> None:
    good = window_to_wire(address_window(stack, 20))
    no_address = {name: np.array(value, copy=True) for name, value in good.items()}
    no_address["ORDER_TEXT"][5, 1] = b""  # row 5 has coordinates: fine
    no_address["ORDER_FIELDS"][5, 0:2] = np.nan  # ... until they are NaN
    message = refusal(stack, model, no_address)
    # (the ensemble puts "in ensemble 'dispatch', " before the step's message)
    assert "ORDER_FIELDS[pickup_lat, pickup_lon]: is NaN in row 5, which has no pickup" in message

    cases = [
        (1, b"\xff\xfe", "ORDER_TEXT[pickup_address]: must be valid UTF-8, row 2"),
        (2, "路".encode() * 90, "ORDER_TEXT[dropoff_address]: must be at most 256 bytes"),
        (3, "亚特兰蒂斯".encode(), "ORDER_TEXT[city]: row 2: city '亚特兰蒂斯' must be"),
        (1, "火星基地一号".encode(), "ORDER_TEXT[pickup_address]: row 2: address"),
    ]
    for column, value, expected in cases:
        bad = {name: np.array(v, copy=True) for name, v in good.items()}
        bad["ORDER_TEXT"][2, column] = value
        assert expected in refusal(stack, model, bad)
    # the next request is served
    assert answer(stack, model, good)[SOURCE].shape == (8, 2)


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_a_slow_provider_does_not_hold_up_windows_with_coordinates(
    stack: GeocodingStack, providers: GeocodingServer, model: str
) -> None:
    """While one window waits on a provider slower than every other request, windows
    with coordinates keep being answered by the other instances."""
    providers.set_mode("amap", latency_ms=SLOW_PROVIDER_MS)
    providers.set_mode("baidu", latency_ms=SLOW_PROVIDER_MS)
    slow = window_to_wire(address_window(stack, 30 + len(model)))
    calls = providers.calls("amap")
    done: dict[str, float] = {}

    def send_slow() -> None:
        answer(stack, model, slow)
        done["slow"] = time.monotonic()

    sender = threading.Thread(target=send_slow)
    sender.start()
    waited = time.monotonic() + 30
    while providers.calls("amap") == calls and time.monotonic() < waited:
        time.sleep(0.01)  # until the encoder is waiting on the provider
    assert providers.calls("amap") > calls
    fast = window_to_wire(generate_window(np.random.default_rng(7), 8, 30))
    answered_while_waiting = 0
    while sender.is_alive() and answered_while_waiting < 20:
        got = answer(stack, model, fast)
        assert got[SOURCE].tolist() == [[0, 0]] * 8
        if "slow" not in done:
            answered_while_waiting += 1
    sender.join(timeout=30)
    assert "slow" in done  # the slow window was answered too
    assert answered_while_waiting >= 1
