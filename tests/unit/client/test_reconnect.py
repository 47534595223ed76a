"""A long-lived gRPC client after its server restarts (dispatch_client.transport): a real
gRPC server on loopback (Triton's service definition, answering every ModelInfer), stopped
and started again on the same port."""

from __future__ import annotations

import socket
import time
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from dispatch_client.errors import DispatchConnectionError, DispatchServerError
from dispatch_client.transport import GrpcTransport, grpc_channel_args


class _Answering(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802 -- gRPC's name
        response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
        response.outputs.add(name="Y", datatype="FP32", shape=[1])
        response.raw_output_contents.append(np.float32(7.0).tobytes())
        return response


def _serve(port: int) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(_Answering(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(transport: GrpcTransport) -> bool:
    try:
        outputs = transport.infer("m", {"X": np.zeros((1, 1), np.float32)}, ["Y"])
    except (DispatchConnectionError, DispatchServerError):
        return False
    return bool(outputs["Y"][0] == 7.0)


def test_a_long_lived_client_reconnects_within_a_second_of_a_restarted_server() -> None:
    """gRPC's default reconnect backoff (1 s, growing toward 120 s) left a client failing
    calls for seconds after its restarted server was back (184 of 245 failed)."""
    port = _free_port()
    server = _serve(port)
    transport = GrpcTransport(f"127.0.0.1:{port}", timeout_s=5)
    try:
        assert _answers(transport)
        server.stop(grace=None).wait()
        # Down for 6 s, as a restarted Triton is, with the client calling throughout: the
        # default backoff has grown to several seconds by then.
        down_until = time.monotonic() + 6.0
        while time.monotonic() < down_until:
            assert not _answers(transport)
            time.sleep(0.2)
        server = _serve(port)
        time.sleep(2.0)  # two reconnect attempts' worth at most 1 s apart (+20 % jitter)
        assert _answers(transport), "the client had not reconnected 2 s after the restart"
    finally:
        transport.close()
        server.stop(grace=None).wait()


@pytest.mark.parametrize("option", ["grpc.max_send_message_length", "grpc.keepalive_time_ms"])
def test_wiring_the_channel_keeps_tritonclients_defaults(option: str) -> None:
    """The reconnect options replace tritonclient's channel options, so its defaults
    (2 GiB messages, keepalive) are given again."""
    assert option in dict(grpc_channel_args())
