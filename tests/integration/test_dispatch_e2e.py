"""The `dispatch` ensemble on a live server, over HTTP and gRPC."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from dispatch_contract import CoordSystem
from dispatch_service.domain import geo
from dispatch_service.domain.candidates import select_candidates
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import REGIMES, generate_regime_window
from dispatch_service.ops.server import TritonServer
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from dispatch_service.pipeline.stacking import StackingSettings
from dispatch_service.routing.settings import FUSED_MODEL_NAME
from triton_helpers import (
    OUTPUT_NAMES,
    ROUTED_OUTPUT_NAMES,
    grpc_inputs,
    infer_grpc,
    infer_http,
    sim_window,
)

Arrays = dict[str, np.ndarray[Any, Any]]


@pytest.fixture(scope="module")
def window() -> Arrays:
    return sim_window(seed=2024, orders=64, riders=200)


@pytest.fixture(scope="module")
def http_result(http_client: httpclient.InferenceServerClient, window: Arrays) -> Arrays:
    return infer_http(http_client, window)


def test_server_is_ready_with_every_model(http_client: httpclient.InferenceServerClient) -> None:
    assert http_client.is_server_ready()
    for model in (
        "feature_encoder",
        "dispatch_model",
        "topk_resolver",
        "dispatch_router",
        "dispatch",
        FUSED_MODEL_NAME,
    ):
        assert http_client.is_model_ready(model), model


def assert_valid_answer(window: Arrays, result: Arrays) -> None:
    num_orders = len(window["ORDER_IDS"])
    rider_ids = window["RIDER_IDS"]
    topk_index = result["TOPK_RIDER_INDEX"]
    scores = result["TOPK_OBJECTIVES"][..., 0]  # TOPK_OBJECTIVE_COLUMNS: score first
    assert topk_index.shape[0] == num_orders and topk_index.shape[1] >= 1
    for b in range(num_orders):
        valid = topk_index[b] >= 0
        assert valid.all(), f"order {b} got fewer than K riders in a 200-rider window"
        assert len(set(topk_index[b].tolist())) == topk_index.shape[1], "riders repeat"
        assert np.all(np.diff(scores[b]) <= 0), "Top-K not sorted by score"
        assert np.all((scores[b] > 0) & (scores[b] <= 1))
    load, capacity = window["RIDER_FIELDS"][:, 2], window["RIDER_FIELDS"][:, 3]
    spare = np.maximum(capacity - load, 0)
    assigned = result["ASSIGNED_RIDER_INDEX"]
    counts = np.bincount(assigned[assigned >= 0], minlength=len(rider_ids))
    assert np.all(counts <= spare), "a rider is over capacity"
    for b in np.flatnonzero(assigned >= 0):
        # The assignment ranges over all candidates: a rider outside the Top-K list
        # ranks below it, so scores no more than the K-th.
        if assigned[b] in topk_index[b]:
            k = list(topk_index[b]).index(assigned[b])
            assert result["ASSIGNED_SCORE"][b] == pytest.approx(scores[b][k])
        else:
            assert result["ASSIGNED_SCORE"][b] <= scores[b][-1]
    assert (assigned >= 0).mean() > 0.9, "most orders of a well-supplied window are assigned"


def assert_same(a: Arrays, b: Arrays) -> None:
    for name in OUTPUT_NAMES:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_http_answer_is_valid(window: Arrays, http_result: Arrays) -> None:
    assert_valid_answer(window, http_result)


def test_grpc_and_http_json_agree_with_http_binary(
    window: Arrays,
    http_result: Arrays,
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    assert_same(http_result, infer_grpc(grpc_client, window))
    assert_same(http_result, infer_http(http_client, window, binary=False))


def test_repeated_calls_give_identical_answers(
    window: Arrays, http_result: Arrays, grpc_client: grpcclient.InferenceServerClient
) -> None:
    for _ in range(3):
        assert_same(http_result, infer_grpc(grpc_client, window))


def test_server_wiring_gives_the_in_process_librarys_answer(
    window: Arrays, http_result: Arrays
) -> None:
    """Wiring, not correctness: the same steps served or in process give the same answer
    (the steps' correctness is tested against independent references in tests/unit)."""
    local = DispatchPipeline.from_repository().run(window)
    for name in OUTPUT_NAMES:
        if local[name].dtype.kind == "f":
            np.testing.assert_allclose(http_result[name], local[name], rtol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(http_result[name], local[name], err_msg=name)


@pytest.mark.parametrize("seed", [2024, 7, 8])
def test_the_fused_entry_point_answers_exactly_like_the_ensemble(
    seed: int,
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    window = sim_window(seed=seed, orders=1 + seed % 50, riders=40 + seed % 200)
    window["MODEL_VERSION_TAG"] = np.array([b"canary" if seed % 2 else b"stable"], dtype=object)
    ensemble = infer_http(http_client, window, output_names=ROUTED_OUTPUT_NAMES)
    for fused in (
        infer_http(http_client, window, model=FUSED_MODEL_NAME, output_names=ROUTED_OUTPUT_NAMES),
        infer_grpc(grpc_client, window, model=FUSED_MODEL_NAME, output_names=ROUTED_OUTPUT_NAMES),
    ):
        for name in ROUTED_OUTPUT_NAMES:
            np.testing.assert_array_equal(fused[name], ensemble[name], err_msg=name)
    expected_version = 2 if seed % 2 else 1
    assert (ensemble["ORDER_MODEL_VERSION"] == expected_version).all()


@pytest.mark.parametrize("tag", [b"stable", b"canary"])
def test_stacked_orders_are_priced_alike_by_both_entry_points(
    tag: bytes,
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    """A scarce window (riders take several new orders): the ensemble's resolver re-scores
    the stacked pairs through BLS with the version that scored each order, dispatch_fused in
    process, and both give the in-process library's stack-aware answer for that version,
    which is not the answer with stand-alone objectives."""
    window = sim_window(seed=12, orders=48, riders=12)
    window["MODEL_VERSION_TAG"] = np.array([tag], dtype=object)
    ensemble = infer_http(http_client, window, output_names=ROUTED_OUTPUT_NAMES)
    fused = infer_grpc(
        grpc_client, window, model=FUSED_MODEL_NAME, output_names=ROUTED_OUTPUT_NAMES
    )
    for name in ROUTED_OUTPUT_NAMES:
        np.testing.assert_array_equal(fused[name], ensemble[name], err_msg=name)
    version = 2 if tag == b"canary" else 1
    assert (ensemble["ORDER_MODEL_VERSION"] == version).all()
    library = DispatchPipeline.from_repository(model_version=version)
    stand_alone = replace(
        library, resolver=replace(library.resolver, stacking=StackingSettings(False))
    )
    local = library.run(window)
    for name in OUTPUT_NAMES:
        np.testing.assert_allclose(ensemble[name], local[name], rtol=1e-5, err_msg=name)
    plain = stand_alone.run(window)
    assert not np.array_equal(plain["TOPK_OBJECTIVES"], ensemble["TOPK_OBJECTIVES"])


def test_a_scarce_window_is_assigned_over_32_candidates_by_both_entry_points(
    http_client: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    """Riders with about one spare slot per order: the ensemble (feature_encoder's wider
    lists through the router and the resolver) and dispatch_fused give the in-process
    library's answer, in which some order rides with a rider beyond its 16 nearest."""
    scarce = generate_regime_window(np.random.default_rng(3), REGIMES["scarcity"])
    window = window_to_wire(scarce)
    ensemble = infer_http(http_client, window, output_names=ROUTED_OUTPUT_NAMES)
    fused = infer_grpc(
        grpc_client, window, model=FUSED_MODEL_NAME, output_names=ROUTED_OUTPUT_NAMES
    )
    for name in ROUTED_OUTPUT_NAMES:
        np.testing.assert_array_equal(fused[name], ensemble[name], err_msg=name)
    local = DispatchPipeline.from_repository().run(window)
    for name in OUTPUT_NAMES:
        np.testing.assert_allclose(ensemble[name], local[name], rtol=1e-5, err_msg=name)
    nearest = select_candidates(scarce, 16)
    assigned = ensemble["ASSIGNED_RIDER_INDEX"]
    beyond = (assigned >= 0) & ~(nearest == assigned[:, None]).any(axis=1)
    assert beyond.any()


def test_objective_weights_override_per_request(
    window: Arrays, http_result: Arrays, grpc_client: grpcclient.InferenceServerClient
) -> None:
    cost_only = dict(window, OBJECTIVE_WEIGHTS=np.array([0.0, 0.0, 1.0], dtype=np.float32))
    result = infer_grpc(grpc_client, cost_only)
    assert_valid_answer(window, result)
    costs = result["TOPK_OBJECTIVES"][..., 3]
    assert np.all(np.diff(costs, axis=1) >= -1e-6), "cost-only weights rank by cost"
    assert not np.array_equal(result["TOPK_RIDER_INDEX"], http_result["TOPK_RIDER_INDEX"])


@pytest.mark.parametrize("system", [CoordSystem.GCJ02, CoordSystem.BD09])
def test_chinese_datums_give_the_wgs84_answer(
    system: CoordSystem,
    window: Arrays,
    http_result: Arrays,
    grpc_client: grpcclient.InferenceServerClient,
) -> None:
    shifted = {name: np.array(value, copy=True) for name, value in window.items()}
    for name, columns in (("ORDER_FIELDS", (0, 2)), ("RIDER_FIELDS", (0,))):
        for first in columns:  # each [lat, lon] pair of columns
            pair = slice(first, first + 2)
            shifted[name][:, pair] = geo.from_wgs84(window[name][:, pair], system)
    shifted["WINDOW_FIELDS"][1] = float(system)  # coord_system
    assert not np.allclose(shifted["ORDER_FIELDS"], window["ORDER_FIELDS"], atol=1e-4)
    result = infer_grpc(grpc_client, shifted)
    np.testing.assert_array_equal(result["TOPK_RIDER_INDEX"], http_result["TOPK_RIDER_INDEX"])
    np.testing.assert_allclose(result["TOPK_OBJECTIVES"], http_result["TOPK_OBJECTIVES"], atol=1e-4)


@pytest.mark.parametrize("full_riders", [(), (1,), (0, 2), (0, 1, 2)])
def test_small_window_pads_after_the_feasible_riders(
    full_riders: tuple[int, ...], http_client: httpclient.InferenceServerClient
) -> None:
    """One order, three riders (K = min(top_k 5, 3 riders) = 3): the feasible riders first,
    then -1 / b"" / score 0 for each rider that is full."""
    window = sim_window(seed=5, orders=1, riders=3)
    window["ORDER_FIELDS"][:, 6] = 0  # constraints: any rider may carry it ...
    window["RIDER_FIELDS"][:, 2] = 0  # load
    window["RIDER_FIELDS"][:, 3] = 2  # capacity
    window["RIDER_FIELDS"][list(full_riders), 2] = 2  # ... unless full
    feasible = sorted(set(range(3)) - set(full_riders))
    n = len(feasible)
    result = infer_http(http_client, window)
    index = result["TOPK_RIDER_INDEX"][0]
    assert index.shape == (3,)
    assert sorted(index[:n].tolist()) == feasible
    assert index[n:].tolist() == [-1] * (3 - n)
    scores = result["TOPK_OBJECTIVES"][0][:, 0]
    assert (scores[:n] > 0).all() and (scores[n:] == 0).all()
    assigned = int(result["ASSIGNED_RIDER_INDEX"][0])
    assert assigned in feasible if feasible else assigned == -1


def _model_counts(client: grpcclient.InferenceServerClient, model: str) -> tuple[int, int]:
    """(successful requests, executions) of version 1 of `model` so far."""
    stats = client.get_inference_statistics(model, "1", as_json=True)["model_stats"][0]
    return int(stats["inference_stats"]["success"].get("count", 0)), int(
        stats.get("execution_count", 0)
    )


def test_concurrent_scoring_requests_are_batched_and_each_answered_like_onnxruntime(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """dispatch_model (dynamic batching, one instance) takes 16 requests sent at once in
    fewer executions, and still answers each request's rows as ONNX Runtime does alone.

    A large request goes first, so the instance is busy while the 16 arrive. Whether they
    meet in the queue still depends on timing: a burst that happened to be served one by one
    is sent again, at most three bursts in all."""
    import onnxruntime as ort

    from dispatch_service.core.paths import MODEL_REPOSITORY
    from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout

    encoder = DispatchPipeline.from_repository().encoder
    features = encoder.run(sim_window(seed=31, orders=256, riders=400))["PAIR_FEATURES"]
    reference = ort.InferenceSession(
        str(model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(1)),
        providers=["CPUExecutionProvider"],
    )
    # The most rows one execution takes (max_batch_size): the 16 then wait their turn.
    blocker = grpc_inputs(
        {"PAIR_FEATURES": np.resize(features, (32768, features.shape[1]))}, batch=False
    )
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    bursts = []
    try:
        for burst in range(3):
            rng = np.random.default_rng(burst)
            # Distinct rows and sizes per request, so rows mixed up between requests show.
            requests = [
                np.ascontiguousarray(features[rng.permutation(len(features))[: 1500 + 97 * i]])
                for i in range(16)
            ]
            # Built before the burst, so the requests leave back to back and meet in the queue.
            inputs = [grpc_inputs({"PAIR_FEATURES": rows}, batch=False) for rows in requests]
            busy: list[Any] = []
            before = _model_counts(grpc_client, "dispatch_model")
            client.async_infer(
                "dispatch_model",
                blocker,
                lambda result, error, out=busy: out.append((result, error)),
                model_version="1",
            )
            pending: list[list[Any]] = []
            for request in inputs:
                results: list[Any] = []
                pending.append(results)
                client.async_infer(
                    "dispatch_model",
                    request,  # pair rows are its batch
                    lambda result, error, out=results: out.append((result, error)),
                    model_version="1",
                )
            for rows, results in zip(requests, pending, strict=True):
                _wait(results)
                result, error = results[0]
                assert error is None, error
                expected = reference.run(["PAIR_OBJECTIVES"], {"PAIR_FEATURES": rows})[0]
                np.testing.assert_allclose(
                    result.as_numpy("PAIR_OBJECTIVES"), expected, rtol=1e-5, atol=1e-5
                )
            _wait(busy)
            assert busy[0][1] is None, busy[0][1]
            after = _model_counts(grpc_client, "dispatch_model")
            # The requests of the burst, the large one included, and their executions.
            bursts.append((after[0] - before[0], after[1] - before[1]))
            assert bursts[-1][0] == len(requests) + 1
            if bursts[-1][1] < bursts[-1][0]:
                break
    finally:
        client.close()
    print(f"\ndispatch_model (requests, executions) per burst: {bursts}")
    assert bursts[-1][1] < bursts[-1][0], f"(requests, executions) per burst: {bursts}"


def test_concurrent_windows_are_each_answered_like_the_in_process_library(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """Wiring under concurrency: answers do not cross between windows in flight together."""
    windows = [sim_window(seed=100 + i, orders=8 + i, riders=60) for i in range(6)]
    pipeline = DispatchPipeline.from_repository()
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        pending = []
        for window in windows:
            inputs = grpc_inputs(window)
            results: list[Any] = []
            pending.append(results)
            client.async_infer(
                "dispatch", inputs, lambda result, error, out=results: out.append((result, error))
            )
        for window, results in zip(windows, pending, strict=True):
            _wait(results)
            result, error = results[0]
            assert error is None, error
            expected = pipeline.run(window)
            np.testing.assert_array_equal(
                result.as_numpy("ASSIGNED_RIDER_INDEX")[0], expected["ASSIGNED_RIDER_INDEX"]
            )
    finally:
        client.close()


def _wait(results: list[Any], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not results and time.monotonic() < deadline:
        time.sleep(0.01)
    assert results, "no answer in time"
