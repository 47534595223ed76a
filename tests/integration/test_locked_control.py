"""The control plane is locked in every server the launcher starts.

Over HTTP and gRPC, every endpoint of the restricted groups (model-repository, logging,
trace: the admin key; shared-memory: its own key) is refused without a key and with a wrong
one, and answers with the right one (read-only calls only: this is the session's shared
server). A load that uploads a `model.py` is refused; shared-memory registration is refused
with the admin key, which is not the shared-memory key.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from dispatch_client.keys import ADMIN_KEY_HEADER, SHM_KEY_HEADER, grpc_headers
from dispatch_service.core.repository_layout import model_layout
from dispatch_service.ops.server import TritonServer

EVIL_MODEL = b"""
import os
class TritonPythonModel:
    def initialize(self, args):
        open("/tmp/dispatch-pwned", "w").write(str(os.getpid()))
"""
EVIL_CONFIG = json.dumps({"backend": "python", "max_batch_size": 0, "input": [], "output": []})
_EVIL = model_layout(Path("repository"), "evil")
# The load request's key for the uploaded model.py: "file:" and its path in the model folder.
EVIL_FILE = f"file:{_EVIL.python_model(1).relative_to(_EVIL.folder).as_posix()}"

# (group, method, path, body): every endpoint of the restricted groups Triton 2.51 serves.
HTTP_ENDPOINTS = [
    ("model-repository", "POST", "/v2/repository/index", {}),
    ("model-repository", "POST", "/v2/repository/models/dispatch/unload", {}),
    ("model-repository", "POST", "/v2/repository/models/topk_resolver/load", {}),
    (
        "model-repository",
        "POST",
        "/v2/repository/models/evil/load",
        {
            "parameters": {
                "config": EVIL_CONFIG,
                EVIL_FILE: base64.b64encode(EVIL_MODEL).decode(),
            }
        },
    ),
    ("logging", "GET", "/v2/logging", None),
    ("logging", "POST", "/v2/logging", {"log_verbose_level": 1}),
    ("trace", "GET", "/v2/trace/setting", None),
    ("trace", "POST", "/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
    ("trace", "GET", "/v2/models/dispatch/trace/setting", None),
    ("shared-memory", "GET", "/v2/systemsharedmemory/status", None),
    (
        "shared-memory",
        "POST",
        "/v2/systemsharedmemory/region/probe/register",
        {"key": "/dispatchsrv_probe", "offset": 0, "byte_size": 64},
    ),
    ("shared-memory", "POST", "/v2/systemsharedmemory/region/probe/unregister", {}),
    ("shared-memory", "POST", "/v2/systemsharedmemory/unregister", {}),
    ("shared-memory", "GET", "/v2/cudasharedmemory/status", None),
    ("shared-memory", "POST", "/v2/cudasharedmemory/unregister", {}),
]
READ_ONLY = {
    ("POST", "/v2/repository/index"),
    ("GET", "/v2/logging"),
    ("GET", "/v2/trace/setting"),
    ("GET", "/v2/systemsharedmemory/status"),
}


def keys_of(server: TritonServer) -> dict[str, tuple[str, str]]:
    admin, shm = server.options.admin_key, server.options.shm_key
    assert admin and shm
    return {
        "model-repository": (ADMIN_KEY_HEADER, admin),
        "logging": (ADMIN_KEY_HEADER, admin),
        "trace": (ADMIN_KEY_HEADER, admin),
        "shared-memory": (SHM_KEY_HEADER, shm),
    }


def http_status(
    server: TritonServer, method: str, path: str, body: Any, headers: dict[str, str]
) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"http://{server.http_url}{path}", data=data, method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.parametrize(("group", "method", "path", "body"), HTTP_ENDPOINTS)
def test_http_refuses_every_restricted_endpoint_without_its_key(
    triton: TritonServer, group: str, method: str, path: str, body: Any
) -> None:
    header, key = keys_of(triton)[group]
    other = ADMIN_KEY_HEADER if header == SHM_KEY_HEADER else SHM_KEY_HEADER
    other_key = keys_of(triton)["shared-memory" if header == ADMIN_KEY_HEADER else "logging"][1]
    for headers in (
        {},
        {header: "not-the-key"},
        {header: key[:-1]},
        {other: other_key},  # the other group's key opens nothing here
        {header: other_key},
    ):
        assert http_status(triton, method, path, body, headers) == 403, (path, headers)
    if (method, path) in READ_ONLY:
        assert http_status(triton, method, path, body, {header: key}) == 200


def grpc_calls(client: grpcclient.InferenceServerClient) -> list[tuple[str, Callable[..., Any]]]:
    return [
        ("model-repository", lambda h: client.get_model_repository_index(headers=h)),
        ("model-repository", lambda h: client.unload_model("dispatch", headers=h)),
        (
            "model-repository",
            lambda h: client.load_model(
                "evil", config=EVIL_CONFIG, files={EVIL_FILE: EVIL_MODEL}, headers=h
            ),
        ),
        ("logging", lambda h: client.get_log_settings(headers=h)),
        ("logging", lambda h: client.update_log_settings({"log_verbose_level": 1}, headers=h)),
        ("trace", lambda h: client.get_trace_settings(headers=h)),
        (
            "trace",
            lambda h: client.update_trace_settings(settings={"trace_rate": "1"}, headers=h),
        ),
        ("shared-memory", lambda h: client.get_system_shared_memory_status(headers=h)),
        (
            "shared-memory",
            lambda h: client.register_system_shared_memory(
                "probe", "/dispatchsrv_probe", 64, headers=h
            ),
        ),
        ("shared-memory", lambda h: client.unregister_system_shared_memory(headers=h)),
        ("shared-memory", lambda h: client.get_cuda_shared_memory_status(headers=h)),
        ("shared-memory", lambda h: client.unregister_cuda_shared_memory(headers=h)),
    ]


READ_ONLY_GRPC = {0, 3, 5, 7}  # indices of grpc_calls that only read


def test_grpc_refuses_every_restricted_call_without_its_key(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    keys = keys_of(triton)
    for index, (group, call) in enumerate(grpc_calls(grpc_client)):
        header, key = keys[group]
        wrong = keys["shared-memory" if header == ADMIN_KEY_HEADER else "logging"][1]
        for headers in (
            None,
            grpc_headers(header, "not-the-key"),
            {header: key},  # without Triton's prefix the header is not the key
            grpc_headers(header, wrong),
        ):
            with pytest.raises(InferenceServerException) as info:
                call(headers)
            assert "restricted" in str(info.value).lower() or "header" in str(info.value), (
                group,
                index,
                str(info.value),
            )
        if index in READ_ONLY_GRPC:
            call(grpc_headers(header, key))


def test_an_uploaded_model_never_loaded(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """After the refused uploads above (and here), no model 'evil' exists and 'dispatch' serves."""
    with pytest.raises(InferenceServerException):
        grpc_client.load_model("evil", config=EVIL_CONFIG, files={EVIL_FILE: EVIL_MODEL})
    index = grpc_client.get_model_repository_index(
        headers=grpc_headers(ADMIN_KEY_HEADER, keys_of(triton)["logging"][1])
    )
    assert "evil" not in {model.name for model in index.models}
    assert grpc_client.is_model_ready("dispatch")


def test_the_admin_key_does_not_register_shared_memory(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    admin = keys_of(triton)["logging"][1]
    with pytest.raises(InferenceServerException):
        grpc_client.register_system_shared_memory(
            "probe", "/dispatchsrv_probe", 64, headers=grpc_headers(ADMIN_KEY_HEADER, admin)
        )
    status = http_status(
        triton,
        "POST",
        "/v2/systemsharedmemory/region/probe/register",
        {"key": "/dispatchsrv_probe", "offset": 0, "byte_size": 64},
        {ADMIN_KEY_HEADER: admin},
    )
    assert status == 403
