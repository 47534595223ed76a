"""Priority is an entitlement: the lane `dispatch_priority` serves only windows sent with the
priority key, and callers without it cannot take precedence from those who hold it.

- the lane refuses a window without the key (INVALID_ARGUMENT / HTTP 400 naming the header)
  and serves it with the key, as a gRPC or HTTP header (Triton forwards it to the model);
- `DispatchClient` sends its level-1 windows to the lane only with the key; without it they
  go out at level 2 to the entry point;
- callers without the key flooding level 1 (into the lane and into `dispatch_fused`): the
  keyed client's windows are answered (>= 99 %) and a level-2 client on `dispatch_fused` is
  answered, not held behind the flood. ``DISPATCH_FLOODERS`` callers (default 24;
  `make test-hostile`: 192). The latencies are printed, not asserted (pytest -s).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from dispatch_client import DispatchClient
from dispatch_contract.keys import PRIORITY_KEY_HEADER
from dispatch_service.ops.server import TritonServer
from perf.priority_flood import timed_calls
from triton_helpers import (
    OUTPUT_NAMES,
    grpc_inputs,
    infer_grpc,
    model_count,
    settled_count,
    sim_window,
)

LANE = "dispatch_priority"
FUSED = "dispatch_fused"
FLOODERS = int(os.environ.get("DISPATCH_FLOODERS", "24"))
KEYED_CALLS = 100


SUCCESS = "nv_inference_request_success"
EXECUTIONS = "nv_inference_exec_count"


def logical(window: dict[str, Any]) -> dict[str, Any]:
    from dispatch_service.domain.window_wire import window_tensors_from_wire

    return window_tensors_from_wire(window)


def test_the_lane_serves_only_windows_sent_with_the_priority_key(triton: TritonServer) -> None:
    window = sim_window(seed=21, orders=3, riders=10)
    key = {PRIORITY_KEY_HEADER: str(triton.priority_key)}
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        expected = infer_grpc(client, window, FUSED)
        for headers in (None, {PRIORITY_KEY_HEADER: "a guess"}):
            with pytest.raises(InferenceServerException) as refused:
                infer_grpc(client, window, LANE, headers=headers)
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT", refused.value
            assert f"'{PRIORITY_KEY_HEADER}'" in str(refused.value.message())
        got = infer_grpc(client, window, LANE, headers=key)
        np.testing.assert_array_equal(got["TOPK_RIDER_INDEX"], expected["TOPK_RIDER_INDEX"])
    with httpclient.InferenceServerClient(triton.http_url) as http:
        inputs = []
        for name, value in window.items():
            array = np.asarray(value)[np.newaxis]
            item = httpclient.InferInput(name, list(array.shape), _dtype(array))
            item.set_data_from_numpy(array, binary_data=True)
            inputs.append(item)
        with pytest.raises(InferenceServerException) as refused:
            http.infer(LANE, inputs)
        assert refused.value.status() == "400", refused.value
        assert http.infer(LANE, inputs, headers=key).as_numpy("TOPK_RIDER_INDEX") is not None


def test_the_lane_refuses_level_1_before_any_stub_works_on_it(triton: TritonServer) -> None:
    """The lane's precedence is its own stubs, at its default level: a window claiming level 1
    there, key or not, is refused by Triton's queue at once (UNAVAILABLE), never handed to a
    stub (refused by the stubs instead, a flood of them went ahead of every keyed window)."""
    window = sim_window(seed=25, orders=3, riders=10)
    key = {PRIORITY_KEY_HEADER: str(triton.priority_key)}
    with grpcclient.InferenceServerClient(triton.grpc_url) as client:
        before = model_count(triton.metrics_url, EXECUTIONS, LANE)
        for headers in (None, key):
            for _ in range(5):
                with pytest.raises(InferenceServerException) as refused:
                    client.infer(LANE, grpc_inputs(window), priority=1, headers=headers)
                assert refused.value.status() == "StatusCode.UNAVAILABLE", refused.value
        got = infer_grpc(client, window, LANE, headers=key)  # its default level: served
        assert got["TOPK_RIDER_INDEX"] is not None
        # the served window counted, and nothing else (none of the 10 refused reached a stub)
        assert (
            settled_count(triton.metrics_url, EXECUTIONS, LANE, at_least=before + 1) == before + 1
        )


def _dtype(array: np.ndarray[Any, Any]) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return str(np_to_triton_dtype(array.dtype))


def test_the_client_sends_level_1_to_the_lane_only_with_the_key(triton: TritonServer) -> None:
    window = logical(sim_window(seed=22, orders=3, riders=10))
    before = {model: model_count(triton.metrics_url, SUCCESS, model) for model in (LANE, FUSED)}
    with DispatchClient.grpc(
        triton.grpc_url, model_name=FUSED, priority=1, priority_key=triton.priority_key
    ) as keyed:
        keyed.dispatch(window)
    with DispatchClient.grpc(triton.grpc_url, model_name=FUSED, priority=1) as unkeyed:
        unkeyed.dispatch(window)  # at level 2, to dispatch_fused
    for model in (LANE, FUSED):
        after = settled_count(triton.metrics_url, SUCCESS, model, at_least=before[model] + 1)
        assert after - before[model] == 1, model


@contextmanager
def flood(triton: TritonServer, models: tuple[str, ...]) -> Iterator[Counter[str]]:
    """FLOODERS callers without the key, each on its own channel, sending level-1 windows
    to ``models`` in turn as fast as they are answered; what they got, by outcome."""
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    inputs = grpc_inputs(sim_window(seed=23, orders=2, riders=8))
    outputs = [grpcclient.InferRequestedOutput(n) for n in OUTPUT_NAMES]

    def caller(n: int) -> None:
        with grpcclient.InferenceServerClient(triton.grpc_url) as client:
            while not stop.is_set():
                model = models[n % len(models)]
                try:
                    client.infer(model, inputs, outputs=outputs, priority=1, client_timeout=10)
                    kind = f"{model} served"
                except InferenceServerException as exc:
                    kind = f"{model} {exc.status()}"
                with lock:
                    outcomes[kind] += 1

    threads = [threading.Thread(target=caller, args=(n,), daemon=True) for n in range(FLOODERS)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)  # the flood is on before anything is measured
        yield outcomes
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)


def p99_ms(seconds: list[float | None]) -> float:
    answered = [s for s in seconds if s is not None]
    return float(np.percentile(answered, 99) * 1000) if answered else float("nan")


def test_a_flood_without_the_key_takes_no_precedence(triton: TritonServer) -> None:
    window = logical(sim_window(seed=24, orders=4, riders=12))
    keyed = DispatchClient.grpc(
        triton.grpc_url, model_name=FUSED, priority=1, priority_key=triton.priority_key
    )
    standard = DispatchClient.grpc(triton.grpc_url, model_name=FUSED, deadline_ms=1000)
    with keyed, standard:
        unloaded = timed_calls(keyed, window, 30)
        with flood(triton, (LANE, FUSED)) as outcomes:
            lane = timed_calls(keyed, window, KEYED_CALLS)
            level_2 = timed_calls(standard, window, KEYED_CALLS // 2)
    answered = sum(s is not None for s in lane)
    served_2 = sum(s is not None for s in level_2)
    print(
        f"\n{FLOODERS} callers without the key flooding level 1 ({dict(outcomes)}): keyed "
        f"level-1 client answered {answered}/{len(lane)}, p99 {p99_ms(lane):.1f} ms "
        f"(unloaded {p99_ms(unloaded):.1f} ms); level-2 client on {FUSED} answered "
        f"{served_2}/{len(level_2)}, p99 {p99_ms(level_2):.1f} ms"
    )
    assert sum(outcomes.values()) > len(lane), outcomes  # the flood was on
    assert answered >= 0.99 * len(lane)
    assert served_2 >= 0.99 * len(level_2)
