"""Pick a transport by protocol name: the one place that knows every transport.

Kept apart from `transport` (HTTP, gRPC) and `shm` (gRPC with shared memory, which builds
on `transport`) so that neither has to import the other to offer the choice.
"""

from __future__ import annotations

from typing import Literal

from dispatch_client.shm import GrpcShmTransport, ShmCapacity
from dispatch_client.transport import (
    DEFAULT_GRPC_URL,
    DEFAULT_HTTP_URL,
    DEFAULT_TIMEOUT_S,
    GrpcTransport,
    HttpTransport,
    Transport,
)

__all__ = ["ProtocolName", "make_transport"]

ProtocolName = Literal["http", "grpc", "grpc-shm"]


def make_transport(
    protocol: ProtocolName,
    url: str | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    shm_capacity: ShmCapacity | None = None,
) -> Transport:
    """Build the transport for `protocol`, on its default port when `url` is None.

    ``grpc-shm`` is gRPC with system shared memory (client and server on one host);
    `shm_capacity` sizes its regions (default `ShmCapacity()`). Unlike the others it talks
    to the server at once: it registers its regions.
    """
    if protocol == "http":
        return HttpTransport(url or DEFAULT_HTTP_URL, timeout_s=timeout_s)
    if protocol == "grpc":
        return GrpcTransport(url or DEFAULT_GRPC_URL, timeout_s=timeout_s)
    if protocol == "grpc-shm":
        return GrpcShmTransport(url or DEFAULT_GRPC_URL, timeout_s=timeout_s, capacity=shm_capacity)
    raise ValueError(f"protocol must be 'http', 'grpc' or 'grpc-shm', got {protocol!r}")
