"""What client text reaches the live server's log: a megabyte request id costs a few hundred
bytes of it, and an address the server refuses is in the client's answer, not in the log."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from dispatch_service.ops.server import TritonServer
from triton_helpers import grpc_inputs, sim_window

ENTRY_POINTS = ("dispatch", "dispatch_fused")
ADDRESS = "火星基地一号"  # Mars base one: no geocoder or gazetteer knows it


def refused(
    client: grpcclient.InferenceServerClient,
    model: str,
    tensors: dict[str, np.ndarray[Any, Any]],
    request_id: str,
) -> str:
    with pytest.raises(InferenceServerException) as caught:
        client.infer(model, grpc_inputs(tensors), request_id=request_id, client_timeout=60)
    return str(caught.value.message())


def let_the_rate_limit_refill() -> None:
    """Earlier tests' refusals on this session's server may have spent the per-instance
    budget of rejection lines (20 at once, then 1 a second): wait for one line's worth, so
    this test's own line is written."""
    time.sleep(2.0)


def log_after(triton: TritonServer, offset: int, marker: str) -> str:
    """The log written since ``offset``, once ``marker`` is in it (Triton writes it after
    answering)."""
    deadline = time.monotonic() + 10
    while True:
        with triton.log_path.open("rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        if marker in text or time.monotonic() > deadline:
            return text
        time.sleep(0.1)


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_a_megabyte_request_id_costs_a_few_hundred_bytes_of_log(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient, model: str
) -> None:
    bad = sim_window(seed=41, orders=2, riders=5)
    bad["ORDER_FIELDS"] = bad["ORDER_FIELDS"].copy()
    bad["ORDER_FIELDS"][0, 0] = 95.0  # pickup latitude
    huge = f"{model}-" + "x\n" * (1 << 19)  # 1 MB, with newlines that could forge lines
    let_the_rate_limit_refill()
    offset = triton.log_path.stat().st_size
    assert "latitude" in refused(grpc_client, model, bad, huge)
    written = log_after(triton, offset, "request_rejected")
    # Earlier refusals on this server may add a `log_lines_dropped` summary before it.
    lines = written.splitlines()
    rejected = [line for line in lines if "request_rejected" in line]
    assert len(rejected) == 1, written  # one line: the newlines sent are escaped
    assert len(rejected[0].encode()) < 1000, rejected[0]
    assert f"{model}-x" in rejected[0] and f"...[{len(huge)} chars]" in rejected[0]
    assert all("request_rejected" in line or "log_lines_dropped" in line for line in lines)


@pytest.mark.parametrize("model", ENTRY_POINTS)
def test_an_unknown_address_is_answered_to_the_client_but_not_logged(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient, model: str
) -> None:
    window = sim_window(seed=42, orders=3, riders=5)
    window["ORDER_FIELDS"] = window["ORDER_FIELDS"].copy()
    window["ORDER_FIELDS"][1, 0:2] = np.nan  # no pickup coordinates: the address decides
    text = np.full((3, 4), b"", dtype=object)  # user_id, pickup, drop-off address, city
    text[:, 0] = window["ORDER_TEXT"][:, 0]
    text[1, 1] = ADDRESS.encode()
    window["ORDER_TEXT"] = text
    let_the_rate_limit_refill()
    offset = triton.log_path.stat().st_size
    message = refused(grpc_client, model, window, f"address-{model}")
    assert ADDRESS in message  # the client sees its own address named
    written = log_after(triton, offset, f"address-{model}")
    assert f"address-{model}" in written and "request_rejected" in written
    assert ADDRESS not in written and "u706b" not in written  # 火, raw or escaped
