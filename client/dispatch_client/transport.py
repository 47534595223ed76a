"""How request tensors reach Triton: one small protocol, three implementations.

`DispatchClient` depends only on `Transport`, so tests can hand it an in-memory fake and
HTTP or gRPC are a constructor choice. Both implementations translate tritonclient's and
the socket layer's exceptions into `DispatchServerError` (the server said no; its
message, on one line) or `DispatchConnectionError` (nobody answered). The third,
`dispatch_client.shm.GrpcShmTransport` (protocol ``grpc-shm``), passes tensors through
shared memory registered with the server.
"""

from __future__ import annotations

import http.client
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from dispatch_client.errors import DispatchConnectionError, DispatchServerError
from dispatch_client.priority import request_options
from dispatch_contract.version import URL_SCHEMES, UrlError, split_address

__all__ = [
    "DEFAULT_GRPC_URL",
    "DEFAULT_HTTP_URL",
    "DEFAULT_TIMEOUT_S",
    "RECONNECT_BACKOFF_MS",
    "URL_SCHEMES",
    "WRONG_PORT_HINTS",
    "GrpcTransport",
    "HttpTransport",
    "Transport",
    "check_url",
    "grpc_channel_args",
    "grpc_error",
    "split_url",
]

DEFAULT_HTTP_URL = "localhost:8000"
DEFAULT_GRPC_URL = "localhost:8001"
DEFAULT_TIMEOUT_S = 60.0


class Transport(Protocol):
    """Sends one inference request and returns the named outputs as numpy arrays.

    `priority` (0: the model's default level) and `timeout_us` (0: the model's default queue
    timeout) are Triton's request priority and queue deadline; `priority_key` (header
    ``dispatch-priority-key``) entitles a window to the priority lane. `DispatchClient` passes
    them only when set, so a transport without them still serves plain calls.
    """

    def infer(
        self,
        model_name: str,
        inputs: dict[str, NDArray[Any]],
        output_names: Sequence[str],
        *,
        request_id: str = "",
        priority: int = 0,
        timeout_us: int = 0,
        priority_key: str = "",
    ) -> dict[str, NDArray[Any]]:
        """Run `model_name` on `inputs`; raise DispatchServerError/DispatchConnectionError.

        `request_id` goes out as Triton's request ``id`` ("" sends none).
        """
        ...

    def close(self) -> None:
        """Release connections; the transport is not used afterwards."""
        ...


def split_url(url: str) -> tuple[str, bool]:
    """``host:port``, ``http://host:port`` or ``https://host:port`` -> (host:port, TLS?).

    tritonclient wants host:port and fails obscurely on a scheme, so the scheme is taken off
    here: ``http://`` means plain text (as no scheme does), ``https://`` means TLS with the
    server's certificate checked against the system's CA roots. The scheme says TLS or not;
    the protocol (HTTP or gRPC) stays the caller's choice. A path, or a missing port, is
    refused.
    """
    try:
        return split_address(url)  # the port too: "127.0.0.1" alone is refused
    except UrlError:
        raise ValueError(
            f"url must be host:port, http://host:port or https://host:port, got {url!r}"
        ) from None


def check_url(url: str) -> str:
    """The ``host:port`` of `url` (see `split_url`), for callers that never use TLS."""
    return split_url(url)[0]


def _server_error(exc: InferenceServerException) -> DispatchServerError:
    message = exc.message() or str(exc) or "the server returned an error without a message"
    status = exc.status()
    return DispatchServerError(str(message), None if status is None else str(status))


# What a request in one protocol sent to the other's port is told (Triton's HTTP port speaks
# HTTP/1.1, 8000 by default; its gRPC port HTTP/2, 8001 by default).
WRONG_PORT_HINTS: Final = {
    "http": f": is this Triton's gRPC port? Send HTTP to its HTTP port "
    f"({DEFAULT_HTTP_URL} by default) or use the gRPC protocol",
    "grpc": f": is this Triton's HTTP port? Send gRPC to its gRPC port "
    f"({DEFAULT_GRPC_URL} by default) or use the HTTP protocol",
}


def grpc_error(
    exc: InferenceServerException, url: str, timeout_s: float
) -> DispatchServerError | DispatchConnectionError:
    """A gRPC failure as the client's error: the server's refusal, or nobody answering.

    gRPC reports transport failures with the same exception; the code tells them apart, so
    callers know whether the server spoke at all.
    """
    status = str(exc.status())
    text = str(exc.message() or exc)
    if status == "StatusCode.DEADLINE_EXCEEDED":
        return DispatchConnectionError(
            f"no answer from {url} over gRPC within {timeout_s:g} s", timed_out=True
        )
    if status == "StatusCode.UNAVAILABLE" and "failed to connect" in text.lower():
        hint = WRONG_PORT_HINTS["grpc"] if "Failed parsing HTTP/2" in text else ""
        return DispatchConnectionError(f"cannot reach {url} over gRPC: {text}{hint}")
    return _server_error(exc)


def _outputs(result: Any, output_names: Sequence[str]) -> dict[str, NDArray[Any]]:
    arrays: dict[str, NDArray[Any]] = {}
    for name in output_names:
        array = result.as_numpy(name)
        if array is None:
            raise DispatchServerError(f"the response lacks the requested output {name}")
        arrays[name] = np.asarray(array)
    return arrays


class HttpTransport:
    """Triton's HTTP/REST endpoint (default port 8000), tensors sent as binary data.

    Not safe to share between threads (tritonclient's HTTP client is not).
    """

    def __init__(
        self,
        url: str = DEFAULT_HTTP_URL,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.url, self.tls = split_url(url)
        secure: dict[str, Any] = {}
        if self.tls:
            import gevent.ssl  # tritonclient's HTTP client runs on gevent

            secure = {"ssl": True, "ssl_context_factory": gevent.ssl.create_default_context}
        self._client: Any = httpclient.InferenceServerClient(
            url=self.url, connection_timeout=connect_timeout_s, network_timeout=timeout_s, **secure
        )

    def infer(
        self,
        model_name: str,
        inputs: dict[str, NDArray[Any]],
        output_names: Sequence[str],
        *,
        request_id: str = "",
        priority: int = 0,
        timeout_us: int = 0,
        priority_key: str = "",
    ) -> dict[str, NDArray[Any]]:
        """Send the inputs as binary tensors and ask for binary outputs (no JSON floats)."""
        request = []
        for name, value in inputs.items():
            array = np.asarray(value)
            item = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            item.set_data_from_numpy(array, binary_data=True)
            request.append(item)
        wanted = [httpclient.InferRequestedOutput(n, binary_data=True) for n in output_names]
        try:
            result = self._client.infer(
                model_name,
                request,
                outputs=wanted,
                request_id=request_id,
                **request_options(priority, timeout_us, priority_key),
            )
        except InferenceServerException as exc:
            raise _server_error(exc) from exc
        except TimeoutError as exc:
            raise DispatchConnectionError(
                f"no answer from {self.url} over HTTP in time", timed_out=True
            ) from exc
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise DispatchConnectionError(f"cannot reach {self.url} over HTTP: {reason}") from exc
        except http.client.HTTPException as exc:  # an answer that is not HTTP/1.1
            raise DispatchConnectionError(
                f"{self.url} did not answer in HTTP ({type(exc).__name__}: {exc})"
                f"{WRONG_PORT_HINTS['http']}"
            ) from exc
        return _outputs(result, output_names)

    def close(self) -> None:
        self._client.close()


# gRPC reconnects a lost channel after a backoff that starts at 1 s and grows toward 120 s:
# a long-lived client failed 184 of 245 calls for seconds after a restarted server was
# back. Reconnect attempts 100 ms to 1 s apart instead (a restart takes several seconds, so
# a few attempts at most).
RECONNECT_BACKOFF_MS: Final = (100, 1000)
# How long a call refused for want of a connection waits for the channel to connect before it
# is sent once more: the longest reconnect backoff with gRPC's jitter (20 %) and a margin.
RECONNECT_WAIT_S: Final = 1.5 * RECONNECT_BACKOFF_MS[1] / 1000
_MAX_MESSAGE_BYTES: Final = 2**31 - 1  # tritonclient's default: Triton's own limit


def grpc_channel_args() -> list[tuple[str, int]]:
    """tritonclient's default channel options (message sizes, keepalive), with the
    reconnect backoff of RECONNECT_BACKOFF_MS: every gRPC client of this package uses them."""
    keepalive = grpcclient.KeepAliveOptions()
    first, most = RECONNECT_BACKOFF_MS
    return [
        ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(keepalive.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
        ("grpc.initial_reconnect_backoff_ms", first),
        ("grpc.min_reconnect_backoff_ms", first),
        ("grpc.max_reconnect_backoff_ms", most),
    ]


class GrpcTransport:
    """Triton's gRPC endpoint (default port 8001)."""

    def __init__(
        self,
        url: str = DEFAULT_GRPC_URL,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        parameters: Mapping[str, bool | int | str] | None = None,
    ):
        """``parameters``: request parameters sent with every request (Triton forwards them
        to each step of an ensemble), e.g. the launcher's probe mark (`ops.health`)."""
        self.url, self.tls = split_url(url)
        self.timeout_s = timeout_s
        self.parameters = dict(parameters or {})
        secure = {"ssl": True} if self.tls else {}  # TLS with the system's CA roots
        self._client: Any = grpcclient.InferenceServerClient(
            url=self.url, channel_args=grpc_channel_args(), **secure
        )

    def infer(
        self,
        model_name: str,
        inputs: dict[str, NDArray[Any]],
        output_names: Sequence[str],
        *,
        request_id: str = "",
        priority: int = 0,
        timeout_us: int = 0,
        priority_key: str = "",
    ) -> dict[str, NDArray[Any]]:
        """One unary call bounded by `timeout_s`."""
        request = []
        for name, value in inputs.items():
            array = np.asarray(value)
            item = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            item.set_data_from_numpy(array)
            request.append(item)
        wanted = [grpcclient.InferRequestedOutput(n) for n in output_names]

        def send() -> Any:
            return self._client.infer(
                model_name,
                request,
                outputs=wanted,
                client_timeout=self.timeout_s,
                request_id=request_id,
                **({"parameters": self.parameters} if self.parameters else {}),
                **request_options(priority, timeout_us, priority_key),
            )

        try:
            result = send()
        except InferenceServerException as exc:
            error = grpc_error(exc, self.url, self.timeout_s)
            if not self._connected_again(error):
                raise error from exc
            try:  # once more, on the channel that has just connected
                result = send()
            except InferenceServerException as again:
                raise grpc_error(again, self.url, self.timeout_s) from again
        return _outputs(result, output_names)

    def _connected_again(self, error: Exception) -> bool:
        """After a call refused for want of a connection, whether the channel connects
        within `RECONNECT_WAIT_S` (and the call's timeout): a channel that lost its server
        fails every call at once until its next reconnect attempt, up to a backoff later,
        though the server may be back already (a restart)."""
        if not isinstance(error, DispatchConnectionError) or error.timed_out:
            return False
        ready = grpc.channel_ready_future(self._client._channel)  # tritonclient's channel
        try:
            ready.result(timeout=min(RECONNECT_WAIT_S, self.timeout_s))
        except grpc.FutureTimeoutError:
            return False
        finally:
            ready.cancel()
        return True

    def close(self) -> None:
        self._client.close()
