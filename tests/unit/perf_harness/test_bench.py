"""The pure parts of the benchmark (perf/): files, parsing, statistics, ratios, report.

No server and no timing here: `make bench` measures; these tests hold the bookkeeping.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatch_client.window_json import window_from_json
from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS, pack_window
from dispatch_service.core.model_config import read_model_config
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import model_layout
from dispatch_service.routing.settings import FUSED_MODEL_NAME
from perf.bench import FULL, QUICK, source_revision
from perf.bodies import (
    OUTPUT_NAMES,
    decode_arrays,
    decode_triton_json_answer,
    encode_arrays,
    fastapi_arrays_body,
    fastapi_window_body,
    triton_binary_body,
    triton_infer_path,
    triton_json_body,
)
from perf.levels import PA_ENTRIES, Endpoints, pa_job
from perf.loadgen import LoadPlan, require_loopback
from perf.locust_run import parse_locust_stats
from perf.pa import (
    PaJob,
    output_shm_size,
    parse_csv,
    parse_request_count,
    parse_server_breakdown,
    read_input_data,
    tensor_entry,
    wire_bytes,
    write_input_data,
)
from perf.report import render_report
from perf.results import ENSEMBLE_MODEL, ENTRY_POINTS, FUSED_MODEL, BenchResults, Series
from perf.stats import LevelStats, LimitStats, level_stats, request_budget
from perf.targets import compute_ratios, compute_targets, goal_targets, storm_checks, summary
from perf.tuning import append_log, metric_key, noise_percent, tuning_entry
from perf.variants import (
    TUNING_LOG,
    ConfigOverride,
    config_digest,
    parse_override,
    patched_repository,
)
from perf.windows import SIZES, WindowSize, neutral_inputs, optional_inputs, simulated_windows
from perf.workload import Workload, check_answer

PA_CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
    "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,"
    "p50 latency,p90 latency,p95 latency,p99 latency\n"
    "1,61.9768,10,442,1,120,6875,779,9,7485,9163,13854,18398\n"
)

LOCUST_STATS = (
    "Type,Name,Request Count,Failure Count,Median Response Time,Average Response Time,"
    "Min Response Time,Max Response Time,Average Content Size,Requests/s,Failures/s,50%,66%,"
    "75%,80%,90%,95%,98%,99%,99.9%,99.99%,100%\n"
    "POST,dispatch,1155,0,30,33.06,12,161,1649.25,231.53,0.0,30,34,37,40,46,54,86,110,140,160,160\n"
    ",Aggregated,1155,2,30,33.06,12,161,1649.25,231.53,0.0,30,34,37,40,46,54,86,110,140,160,160\n"
)

TINY = WindowSize("tiny", 3, 7, 2)


@pytest.fixture(scope="module")
def windows() -> list[dict[str, Any]]:
    return simulated_windows(TINY, ("OBJECTIVE_WEIGHTS", "MODEL_VERSION_TAG"))


# ---- windows ------------------------------------------------------------------------------


def test_simulated_windows_are_deterministic_and_carry_neutral_optional_inputs() -> None:
    first = simulated_windows(TINY, ("OBJECTIVE_WEIGHTS",))
    again = simulated_windows(TINY, ("OBJECTIVE_WEIGHTS",))
    assert len(first) == TINY.count
    for a, b in zip(first, again, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            assert np.array_equal(a[name], b[name])
    assert first[0]["ORDER_IDS"].shape == (3,) and first[0]["RIDER_IDS"].shape == (7,)
    assert first[0]["OBJECTIVE_WEIGHTS"].dtype == np.float32
    np.testing.assert_allclose(first[0]["OBJECTIVE_WEIGHTS"], DEFAULT_OBJECTIVE_WEIGHTS)
    assert first[0]["ORDER_FIELDS"].shape == (3, 7)  # contract v2, without the batch dimension
    assert not np.array_equal(first[0]["ORDER_FIELDS"], first[1]["ORDER_FIELDS"])


def test_neutral_inputs_refuse_an_optional_input_without_a_value() -> None:
    assert neutral_inputs(["MODEL_VERSION_TAG"])["MODEL_VERSION_TAG"].tolist() == [b"stable"]
    with pytest.raises(ValueError, match="NEW_KNOB"):
        neutral_inputs(["NEW_KNOB"])


def test_optional_inputs_are_read_from_the_ensemble_config() -> None:
    names = optional_inputs(MODEL_REPOSITORY)
    assert "OBJECTIVE_WEIGHTS" in names
    assert "ORDER_IDS" not in names
    neutral_inputs(names)  # every optional input of the served ensemble has a value
    # The same list for the plain model, which declares only the contract's optional ones.
    assert names == optional_inputs(MODEL_REPOSITORY, "dispatch_fused")


def test_sizes_match_the_targets() -> None:
    assert [(s.orders, s.riders) for s in SIZES.values()] == [(1, 20), (64, 200), (1000, 5000)]


# ---- perf_analyzer input data and sizing -----------------------------------------------------


def test_input_data_file_round_trips_bytes_and_fp64_exactly(
    tmp_path: Path, windows: list[dict[str, Any]]
) -> None:
    tricky = dict(windows[0])
    tricky["ORDER_FIELDS"] = np.array(tricky["ORDER_FIELDS"], copy=True)
    tricky["ORDER_FIELDS"][:, :2] = np.array(
        [[0.1, 1 / 3], [-89.999999999999, 179.12345678901234], [31.2304, 121.4737]]
    )
    tricky["ORDER_IDS"] = np.array([b"o-1", "订单-2".encode(), b"o-3"], dtype=object)
    tricky["ORDER_PROMISED_MINUTES"] = np.array([30.1, 45.7, 0.3], dtype=np.float32)
    path = tmp_path / "input.json"
    size = write_input_data(path, [tricky, windows[1]])
    assert size == path.stat().st_size
    back = read_input_data(path.read_text())
    assert len(back) == 2
    for original, read in zip([tricky, windows[1]], back, strict=True):
        assert original.keys() == read.keys()
        for name, array in original.items():
            assert read[name].shape == array.shape, name
            if array.dtype.kind == "O":
                assert read[name].dtype == object
                assert read[name].tolist() == array.tolist(), name
            else:
                assert read[name].dtype == array.dtype, name
                assert np.array_equal(read[name], array), name  # bit-exact, no tolerance


def test_tensor_entry_is_flat_row_major_with_shape() -> None:
    entry = tensor_entry(np.array([[1.5, 2.0], [3.0, 4.25]]))
    assert entry == {"content": [1.5, 2.0, 3.0, 4.25], "shape": [2, 2]}
    assert tensor_entry(np.array([b"WGS84"], dtype=object)) == {"content": ["WGS84"], "shape": [1]}


def test_wire_bytes_and_output_shm_size() -> None:
    ids = np.array([b"ab", b""], dtype=object)
    assert wire_bytes(ids) == 4 + 2 + 4 + 0
    assert wire_bytes(np.zeros((5, 2), dtype=np.float32)) == 40
    assert output_shm_size([]) == 4096
    assert output_shm_size([{"A": np.zeros(10, dtype=np.float32)}]) == 4096
    big = {"A": np.zeros(10_000, dtype=np.float32), "B": np.zeros(3, dtype=np.int32)}
    # 40,000 bytes x 1.25 = 50,000 -> 13 pages of 4 KiB
    assert output_shm_size([big], margin=1.25) == 13 * 4096


def test_pa_job_arguments() -> None:
    job = PaJob(
        url="127.0.0.1:8001",
        protocol="grpc",
        input_data=Path("in.json"),
        concurrency=16,
        request_count=400,
        csv_path=Path("out.csv"),
        shared_memory="system",
        output_shm_size=8192,
    )
    args = job.arguments()
    assert args[args.index("-i") + 1] == "grpc"
    assert args[args.index("--concurrency-range") + 1] == "16:16"
    assert args[args.index("--measurement-request-count") + 1] == "134"  # 400 / 3 windows
    assert args[args.index("--shared-memory") + 1] == "system"
    assert args[args.index("--output-shared-memory-size") + 1] == "8192"
    plain = PaJob("127.0.0.1:8000", "http", Path("in.json"), 1, 10, Path("o.csv")).arguments()
    assert "--shared-memory" not in plain


def test_pa_job_always_measures_in_count_windows() -> None:
    # --request-count's CSV reads 50 requests in 0.4 s as 50/s (perf.pa notes): never used.
    job = PaJob("127.0.0.1:8000", "http", Path("in.json"), 64, 300, Path("o.csv"))
    args = job.arguments()
    assert "--request-count" not in args
    assert args[args.index("--measurement-mode") + 1] == "count_windows"
    assert args[args.index("--measurement-request-count") + 1] == "100"
    assert args[args.index("--max-trials") + 1] == "6"
    small = PaJob("h:1", "http", Path("i"), 64, 64, Path("o")).arguments()
    assert small[small.index("--measurement-request-count") + 1] == "64"  # >= concurrency


def test_pa_job_rejects_bad_combinations() -> None:
    with pytest.raises(ValueError, match="gRPC only"):
        PaJob("h:1", "http", Path("i"), 1, 10, Path("o"), shared_memory="system")
    with pytest.raises(ValueError, match="request_count"):
        PaJob("h:1", "grpc", Path("i"), 8, 4, Path("o"))


def test_parse_csv_converts_microseconds() -> None:
    (row,) = parse_csv(PA_CSV)
    assert row.concurrency == 1
    assert row.throughput_per_s == pytest.approx(61.9768)
    assert (row.p50_ms, row.p90_ms, row.p95_ms, row.p99_ms) == pytest.approx(
        (7.485, 9.163, 13.854, 18.398)
    )


def test_parse_request_count_reads_the_client_block() -> None:
    output = (
        "*** Measurement Settings ***\n  Minimum number of samples in each window: 150\n"
        "Request concurrency: 64\n  Client: \n    Request count: 1130\n"
        "    Throughput: 370.393 infer/sec\n  Server: \n    Inference count: 1131\n"
    )
    assert parse_request_count(output) == 1130
    assert parse_request_count("error: no server") is None


PA_OUTPUT = """\
  Server:
    Inference count: 488
    Avg request latency: 5858 usec (overhead 0 usec + queue 128 usec + compute 5744 usec)

  Composing models:
  dispatch_router, version: 1
      Inference count: 489
      Execution count: 489
      Successful request count: 489
      Avg request latency: 2428 usec (overhead 2 usec + queue 49 usec + compute input 26 usec \
+ compute infer 2270 usec + compute output 80 usec)

  feature_encoder, version: 1
      Inference count: 489
      Avg request latency: 1687 usec (overhead 2 usec + queue 29 usec + compute input 36 usec \
+ compute infer 1549 usec + compute output 69 usec)

Inferences/Second vs. Client Average Batch Latency
"""


def test_parse_server_breakdown_reads_composing_models() -> None:
    steps = parse_server_breakdown(PA_OUTPUT)
    assert list(steps) == ["dispatch_router v1", "feature_encoder v1"]
    assert steps["dispatch_router v1"] == pytest.approx(
        {
            "total_ms": 2.428,
            "queue_ms": 0.049,
            "compute_infer_ms": 2.27,
            "compute_io_ms": 0.106,
            "overhead_ms": 0.002,
        }
    )
    assert parse_server_breakdown("Request concurrency: 1\n  Client:\n") == {}
    # an ensemble's own line has no input/infer/output split: nothing to key it by
    assert parse_server_breakdown(PA_OUTPUT, model="dispatch") == steps


PA_OUTPUT_SINGLE = """\
  Client:
    Request count: 1357
    Avg latency: 2194 usec (standard deviation 363 usec)
  Server:
    Inference count: 1356
    Execution count: 1356
    Successful request count: 1356
    Avg request latency: 2885 usec (overhead 2 usec + queue 44 usec + compute input 43 usec \
+ compute infer 2784 usec + compute output 11 usec)

Inferences/Second vs. Client Average Batch Latency
"""


def test_parse_server_breakdown_reads_a_single_model_under_its_name() -> None:
    # perf_analyzer 2.51 prints a non-ensemble model's split on the Server line, unnamed
    assert parse_server_breakdown(PA_OUTPUT_SINGLE, model="dispatch_fused") == {
        "dispatch_fused": pytest.approx(
            {
                "total_ms": 2.885,
                "queue_ms": 0.044,
                "compute_infer_ms": 2.784,
                "compute_io_ms": 0.054,
                "overhead_ms": 0.002,
            }
        )
    }
    assert parse_server_breakdown(PA_OUTPUT_SINGLE) == {}  # no name given


# ---- statistics ------------------------------------------------------------------------------


def test_level_stats_percentiles_and_throughput() -> None:
    latencies = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    row = level_stats(4, latencies, elapsed_s=2.0, errors=1)
    assert row.throughput_per_s == pytest.approx(50.0)
    assert row.p50_ms == pytest.approx(50.5)
    assert row.p99_ms == pytest.approx(99.01)
    assert (row.requests, row.errors, row.concurrency) == (100, 1, 4)
    assert LevelStats.from_dict(row.to_dict()) == row
    with pytest.raises(ValueError):
        level_stats(1, [], 1.0)


def test_request_budget_is_bounded_both_ways() -> None:
    assert request_budget(100.0, 3.0, 1) == 300
    assert request_budget(0.5, 3.0, 1) == 30  # floor
    assert request_budget(100.0, 3.0, 128) == 512  # 4 per stream
    assert request_budget(1e6, 3.0, 1) == 5000  # ceiling


# ---- request bodies --------------------------------------------------------------------------


def test_arrays_document_round_trips(windows: list[dict[str, Any]]) -> None:
    back = decode_arrays(json.loads(fastapi_arrays_body(windows[0]).data))
    assert back.keys() == windows[0].keys()
    for name, array in windows[0].items():
        assert back[name].shape == array.shape
        assert back[name].tolist() == array.tolist()
        if array.dtype.kind != "O":
            assert back[name].dtype == array.dtype
            assert back[name].flags.writeable
    with pytest.raises(ValueError, match="malformed"):
        decode_arrays({"tensors": {"X": {"dtype": "f8", "shape": [2], "b64": "!!"}}})
    with pytest.raises(ValueError, match="malformed"):
        decode_arrays({"nope": 1})


def test_triton_json_body_is_kserve_json(windows: list[dict[str, Any]]) -> None:
    body = triton_json_body(windows[0])
    document = json.loads(body.data)
    by_name = {entry["name"]: entry for entry in document["inputs"]}
    assert by_name["RIDER_FIELDS"]["datatype"] == "FP64"
    assert by_name["RIDER_FIELDS"]["shape"] == [1, 7, 6]  # one window per request
    assert len(by_name["RIDER_FIELDS"]["data"]) == 42
    assert by_name["ORDER_IDS"]["datatype"] == "BYTES"
    assert all(isinstance(v, str) for v in by_name["ORDER_IDS"]["data"])
    assert [o["name"] for o in document["outputs"]] == list(OUTPUT_NAMES)
    assert all(o["parameters"] == {"binary_data": False} for o in document["outputs"])
    assert body.headers["Content-Type"] == "application/json"


def test_triton_binary_body_has_json_header_length(windows: list[dict[str, Any]]) -> None:
    body = triton_binary_body(windows[0])
    header_length = int(body.headers["Inference-Header-Content-Length"])
    header = json.loads(body.data[:header_length])
    assert {entry["name"] for entry in header["inputs"]} == set(windows[0])
    raw = sum(e["parameters"]["binary_data_size"] for e in header["inputs"])
    assert len(body.data) == header_length + raw


def test_decode_triton_json_answer() -> None:
    answer = {
        "outputs": [
            {"name": "ASSIGNED_RIDER_IDS", "datatype": "BYTES", "shape": [2], "data": ["r1", ""]},
            {"name": "TOPK_SCORE", "datatype": "FP32", "shape": [2, 2], "data": [1, 0.5, 0, 0]},
        ]
    }
    arrays = decode_triton_json_answer(json.dumps(answer).encode())
    assert arrays["ASSIGNED_RIDER_IDS"].tolist() == [b"r1", b""]
    assert arrays["TOPK_SCORE"].dtype == np.float32 and arrays["TOPK_SCORE"].shape == (2, 2)


def test_fastapi_window_body_is_the_client_schema(windows: list[dict[str, Any]]) -> None:
    parsed = pack_window(window_from_json(fastapi_window_body(windows[0]).data))
    for name, array in parsed.items():
        assert np.array_equal(np.asarray(array), np.asarray(windows[0][name])), name


def test_encode_arrays_keeps_bytes_as_text() -> None:
    document = encode_arrays({"IDS": np.array([b"a", "骑手".encode()], dtype=object)})
    assert document["tensors"]["IDS"] == {"dtype": "BYTES", "shape": [2], "text": ["a", "骑手"]}


# ---- load generator bounds -------------------------------------------------------------------


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8000/v2", "http://localhost:1/x", "http://[::1]:80/"]
)
def test_loopback_urls_are_accepted(url: str) -> None:
    assert require_loopback(url) == url


@pytest.mark.parametrize(
    "url", ["http://10.0.0.1:8000/", "https://127.0.0.1/", "http://example.com/", "127.0.0.1:80"]
)
def test_other_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        require_loopback(url)


def test_load_plan_must_be_bounded() -> None:
    body = fastapi_arrays_body({"X": np.zeros(1)})
    with pytest.raises(ValueError):
        LoadPlan("http://127.0.0.1:1/", [body], 1, 0, 1.0)
    with pytest.raises(ValueError):
        LoadPlan("http://127.0.0.1:1/", [body], 1, 10, 0.0)
    with pytest.raises(ValueError):
        LoadPlan("http://127.0.0.1:1/", [], 1, 10, 1.0)


# ---- answers, locust -------------------------------------------------------------------------


def test_check_answer() -> None:
    expected = {
        "TOPK_RIDER_INDEX": np.array([[1, 0]], dtype=np.int32),
        "ASSIGNED_RIDER_INDEX": np.array([1], dtype=np.int32),
        "TOPK_OBJECTIVES": np.array([[[0.5, 20, 0.9, 7], [0.25, 30, 0.8, 9]]], dtype=np.float32),
    }
    assert check_answer(expected, dict(expected)) == ""
    moved = {**expected, "ASSIGNED_RIDER_INDEX": np.array([0], dtype=np.int32)}
    assert "ASSIGNED_RIDER_INDEX" in check_answer(expected, moved)
    assert "missing" in check_answer(expected, {"TOPK_OBJECTIVES": expected["TOPK_OBJECTIVES"]})


def test_parse_locust_stats_reads_the_aggregated_row() -> None:
    stats = parse_locust_stats(LOCUST_STATS)
    assert stats == {
        "requests": 1155,
        "failures": 2,
        "rps": pytest.approx(231.53),
        "p50_ms": 30.0,
        "p95_ms": 54.0,
        "p99_ms": 110.0,
    }
    with pytest.raises(ValueError):
        parse_locust_stats(LOCUST_STATS.splitlines()[0])


# ---- tuning overrides ------------------------------------------------------------------------


def test_parse_override() -> None:
    assert parse_override("dispatch_model.queue_delay_us=0") == ConfigOverride(
        "dispatch_model", "queue_delay_us", "0"
    )
    assert parse_override(" feature_encoder.instances = 3 ") == ConfigOverride(
        "feature_encoder", "instances", "3"
    )
    param = parse_override("dispatch_model.param.intra_op_num_threads=2")
    assert param == ConfigOverride("dispatch_model", "param", "2", "intra_op_num_threads")
    assert str(param) == "dispatch_model.param.intra_op_num_threads=2"
    for bad in ("x", "m.instances", "m.instances=two", "m.colour=1", "m.param=1", "m.param.k="):
        with pytest.raises(ValueError):
            parse_override(bad)


def test_patched_repository_changes_only_the_copy(tmp_path: Path) -> None:
    before = config_digest(MODEL_REPOSITORY)
    overrides = [
        parse_override("dispatch_model.queue_delay_us=0"),
        parse_override("feature_encoder.instances=1"),
        parse_override("dispatch_model.param.intra_op_num_threads=2"),
    ]
    copy = patched_repository(MODEL_REPOSITORY, tmp_path / "repo", overrides)
    after = config_digest(copy)
    assert after["dispatch_model"]["queue_delay_us"] == "0"
    assert after["feature_encoder"]["instances"] == "1"
    assert after["dispatch_model"]["intra_op_num_threads"] == "2"
    assert config_digest(MODEL_REPOSITORY) == before
    assert before["dispatch"] == {"kind": "ensemble"}
    with pytest.raises(ValueError, match="no model"):
        patched_repository(MODEL_REPOSITORY, tmp_path / "r2", [parse_override("nope.instances=1")])
    with pytest.raises(ValueError, match="dynamic_batching"):
        patched_repository(
            MODEL_REPOSITORY, tmp_path / "r3", [parse_override("dispatch.queue_delay_us=1")]
        )


def test_a_preferred_batch_override_sets_one_size_within_the_max(tmp_path: Path) -> None:
    override = parse_override(f"{FUSED_MODEL}.preferred_batch=32")
    copy = patched_repository(MODEL_REPOSITORY, tmp_path / "repo", [override])
    config = read_model_config(model_layout(copy, FUSED_MODEL).config)
    assert list(config.dynamic_batching.preferred_batch_size) == [32]
    assert config_digest(copy)[FUSED_MODEL]["preferred_batch"] == "32"
    too_big = parse_override(f"{FUSED_MODEL}.preferred_batch={config.max_batch_size + 1}")
    with pytest.raises(ValueError, match=r"preferred_batch must be 1\.\."):
        patched_repository(MODEL_REPOSITORY, tmp_path / "r2", [too_big])


@pytest.mark.parametrize(("total", "counts"), [(1, [1]), (2, [1, 1]), (6, [1, 5])])
def test_an_instances_override_sets_the_total_and_keeps_the_warm_instance_first(
    tmp_path: Path, total: int, counts: list[int]
) -> None:
    override = parse_override(f"{FUSED_MODEL}.instances={total}")
    copy = patched_repository(MODEL_REPOSITORY, tmp_path / "repo", [override])
    groups = read_model_config(model_layout(copy, FUSED_MODEL).config).instance_group
    assert [group.count for group in groups] == counts
    assert groups[0].rate_limiter.priority == 1  # the warm one stays where it was


def test_noise_percent_is_the_largest_relative_difference() -> None:
    assert noise_percent({"a": 100.0, "b": 10.0}, {"a": 90.0, "b": 12.0}) == pytest.approx(20.0)
    assert noise_percent({"a": 1.0}, {}) == 0.0


def test_the_committed_tuning_log_renders_in_the_bench_report() -> None:
    """`make bench` shows every entry's before -> after: each figure a number, as
    `tuning_entry` writes them (a hand-added note among them once broke the report)."""
    results = _results()
    results.tuning_log = json.loads(TUNING_LOG.read_text())
    text = render_report(results, {})
    for entry in results.tuning_log:
        assert entry["change"] in text
        assert all(isinstance(v, int | float) for v in entry["before"].values()), entry["change"]
        assert all(isinstance(v, int | float) for v in entry["after"].values()), entry["change"]


def test_tuning_log_entries_append(tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    key = metric_key("small", 64, "throughput_per_s")
    assert key == "small_c64_windows_per_s"
    entry = tuning_entry("x.instances=2", {key: 100.0}, {key: 120.0}, "2 cores", "2026-11-30")
    append_log(log, [entry])
    append_log(log, [entry])
    assert json.loads(log.read_text()) == [entry, entry]


# ---- the two Triton models -------------------------------------------------------------------


def test_fused_model_name_matches_the_service() -> None:
    assert FUSED_MODEL == FUSED_MODEL_NAME
    assert triton_infer_path(FUSED_MODEL) == "/v2/models/dispatch_fused/infer"


def test_every_perf_analyzer_transport_is_measured_for_both_models() -> None:
    assert {(ENTRY_POINTS[e].transport, ENTRY_POINTS[e].model) for e in PA_ENTRIES} == {
        (transport, model)
        for transport in ("grpc", "grpc_shm", "http_binary")
        for model in (ENSEMBLE_MODEL, FUSED_MODEL)
    }
    labels = [entry.label for entry in ENTRY_POINTS.values()]
    assert len(set(labels)) == len(labels)
    assert ENTRY_POINTS["fused_grpc"].label == "Triton gRPC, dispatch_fused"
    assert not ENTRY_POINTS["fastapi_json"].ours and ENTRY_POINTS["fused_http_json"].ours


@pytest.mark.parametrize("plan", [FULL, QUICK], ids=["full", "quick"])
def test_plans_measure_the_target_levels_for_both_models(plan: Any) -> None:
    for levels in (plan.pa_levels, plan.fused_pa_levels):  # grpc and grpc_shm share them
        assert {1, 64} <= set(levels["small"])
        assert 1 in levels["large"]


def test_pa_job_for_a_fused_entry(tmp_path: Path) -> None:
    workload = Workload(TINY, [], [], tmp_path / "in.json", 0, output_shm_size=8192)
    endpoints = Endpoints(grpc="127.0.0.1:8001", http="127.0.0.1:8000")
    shm = pa_job(
        "fused_grpc_shm", endpoints, workload, 1, request_count=10, out=tmp_path
    ).arguments()
    assert shm[shm.index("-m") + 1] == "dispatch_fused"
    assert shm[shm.index("-u") + 1] == "127.0.0.1:8001"
    assert shm[shm.index("--shared-memory") + 1] == "system"
    assert shm[shm.index("--output-shared-memory-size") + 1] == "8192"
    http = pa_job("fused_http_binary", endpoints, workload, 4, request_count=10, out=tmp_path)
    assert (http.model, http.protocol, http.url) == ("dispatch_fused", "http", "127.0.0.1:8000")
    assert http.csv_path.name == "pa_fused_http_binary_tiny_c4.csv"
    plain = pa_job("grpc", endpoints, workload, 1, request_count=10, out=tmp_path)
    assert (plain.model, plain.shared_memory) == ("dispatch", "none")
    with pytest.raises(ValueError, match="perf_analyzer"):
        pa_job("http_json", endpoints, workload, 1, request_count=10, out=tmp_path)


# ---- ratios, targets, report -----------------------------------------------------------------


def _row(concurrency: int, tput: float, p50: float, p99: float) -> LevelStats:
    return LevelStats(concurrency, tput, p50, p50 * 1.2, p99 * 0.9, p99, requests=100)


def _results() -> BenchResults:
    results = BenchResults(stamp="20261130-000000", mode="quick")
    results.windows = {
        "small": {"orders": 1, "riders": 20, "count": 16},
        "large": {"orders": 1000, "riders": 5000, "count": 3},
    }
    results.limits = {
        "small": LimitStats("small", 1, _row(1, 800.0, 1.2, 2.0), 2, 1500.0),
        "large": LimitStats("large", 1000, _row(1, 15.0, 65.0, 70.0), 2, 28.0),
    }
    results.series = [
        Series("grpc", "small", [_row(1, 500.0, 1.8, 4.0), _row(64, 1000.0, 60.0, 150.0)]),
        Series("grpc_shm", "small", [_row(1, 480.0, 1.9, 4.5)]),
        Series("fastapi_json", "small", [_row(1, 300.0, 3.0, 6.0), _row(64, 250.0, 250.0, 400.0)]),
        Series("grpc", "large", [_row(1, 12.0, 80.0, 120.0)]),
        Series("grpc_shm", "large", [_row(1, 13.0, 50.0, 90.0)], failures=["c=4: skipped"]),
        Series("fused_grpc", "small", [_row(1, 900.0, 1.5, 2.5), _row(64, 1200.0, 50.0, 200.0)]),
        Series("fused_grpc", "large", [_row(1, 14.0, 70.0, 90.0)]),
        Series("fused_grpc_shm", "large", [_row(1, 14.0, 63.0, 80.0)]),
        Series("fused_http_json", "small", [_row(64, 600.0, 100.0, 150.0)]),
    ]
    results.breakdown = {"small": parse_server_breakdown(PA_OUTPUT)}
    results.breakdown_fused = {"small": parse_server_breakdown(PA_OUTPUT_SINGLE, FUSED_MODEL)}
    results.tuning_log = [
        tuning_entry(
            "dispatch_model.queue_delay_us=0",
            {"small_c1_p50_ms": 2.0},
            {"small_c1_p50_ms": 1.5},
            "2 cores, load average 0.5",
            "2026-11-30",
        )
    ]
    return results


def test_ratios() -> None:
    ratios = {(r.name, r.model): r.values for r in compute_ratios(_results())}
    assert ratios["ours / limit, throughput", "dispatch"] == {
        "small": pytest.approx(1000 / 1500),
        "large": pytest.approx(12 / 28),
    }
    assert ratios["ours / limit, latency", "dispatch"]["small"] == pytest.approx(1.8 / 1.2)
    by_fastapi = "ours / FastAPI (window JSON), throughput"
    assert ratios[by_fastapi, "dispatch"]["small"] == pytest.approx(1000 / 300)
    assert ratios[by_fastapi, "dispatch"]["large"] is None
    assert ratios["shm / plain gRPC, latency", "dispatch"]["large"] == pytest.approx(50 / 80)
    # the same ratios from the fused model's own series
    assert ratios["ours / limit, throughput", "dispatch_fused"] == {
        "small": pytest.approx(1200 / 1500),
        "large": pytest.approx(14 / 28),
    }
    assert ratios["ours / limit, latency", "dispatch_fused"]["small"] == pytest.approx(1.5 / 1.2)
    assert ratios[by_fastapi, "dispatch_fused"]["small"] == pytest.approx(1200 / 300)
    json_ratio = "Triton HTTP JSON / FastAPI (window JSON), throughput"
    assert ratios[json_ratio, "dispatch_fused"]["small"] == pytest.approx(600 / 300)
    assert ratios[json_ratio, "dispatch"]["small"] is None  # not measured for the ensemble
    assert ratios["shm / plain gRPC, latency", "dispatch_fused"]["large"] == pytest.approx(63 / 70)
    assert ratios["shm / plain gRPC, latency", "dispatch_fused"]["small"] is None
    both = "dispatch_fused / dispatch"
    assert ratios["fused / ensemble, latency", both]["small"] == pytest.approx(1.5 / 1.8)
    assert ratios["fused / ensemble, throughput", both] == {
        "small": pytest.approx(1200 / 1000),
        "large": pytest.approx(14 / 12),
    }
    # every per-model ratio has a row for each model, the ensemble's first
    models = [r.model for r in compute_ratios(_results())]
    assert models[:14] == ["dispatch", "dispatch_fused"] * 7


def test_targets_are_today_s_goals_only() -> None:
    results = _results()
    results.floor = {
        "c1": _row(1, 1500.0, 0.62, 0.9).to_dict(),
        "c64": _row(64, 2000.0, 10.0, 12.0).to_dict(),
    }
    by_name = {t.name: t for t in compute_targets(results) if not t.robustness}
    assert {t.model for t in by_name.values()} == {"dispatch_fused"}
    # In process, 1 thread, per size (no medium limit measured here).
    small = by_name["small, in process, 1 thread: p50"]
    assert (small.measured, small.goal, small.met) == (1.2, "<= 0.25 ms", False)
    assert by_name["medium, in process, 1 thread: p50"].met is None
    large = by_name["large, in process, 1 thread: p50"]
    assert (large.measured, large.goal, large.met) == (65.0, "<= 33 ms", False)
    # Against the floor: c=64 throughput (one sweep level: no rounds here) and c=1 p50.
    c64 = by_name["small, gRPC, c=64: throughput / no-work floor"]
    assert c64.measured == pytest.approx(1200 / 2000) and c64.goal == ">= 0.8x"
    assert c64.met is False
    assert c64.detail == (
        "one level of the sweep (not in the alternating rounds); no-work floor: 2,000 "
        "windows/s; against FastAPI window JSON: 4.80x"
    )
    c1 = by_name["small, gRPC, c=1: p50 over the no-work floor's"]
    assert c1.measured == pytest.approx(1.5 - 0.62) and c1.goal == "<= 0.3 ms"
    assert c1.met is False
    assert c1.detail == (
        "the sweep's c=1 level and the floor's (not in the alternating rounds); p50 1.50 ms; "
        "no-work floor p50 0.62 ms; in process (1 thread, no serving) 1.20 ms"
    )
    # Kept (met today): single windows against FastAPI and in process, the open loop.
    assert "large, c=1: gRPC p50 / in-process p50" in by_name
    assert "open loop 1.5x: refusal p99 at the probe" in by_name
    # Retired goals are no longer in the table.
    for retired in (
        "small, gRPC, c=1: p50",
        "large, gRPC, c=1: p99",
        "small, gRPC, c=64: p99 / p50",
    ):
        assert retired not in by_name
    empty = compute_targets(BenchResults("s", "quick"))
    assert all(t.met is None and t.measured is None for t in empty)


def test_a_c1_goal_over_the_floor_is_met_within_its_margin() -> None:
    results = _results()
    results.floor = {"c1": _row(1, 1500.0, 1.3, 1.9).to_dict()}
    (c1,) = [t for t in goal_targets(results) if t.name.startswith("small, gRPC, c=1")]
    assert c1.measured == pytest.approx(0.2) and c1.met is True  # 1.5 ms against 1.3 + 0.3


def _overload_level(accepted: int, refused: int, p99: float, full_refusal_p99: float | None) -> Any:
    return {
        "accepted": accepted,
        "refused": refused,
        "accepted_per_s": accepted / 30,
        "accepted_p50_ms": p99 / 2,
        "accepted_p99_ms": p99,
        "refusal_p50_ms": full_refusal_p99,
        "refusal_p99_ms": full_refusal_p99,
        "queue_full_refusal_p99_ms": full_refusal_p99,
        "refusal_reasons": {"queue full": refused} if refused else {},
        "refusal_statuses": ["StatusCode.UNAVAILABLE"] if refused else [],
    }


def test_storm_checks_read_the_overload_runs() -> None:
    results = _results()
    results.floor = {
        "c1": _row(1, 1500.0, 0.62, 0.9).to_dict(),
        "c64": _row(64, 6000.0, 10.0, 12.0).to_dict(),
        "idle_cost": {
            "runs": [
                {"gap_ms": 0.0, "windows": 900, "cpu_us_per_window": 850.0},
                {"gap_ms": 2.0, "windows": 500, "cpu_us_per_window": 1510.0},
            ]
        },
    }
    results.overload = {
        "concurrency 64": {
            "next_request_served": True,
            "level_2": _overload_level(3000, 0, 250.0, None),
            "probe_level_2": _overload_level(60, 0, 100.0, None),
        },
        "overload": {
            "next_request_served": True,
            "level_2": _overload_level(900, 5000, 600.0, 150.0),
            "probe_level_2": _overload_level(10, 80, 250.0, 4.0),
        },
        "mixed-priority overload": {
            "next_request_served": False,
            "level_1": _overload_level(90, 0, 400.0, None),
            "level_3": _overload_level(800, 4000, 500.0, 200.0),
            "probe_level_1": _overload_level(30, 1, 150.0, 3.0),
            "probe_level_3": _overload_level(10, 90, 300.0, 12.0),
        },
    }
    by_name = {(t.name, t.model): t for t in storm_checks(results)}
    fused = "dispatch_fused"
    assert all(t.robustness for t in by_name.values())
    # Against the same generator at c=64, not perf_analyzer's p99 (200 ms): same client.
    accepted = by_name["overload c=512: accepted p99 / p99 at c=64", fused]
    assert accepted.measured == pytest.approx(600 / 250) and accepted.met is True
    assert "probe outside the generator: 2.50x" in accepted.detail
    # The probes' full-queue refusals (the bulk probe's 12 ms), the generator's beside them.
    refusal = by_name["overload c=512: refusal p99", fused]
    assert refusal.measured == pytest.approx(12.0) and refusal.met is False
    assert "generator's own: 200.0 ms" in refusal.detail
    assert by_name["overload: next request after each burst served", fused].met is False
    level_1 = by_name["mixed overload (10 % level-1 callers): level-1 refusals", fused]
    assert level_1.measured == 1 and level_1.met is False  # the probe's one refusal counts
    urgent = by_name["mixed overload: level-1 p99 / p99 at c=64", fused]
    assert urgent.measured == pytest.approx(400 / 250) and urgent.met is True
    assert "probe outside the generator: 1.50x" in urgent.detail
    assert all(t.met is None for t in storm_checks(BenchResults("s", "quick")))


def test_overload_targets_show_the_no_work_floor_under_the_same_runs() -> None:
    # The floor's own overload runs (perf.floor --overload-seconds): what the host allows a
    # model that does nothing, beside each overload target; the verdict stays the model's.
    results = _results()
    runs = {
        "concurrency 64": {
            "next_request_served": True,
            "level_2": _overload_level(9000, 0, 20.0, None),
            "probe_level_2": _overload_level(60, 0, 10.0, None),
        },
        "overload": {
            "next_request_served": True,
            "level_2": _overload_level(900, 5000, 580.0, 150.0),
            "probe_level_2": _overload_level(10, 80, 250.0, 30.0),
        },
        "mixed-priority overload": {
            "next_request_served": True,
            "level_1": _overload_level(90, 2, 300.0, 5.0),
            "level_3": _overload_level(800, 4000, 500.0, 200.0),
            "probe_level_1": _overload_level(30, 0, 60.0, None),
            "probe_level_3": _overload_level(10, 90, 300.0, 52.5),
        },
    }
    results.overload = {label: dict(run) for label, run in runs.items()}
    results.floor = {"overload": runs}
    by_name = {t.name: t for t in storm_checks(results)}
    accepted = by_name["overload c=512: accepted p99 / p99 at c=64"]
    assert accepted.measured == pytest.approx(29.0)  # 580 / 20
    assert accepted.detail.endswith("the no-work floor under the same load: 29.00x")
    refusal = by_name["overload c=512: refusal p99"]
    assert refusal.detail.endswith("the no-work floor under the same load: 52.50 ms")
    level_1 = by_name["mixed overload (10 % level-1 callers): level-1 refusals"]
    assert level_1.detail.endswith("the no-work floor under the same load: 2")
    urgent = by_name["mixed overload: level-1 p99 / p99 at c=64"]
    assert urgent.detail.endswith("the no-work floor under the same load: 15.00x")  # 300 / 20
    # Without the floor's runs nothing is added.
    results.floor = {}
    assert all("no-work floor under" not in t.detail for t in storm_checks(results))


def test_targets_of_one_model_do_not_use_the_other_models_series() -> None:
    results = _results()
    results.series = [s for s in results.series if not s.entry.startswith("fused_")]
    served = [t for t in compute_targets(results) if "gRPC" in t.name]
    assert served and all(t.measured is None and t.met is None for t in served)


def test_summary_round_trip() -> None:
    results = _results()
    document = json.loads(json.dumps(summary(results)))
    assert document["targets"][0]["name"] == "small, in process, 1 thread: p50"
    assert document["targets"][0]["met"] is False  # 1.2 ms against 0.25 ms
    assert document["targets"][1]["model"] == "dispatch_fused"
    assert "dispatch_fused" in document["server_breakdown_fused"]["small"]
    fused_series = [s for s in document["series"] if s["model"] == "dispatch_fused"]
    assert {s["entry"] for s in fused_series} == {"fused_grpc", "fused_grpc_shm", "fused_http_json"}
    again = BenchResults.from_dict(document)
    assert summary(again) == summary(results)
    old = {k: v for k, v in document.items() if k != "server_breakdown_fused"}  # schema 1
    assert BenchResults.from_dict(old).breakdown_fused == {}


def test_the_report_names_the_source_it_measured() -> None:
    results = _results()
    results.host["source"] = "1e18299b6c8d + changes"
    assert "Source: 1e18299b6c8d + changes. Host:" in render_report(results)
    found = source_revision()
    assert re.fullmatch(r"[0-9a-f]{12}( \+ changes)?|unknown", found), found


def test_the_report_says_where_a_windows_cpu_goes_by_stage() -> None:
    results = _results()
    results.window_cost = {
        "large": {"fused": 65000.0, "encode": 30000.0, "candidates": 12000.0},
        "small": {"fused": 480.0, "fused_general": 900.0, "encode": 350.0, "unpack": 60.5},
    }
    again = BenchResults.from_dict(json.loads(json.dumps(summary(results))))
    assert again.window_cost == results.window_cost
    text = render_report(again)
    assert "## Where a window's CPU goes (in process, 1 thread)" in text
    assert "| stage | small us | large us |" in text  # sizes in their order
    assert "| fused | 480.0 | 65,000.0 |" in text
    assert "| fused_general | 900.0 | n/a |" in text
    assert "| fused_general / encode / unpack | 60.5 | n/a |" in text
    assert "| fused_general / encode / candidates | n/a | 12,000.0 |" in text
    assert "onnx" not in text.split("## Where a window's CPU goes")[1].split("##")[0]
    assert "## Where a window's CPU goes" not in render_report(_results())


def test_render_report() -> None:
    text = render_report(_results(), {"small": "small.png"})
    assert text.startswith("# Benchmark: dispatch service (20261130-000000, quick run)")
    for heading in ("## Targets", "## Ratios", "## In-process limit", "## small", "## large"):
        assert heading in text
    assert "![small](small.png)" in text
    small = "| small, in process, 1 thread: p50 | `dispatch_fused` | <= 0.25 ms | 1.20 ms |"
    assert small + " **not met** |" in text
    assert "| large, gRPC, c=1: p99 |" not in text  # a retired goal
    assert "| ours / limit, throughput | `dispatch_fused` | 0.80 | 0.50 |" in text
    assert "| fused / ensemble, latency | `dispatch_fused / dispatch` | 0.83 | 0.88 |" in text
    assert "| Triton gRPC, dispatch_fused | 64 | 1,200.0 | 1,200 | 50.00 |" in text
    assert "| Triton gRPC, dispatch | 64 | 1,000.0 |" in text
    assert "c=4: skipped" in text
    assert "small_c1_p50_ms 2.00 -> 1.50 (-25%)" in text
    assert "| small | `dispatch` | feature_encoder v1 | 1.69 | 0.03 | 1.55 | 0.10 | 1.20 |" in text
    assert (
        "| small | `dispatch_fused` | dispatch_fused | 2.88 | 0.04 | 2.78 | 0.05 | 1.20 |" in text
    )
    assert "- `dispatch_fused`: the same inputs, outputs and answer" in text
    empty = render_report(BenchResults("s", "full"))
    assert "No tuning entries recorded." in empty
    assert empty.count("not measured") == len(compute_targets(BenchResults("s", "full")))
    assert "## Where the time goes" not in empty


def test_the_address_scenarios_render_as_a_table_and_round_trip() -> None:
    def scenario(p50: float, share: dict[str, float]) -> dict[str, Any]:
        return {"windows": 3, "errors": 0, "p50_ms": p50, "p99_ms": p50 + 1.0,
                "max_ms": p50 + 2.0, "over_320ms": 0, "share": share}  # fmt: skip

    results = BenchResults("s", "quick")
    results.geocoding = {
        "model": "dispatch_fused",
        "orders": 64,
        "riders": 200,
        "coordinates": scenario(10.0, {"coordinates": 1.0}),
        "provider_20ms_warm": scenario(11.3, {"cache": 0.983, "gazetteer": 0.017}),
        "warm_over_coordinates_p50": 1.13,
    }
    text = render_report(results)
    assert "## Orders with addresses" in text
    assert (
        "| addresses | 20 ms, warm cache | 3 | 0 | 11.3 | 12.3 | 13.3 | 0 | cache 98.3 %, " in text
    )
    assert "1.13x (the target: at most 1.2x)" in text
    assert BenchResults.from_dict(results.to_dict()).geocoding == results.geocoding
    assert "## Orders with addresses" not in render_report(BenchResults("s", "quick"))


def test_plot_writes_a_png(tmp_path: Path) -> None:
    from perf.plots import plot_size

    path = tmp_path / "small.png"
    plot_size(_results(), "small", path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_killed_perf_analyzers_regions_are_removed_and_nothing_else(tmp_path: Path) -> None:
    from perf.pa import remove_leftover_regions, shm_entries

    (tmp_path / "ORDER_IDS").write_bytes(b"old")  # there before the run: not this run's
    before = shm_entries(tmp_path)
    for name in ("ORDER_IDS_0_1", "WINDOW_FIELDS_0_12", "TOPK_OBJECTIVES", "PAIR_FEATURES"):
        (tmp_path / name).write_bytes(b"x")
    for name in ("triton_python_backend_shm_region_1", "dispatch_client_7_0_in", "ORDER_IDSX"):
        (tmp_path / name).write_bytes(b"x")
    removed = remove_leftover_regions(before, tmp_path)
    assert removed == ["ORDER_IDS_0_1", "PAIR_FEATURES", "TOPK_OBJECTIVES", "WINDOW_FIELDS_0_12"]
    assert sorted(shm_entries(tmp_path)) == [
        "ORDER_IDS",
        "ORDER_IDSX",
        "dispatch_client_7_0_in",
        "triton_python_backend_shm_region_1",
    ]


def test_a_floor_that_failed_says_why_beside_the_target() -> None:
    # A floor run that failed (perf_analyzer timed out at c=64) is reported, not left out.
    results = _results()
    results.floor = {"c64": "failed: timed out after 120 s"}
    by_name = {t.name: t for t in goal_targets(results)}
    target = by_name["small, gRPC, c=64: throughput / no-work floor"]
    assert target.measured is None
    assert "no-work floor: failed: timed out after 120 s" in target.detail
