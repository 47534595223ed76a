"""HttpTransport / GrpcTransport with tritonclient's network client swapped for a stub.

Checks what goes on the wire (names, datatypes, shapes, binary outputs, timeouts) and how
tritonclient's and the socket layer's exceptions become the client's one-line errors.
"""

from __future__ import annotations

import socket
from concurrent import futures
from typing import Any, ClassVar

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from dispatch_client.connect import make_transport
from dispatch_client.errors import DispatchConnectionError, DispatchServerError
from dispatch_client.transport import GrpcTransport, HttpTransport, grpc_channel_args

Array = np.ndarray[Any, Any]


class StubResult:
    def __init__(self, arrays: dict[str, Array]) -> None:
        self.arrays = arrays

    def as_numpy(self, name: str) -> Array | None:
        return self.arrays.get(name)


class StubClient:
    """Stands in for tritonclient's InferenceServerClient (HTTP or gRPC)."""

    answer: ClassVar[dict[str, Array]] = {}
    raises: ClassVar[BaseException | None] = None
    raises_once: ClassVar[bool] = False  # the first call raises `raises`, the others answer
    instances: ClassVar[list[StubClient]] = []
    # What tritonclient's gRPC client keeps as `_channel`: a real channel to this address
    # (a port nobody listens on unless a test starts a server there).
    channel_target: ClassVar[str] = ""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.requests: list[tuple[str, list[Any], list[Any], dict[str, Any]]] = []
        self.closed = False
        self._channel = grpc.insecure_channel(StubClient.channel_target)
        StubClient.instances.append(self)

    def infer(self, model_name: str, inputs: list[Any], outputs: list[Any], **kw: Any) -> Any:
        self.requests.append((model_name, inputs, outputs, kw))
        if StubClient.raises is not None and not (StubClient.raises_once and self.requests[1:]):
            raise StubClient.raises
        return StubResult(StubClient.answer)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def stub(monkeypatch: pytest.MonkeyPatch) -> type[StubClient]:
    StubClient.answer = {"OUT": np.array([[1.5]], np.float32)}
    StubClient.raises = None
    StubClient.raises_once = False
    StubClient.instances = []
    StubClient.channel_target = f"127.0.0.1:{_unused_port()}"
    monkeypatch.setattr(httpclient, "InferenceServerClient", StubClient)
    monkeypatch.setattr(grpcclient, "InferenceServerClient", StubClient)
    return StubClient


INPUTS: dict[str, Array] = {
    "IDS": np.array([b"a", b"bc"], dtype=object),
    "POS": np.zeros((2, 2), np.float64),
    "N": np.array([3, 4], np.int32),
    "T": np.array([1764400000], np.int64),
    "W": np.ones(3, np.float32),
}


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_request_carries_names_datatypes_and_shapes(kind: str) -> None:
    transport = HttpTransport("h:8000", timeout_s=7) if kind == "http" else GrpcTransport("h:8001")
    result = transport.infer("dispatch", INPUTS, ["OUT"])

    assert result["OUT"].tolist() == [[1.5]]
    [client] = StubClient.instances
    [(model, inputs, outputs, _)] = client.requests
    assert model == "dispatch"
    assert [(i.name(), i.datatype(), i.shape()) for i in inputs] == [
        ("IDS", "BYTES", [2]),
        ("POS", "FP64", [2, 2]),
        ("N", "INT32", [2]),
        ("T", "INT64", [1]),
        ("W", "FP32", [3]),
    ]
    assert [o.name() for o in outputs] == ["OUT"]
    transport.close()
    assert client.closed


def test_http_uses_binary_outputs_and_the_timeouts() -> None:
    transport = HttpTransport("h:8000", timeout_s=7, connect_timeout_s=3)
    transport.infer("dispatch", INPUTS, ["OUT"])

    [client] = StubClient.instances
    assert client.kwargs == {"url": "h:8000", "connection_timeout": 3, "network_timeout": 7}
    [(_, inputs, outputs, _)] = client.requests
    assert all(o._binary for o in outputs)
    assert all(i._raw_data is not None for i in inputs)  # sent as binary, not JSON


def test_grpc_passes_its_deadline() -> None:
    GrpcTransport("h:8001", timeout_s=4.5).infer("dispatch", INPUTS, ["OUT"])
    [client] = StubClient.instances
    assert client.kwargs == {"url": "h:8001", "channel_args": grpc_channel_args()}
    assert client.requests[0][3] == {"client_timeout": 4.5, "request_id": ""}


def test_grpc_sends_its_request_parameters_with_every_request() -> None:
    transport = GrpcTransport("h:8001", timeout_s=2, parameters={"dispatch_probe": True})
    transport.infer("dispatch", INPUTS, ["OUT"])
    [client] = StubClient.instances
    assert client.requests[0][3]["parameters"] == {"dispatch_probe": True}


@pytest.mark.parametrize("kind", ["http", "grpc"])
def test_server_error_message_on_one_line(kind: str) -> None:
    status = "400" if kind == "http" else "StatusCode.INVALID_ARGUMENT"
    StubClient.raises = InferenceServerException(
        "in ensemble 'dispatch', ORDER_PICKUP: latitude must be within [-90.0, 90.0] (row 3)\n"
        "Traceback: ...",
        status=status,
    )
    transport = HttpTransport() if kind == "http" else GrpcTransport()
    with pytest.raises(DispatchServerError) as info:
        transport.infer("dispatch", INPUTS, ["OUT"])
    assert info.value.message == (
        "in ensemble 'dispatch', ORDER_PICKUP: latitude must be within [-90.0, 90.0] (row 3) "
        "Traceback: ..."
    )
    assert info.value.status == status


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            ConnectionRefusedError(111, "Connection refused"),
            "cannot reach localhost:8000 over HTTP: Connection refused",
        ),
        (TimeoutError("timed out"), "no answer from localhost:8000 over HTTP in time"),
        (OSError("Name or service not known"), "cannot reach localhost:8000 over HTTP: Name"),
    ],
)
def test_http_connection_failures(error: OSError, message: str) -> None:
    StubClient.raises = error
    with pytest.raises(DispatchConnectionError) as info:
        HttpTransport().infer("dispatch", INPUTS, ["OUT"])
    assert info.value.message.startswith(message)


@pytest.mark.parametrize(
    ("status", "text", "error", "message"),
    [
        (
            "StatusCode.UNAVAILABLE",
            "failed to connect to all addresses; last error: Connection refused",
            DispatchConnectionError,
            "cannot reach localhost:8001 over gRPC: failed to connect to all addresses",
        ),
        (
            "StatusCode.DEADLINE_EXCEEDED",
            "Deadline Exceeded",
            DispatchConnectionError,
            "no answer from localhost:8001 over gRPC within 60 s",
        ),
        (
            "StatusCode.UNAVAILABLE",
            "Request for unknown model: 'dispatch' has no available versions",
            DispatchServerError,
            "Request for unknown model",
        ),
    ],
)
def test_grpc_tells_transport_failures_from_server_errors(
    status: str, text: str, error: type[Exception], message: str
) -> None:
    StubClient.raises = InferenceServerException(text, status=status)
    with pytest.raises(error) as info:
        GrpcTransport().infer("dispatch", INPUTS, ["OUT"])
    assert str(info.value).startswith(message)


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


_UNCONNECTED = InferenceServerException(
    "failed to connect to all addresses; last error: Connection refused",
    status="StatusCode.UNAVAILABLE",
)


def test_a_call_refused_for_want_of_a_connection_is_sent_again_once_the_channel_connects() -> None:
    """A restarted server is back before the channel's next reconnect attempt: the call
    waits for the channel to connect (a real gRPC server here) and is sent once more."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        StubClient.channel_target = f"127.0.0.1:{port}"
        StubClient.raises, StubClient.raises_once = _UNCONNECTED, True
        got = GrpcTransport().infer("dispatch", INPUTS, ["OUT"])
    finally:
        server.stop(None)
    np.testing.assert_array_equal(got["OUT"], StubClient.answer["OUT"])
    assert len(StubClient.instances[-1].requests) == 2


def test_a_channel_that_does_not_connect_fails_the_call_after_one_wait() -> None:
    StubClient.raises = _UNCONNECTED  # and nobody listens at the channel's address
    with pytest.raises(DispatchConnectionError, match="cannot reach localhost:8001 over gRPC"):
        GrpcTransport().infer("dispatch", INPUTS, ["OUT"])
    assert len(StubClient.instances[-1].requests) == 1


def test_missing_output_is_a_server_error() -> None:
    with pytest.raises(DispatchServerError, match="lacks the requested output NOPE"):
        HttpTransport().infer("dispatch", INPUTS, ["OUT", "NOPE"])


@pytest.mark.parametrize("url", ["grpc://x:1", "", "  ", "http://", "h:1/v2"])
def test_a_url_other_than_host_port_or_http_s_is_refused_up_front(url: str) -> None:
    message = "url must be host:port, http://host:port or https://host:port"
    with pytest.raises(ValueError, match=message):
        HttpTransport(url)
    with pytest.raises(ValueError, match=message):
        GrpcTransport(url)
    assert StubClient.instances == []


def test_http_and_https_schemes_are_taken_off_and_https_means_tls() -> None:
    HttpTransport("http://h:8000")
    GrpcTransport("http://h:8001")
    HttpTransport("https://h:443")
    GrpcTransport("https://h:8001")
    plain_http, plain_grpc, tls_http, tls_grpc = StubClient.instances
    assert plain_http.kwargs["url"] == "h:8000" and "ssl" not in plain_http.kwargs
    assert plain_grpc.kwargs == {"url": "h:8001", "channel_args": grpc_channel_args()}
    assert tls_http.kwargs["url"] == "h:443" and tls_http.kwargs["ssl"] is True
    assert tls_http.kwargs["ssl_context_factory"] is not None  # verifies certificates
    assert tls_grpc.kwargs == {"url": "h:8001", "channel_args": grpc_channel_args(), "ssl": True}


def test_the_request_id_goes_out_as_tritons_request_id() -> None:
    HttpTransport("h:1").infer("dispatch", INPUTS, ["OUT"], request_id="r-1")
    GrpcTransport("h:2").infer("dispatch", INPUTS, ["OUT"], request_id="r-2")
    over_http, over_grpc = StubClient.instances
    assert over_http.requests[0][3]["request_id"] == "r-1"
    assert over_grpc.requests[0][3]["request_id"] == "r-2"


def test_make_transport_picks_protocol_and_default_port() -> None:
    http = make_transport("http", timeout_s=3)
    grpc = make_transport("grpc", "example:9001")
    assert isinstance(http, HttpTransport) and http.url == "localhost:8000"
    assert isinstance(grpc, GrpcTransport) and grpc.url == "example:9001"
    assert isinstance(make_transport("grpc"), GrpcTransport)
    assert make_transport("grpc").url == "localhost:8001"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="protocol must be 'http', 'grpc' or 'grpc-shm'"):
        make_transport("ftp")  # type: ignore[arg-type]
