"""Real tritonservers on free loopback ports for the whole integration session: `triton`,
which every module leaves as it was started, and `routing_triton`, whose routing and scoring
versions the modules that change them put back to the shipped state when they end (a start
is about 10 CPU-seconds of stubs: one start serves them all)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from dispatch_client.keys import SHM_KEY_ENV
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from fleet_helpers import ROUTING_ADMIN_KEY, apply_shipped


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


@pytest.fixture(scope="session")
def _routing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    log = tmp_path_factory.mktemp("routing") / "server.log"
    # A refused load leaves Triton counting one live model at exit: wait 3 s for it, not 10.
    options = ServerOptions(
        ports=Ports.free(),
        admin_key=ROUTING_ADMIN_KEY,
        extra_args=("--exit-timeout-secs=3",),
        live_routing=True,
    )
    with TritonServer(TritonRuntime.from_venv(), options, log) as started:
        yield started
    print(f"routing tritonserver log: {log}")


@pytest.fixture(scope="module")
def routing_triton(_routing_server: TritonServer) -> Iterator[TritonServer]:
    """A server routed as a fleet replica's launcher routes it (`fleet_helpers.
    apply_revision`: versions loaded, the live routing file written, versions retired), in
    the shipped state when a module starts; the module's changes are undone when it ends."""
    yield _routing_server
    apply_shipped(_routing_server, ROUTING_ADMIN_KEY)
