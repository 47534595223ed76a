"""A real tritonserver on free loopback ports for the whole integration session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from dispatch_client.keys import SHM_KEY_ENV
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    runtime = TritonRuntime.from_venv()
    log = tmp_path_factory.mktemp("triton") / "server.log"
    server = TritonServer(runtime, ServerOptions(ports=Ports.free()), log)
    # The server locks its control groups with fresh keys; shared-memory clients (the shm
    # transport, the CLI, child processes) read the shm key from the environment.
    assert server.options.shm_key is not None
    saved = os.environ.get(SHM_KEY_ENV)
    os.environ[SHM_KEY_ENV] = server.options.shm_key
    try:
        with server:
            yield server
    finally:
        if saved is None:
            os.environ.pop(SHM_KEY_ENV, None)
        else:
            os.environ[SHM_KEY_ENV] = saved
    print(f"tritonserver log: {log}")


@pytest.fixture(scope="session")
def http_client(triton: TritonServer) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(triton.http_url, network_timeout=120.0)
    yield client
    client.close()


@pytest.fixture(scope="session")
def grpc_client(triton: TritonServer) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    yield client
    client.close()
