"""perf/gpu_check: fails fast without a GPU; the derived gpu config; the planned runs, their
perf_analyzer arguments and input data (also for `dispatch_features`); the report tables."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2

from dispatch_contract import FEATURE_ENTRY_INPUTS, NUM_PAIR_FEATURES
from dispatch_service.core.model_config import read_model_config
from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.core.repository_layout import (
    DISPATCH_ENSEMBLE,
    FEATURES_ENSEMBLE,
    PROFILES_FOLDER,
    SCORING_MODEL,
    model_layout,
)
from dispatch_service.core.settings import load_settings, reject_unknown
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline.onnx_runner import OrtSettings
from perf.gpu_check import (
    DESIGN_FIGURES,
    GPU_RUNS,
    RESERVE_S,
    Row,
    c128_job,
    csv_name,
    derived_repository,
    feature_inputs,
    load_failure,
    main,
    pa_request_count,
    pa_timeout,
    render,
    window_inputs,
)
from perf.pa import read_input_data, write_input_data
from perf.windows import NEUTRAL_OPTIONAL_INPUTS

NO_GPU = shutil.which("nvidia-smi") is None


def load(path: Path) -> model_config_pb2.ModelConfig:
    config: model_config_pb2.ModelConfig = read_model_config(path)
    return config


@pytest.mark.skipif(not NO_GPU, reason="this host has nvidia-smi")
def test_the_script_stops_at_once_without_a_gpu() -> None:
    done = subprocess.run(
        ["bash", str(REPO_ROOT / "perf" / "gpu_check.sh")],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("gpu_check: no NVIDIA GPU")
    assert done.stdout == ""


@pytest.mark.skipif(not NO_GPU, reason="this host has nvidia-smi")
def test_the_python_part_says_no_gpu_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--out", str(tmp_path / "report")]) == 2
    assert "no NVIDIA GPU" in capsys.readouterr().err
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("kind", ["KIND_GPU", "KIND_CPU"])
def test_the_derived_gpu_config_is_the_cpu_config_on_cuda(tmp_path: Path, kind: str) -> None:
    repo = derived_repository(tmp_path / "repo", kind)
    source = model_layout(MODEL_REPOSITORY, SCORING_MODEL)
    derived = model_layout(repo, SCORING_MODEL)
    cpu = load(source.config)
    gpu = load(derived.profile("gpu"))
    assert (gpu.backend, gpu.max_batch_size) == (cpu.backend, cpu.max_batch_size)
    assert list(gpu.input) == list(cpu.input) and list(gpu.output) == list(cpu.output)
    assert gpu.version_policy == cpu.version_policy
    (group,) = gpu.instance_group
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(group.kind) == kind
    parameters = {k: v.string_value for k, v in gpu.parameters.items()}
    reject_unknown(parameters, OrtSettings)
    assert load_settings(OrtSettings, parameters).execution_provider == "cuda"
    # every other model and every version folder is the repository's own
    for folder in MODEL_REPOSITORY.iterdir():
        if folder.is_dir() and folder.name != SCORING_MODEL:
            assert model_layout(repo, folder.name).folder.resolve() == folder.resolve()
    versions = [p.name for p in source.folder.iterdir() if p.is_dir()]
    for version in versions:
        if version != PROFILES_FOLDER:
            assert (derived.folder / version).resolve() == (source.folder / version).resolve()


def test_the_report_is_one_table_with_notes() -> None:
    rows = [
        Row("cpu (plain gRPC)", "embedded", 4.2, 9.9, 100, 300.0, 400.0, 600.0, 0, True),
        Row("gpu + CUDA shm", "native", notes=["CUDA shm unavailable: no cuda-python 12"]),
    ]
    summary = {
        "gpus": "NVIDIA H200, 560.35",
        "window": {"orders": 64, "riders": 200},
        "gpu_server": "native",
        "gpu_memory_mib_before": [0],
        "gpu_attempts": ["native ORT backend, KIND_GPU: started"],
    }
    text = render(summary, rows)
    main_part = text.split("## Zero-copy")[0]
    table = [line for line in main_part.splitlines() if line.startswith("|")]
    assert len(table) == 2 + len(rows)
    assert "| cpu (plain gRPC) | embedded | 4.20 | 9.90 | 300.0 | 400.00 | 600.00 | 0 | yes |" in (
        table
    )
    assert "- gpu + CUDA shm: CUDA shm unavailable: no cuda-python 12" in text


def test_a_failed_gpu_server_is_explained_by_its_first_load_failure(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "I1130 model_lifecycle.cc:1] loading\n"
        "E1130 model_lifecycle.cc:642] \"failed to load 'dispatch_model' version 1: Invalid "
        'argument: ... has kind KIND_GPU but no GPUs are available"\n'
        "E1130 model_lifecycle.cc:642] \"failed to load 'dispatch_model' version 2: other\"\n"
    )
    reason = load_failure(log)
    assert reason.startswith("\"failed to load 'dispatch_model' version 1")
    assert "no GPUs are available" in reason
    assert load_failure(tmp_path / "missing.log") == ""


# ---- the runs on the gpu server --------------------------------------------------------------


def window(orders: int = 8, riders: int = 30) -> dict[str, np.ndarray]:
    return window_to_wire(generate_window(np.random.default_rng(4242), orders, riders))


def test_the_gpu_server_measures_both_entry_points_with_and_without_cuda_shm() -> None:
    planned = [(run.model, run.shared_memory) for run in GPU_RUNS]
    assert planned == [
        ("dispatch", "cuda"),
        ("dispatch", "none"),
        ("dispatch_features", "cuda"),
        ("dispatch_features", "none"),
    ]
    # c=1 through DispatchClient for the window entry point only; labels are unique
    assert [run.sequential for run in GPU_RUNS] == [True, True, False, False]
    labels = ["cpu (plain gRPC)", *(run.config for run in GPU_RUNS)]
    assert len(set(labels)) == len(labels)
    names = [csv_name("cpu (plain gRPC)", "none")] + [
        csv_name(run.config, run.shared_memory) for run in GPU_RUNS
    ]
    assert names == ["cpu", "gpu-shm", "gpu", "dispatch_features-shm", "dispatch_features"]


@pytest.mark.parametrize("model", ["dispatch", "dispatch_features"])
def test_shm_and_copy_runs_differ_only_in_shared_memory(tmp_path: Path, model: str) -> None:
    data = tmp_path / f"input-{model}.json"

    def arguments(shared_memory: str) -> list[str]:
        run = next(r for r in GPU_RUNS if r.model == model and r.shared_memory == shared_memory)
        job = c128_job(
            "127.0.0.1:8001",
            data,
            tmp_path,
            csv_name(run.config, run.shared_memory),
            run.shared_memory,
            output_shm_size=65536,
            requests=4000,
            model=run.model,
        )
        return job.arguments()

    shm, copies = arguments("cuda"), arguments("none")
    for args in (shm, copies):
        assert args[args.index("-m") + 1] == model
        assert args[args.index("-i") + 1] == "grpc"
        assert args[args.index("--input-data") + 1] == str(data)  # the same requests
        assert args[args.index("--concurrency-range") + 1] == "128:128"
        # Windows of a third of the requests: perf_analyzer's exact mode (perf.pa notes).
        assert args[args.index("--measurement-request-count") + 1] == "1334"
    assert shm[shm.index("--shared-memory") + 1] == "cuda"
    assert shm[shm.index("--output-shared-memory-size") + 1] == "65536"
    assert "--shared-memory" not in copies and "--output-shared-memory-size" not in copies
    prefix = {"dispatch": "gpu", "dispatch_features": "dispatch_features"}[model]
    assert Path(shm[shm.index("-f") + 1]).name == f"pa-{prefix}-shm.csv"
    assert Path(copies[copies.index("-f") + 1]).name == f"pa-{prefix}.csv"


def test_a_short_run_still_measures_at_least_one_request_per_caller(tmp_path: Path) -> None:
    job = c128_job(
        "h:1", tmp_path / "d.json", tmp_path, "x", "none", output_shm_size=4096, requests=10
    )
    args = job.arguments()
    assert args[args.index("--measurement-request-count") + 1] == "128"


def test_feature_inputs_are_what_dispatch_features_declares(tmp_path: Path) -> None:
    w = window()
    tensors = feature_inputs(w)
    config = load(model_layout(MODEL_REPOSITORY, FEATURES_ENSEMBLE).config)
    declared = {t.name: t for t in config.input}
    # every input, the optional ones too (perf_analyzer's shm mode cannot leave one out)
    assert set(tensors) == set(declared) == {spec.name for spec in FEATURE_ENTRY_INPUTS}
    for spec in FEATURE_ENTRY_INPUTS:
        array = tensors[spec.name]
        if spec.triton_dtype == "BYTES":
            assert array.dtype == object
        else:
            assert array.dtype == spec.numpy_dtype, spec.name
        dims = list(declared[spec.name].dims)
        assert len(array.shape) == len(dims), spec.name
        assert all(d == -1 or d == n for d, n in zip(dims, array.shape, strict=True)), spec.name
    b, n = tensors["CANDIDATE_RIDER_INDEX"].shape
    assert b == len(w["ORDER_IDS"]) and 1 <= n <= 16
    assert tensors["PAIR_FEATURES"].shape == (b * n, NUM_PAIR_FEATURES)
    assert np.isfinite(tensors["PAIR_FEATURES"]).all()
    for name in ("ORDER_TEXT", "RIDER_IDS", "RIDER_FIELDS"):
        np.testing.assert_array_equal(tensors[name], w[name])
    for name, neutral in NEUTRAL_OPTIONAL_INPUTS.items():
        np.testing.assert_array_equal(tensors[name], neutral)


def test_feature_inputs_use_the_servers_encoder_settings() -> None:
    w = window()
    tensors = feature_inputs(w)
    # feature_encoder/config.pbtxt: candidates_per_order 16; 30 riders, so N = 16
    assert tensors["CANDIDATE_RIDER_INDEX"].shape == (8, 16)
    index = tensors["CANDIDATE_RIDER_INDEX"]
    assert ((index >= -1) & (index < 30)).all()
    # rider load / capacity columns of the layout are the riders' own (rows in index order)
    pairs = tensors["PAIR_FEATURES"].reshape(8, 16, NUM_PAIR_FEATURES)
    valid = index >= 0
    np.testing.assert_array_equal(pairs[..., 22][valid], w["RIDER_FIELDS"][index[valid], 2])
    np.testing.assert_array_equal(pairs[..., 23][valid], w["RIDER_FIELDS"][index[valid], 3])


def test_the_input_data_files_round_trip_exactly(tmp_path: Path) -> None:
    w = window()
    for model, tensors in (
        ("dispatch", window_inputs(w)),
        ("dispatch_features", feature_inputs(w)),
    ):
        path = tmp_path / f"input-{model}.json"
        write_input_data(path, [tensors])
        document = json.loads(path.read_text())
        assert set(document["data"][0]) == set(tensors)
        (back,) = read_input_data(path.read_text())
        for name, array in tensors.items():
            assert back[name].shape == array.shape, name
            if array.dtype == object:
                assert [bytes(v) for v in back[name].reshape(-1)] == [
                    v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1)
                ]
            else:
                assert back[name].dtype == array.dtype, name
                np.testing.assert_array_equal(back[name], array)


def test_dispatch_gets_every_optional_input_it_declares() -> None:
    tensors = window_inputs(window())
    config = load(model_layout(MODEL_REPOSITORY, DISPATCH_ENSEMBLE).config)
    assert set(tensors) == {t.name for t in config.input}


# ---- the time budget -------------------------------------------------------------------------


def test_each_load_run_gets_a_bounded_share_of_what_is_left() -> None:
    assert pa_timeout(400.0, 1) == 60.0  # never more than a minute
    assert pa_timeout(50.0, 4) == 20.0  # never less than 20 s
    assert pa_timeout(45.0 + 4 * 30.0, 4) == pytest.approx(30.0)
    assert pa_timeout(300.0, 0) == 60.0


def test_five_load_runs_fit_the_scripts_budget() -> None:
    """Worst case: every step takes as long as it may; the script still ends in time."""
    sh = (REPO_ROOT / "perf" / "gpu_check.sh").read_text()
    found = re.search(r"timeout --signal=INT --kill-after=(\d+) (\d+)", sh)
    assert found is not None
    hard = int(found.group(2))
    assert hard + 15 <= 300  # the 5 minutes, SIGKILL included
    budget = 270.0  # gpu_check.py --budget default
    assert budget < hard
    left = budget
    left -= 40.0  # cpu server start (embedded, warm-up)
    left -= 5.0 + 3.0  # sequential c=1 (--seconds default) + warm-up
    runs = 1 + len(GPU_RUNS)
    measured = 0
    for i in range(runs):
        if i == 1:
            left -= 60.0  # gpu server start
        if left < 30:  # measure()'s skip rule
            continue
        if i in (0, 1, 2):
            left -= 8.0 if i else 0.0  # c=1 run of the dispatch rows on the gpu server
        left -= pa_timeout(left, runs - i) + 3.0  # perf_analyzer stopped at its timeout
        measured += 1
    assert measured == runs
    assert left >= 0.0  # time left for the drill (skipped below 45 s) and the report
    assert RESERVE_S >= 45.0


def test_the_load_size_follows_one_callers_speed() -> None:
    assert pa_request_count(None, 5.0) == 2000
    assert pa_request_count(100.0, 5.0) == 1000  # floor
    assert pa_request_count(0.5, 5.0) == 10000  # cap: ~5 s at 2,000 infer/s
    assert pa_request_count(4.0, 5.0) == 10000
    assert pa_request_count(10.0, 5.0) == 4000


# ---- the report --------------------------------------------------------------------------------


def test_the_report_sets_the_feature_rows_beside_the_designs_figures() -> None:
    shm = Row("dispatch_features, gpu + CUDA shm", "native", c128_per_s=3100.0)
    shm.c128_p50_ms, shm.c128_p99_ms = 2.5, 6.0
    copies = Row("dispatch_features, gpu + copies (plain gRPC)", "native", c128_per_s=2480.0)
    copies.c128_p50_ms, copies.c128_p99_ms = 5.0, 9.0
    summary = {
        "gpus": "NVIDIA H200, 560.35",
        "window": {"orders": 64, "riders": 200},
        "gpu_server": "native",
        "gpu_memory_mib_before": [0],
    }
    text = render(summary, [Row("cpu (plain gRPC)", "embedded"), shm, copies])
    main_table, zero_copy = text.split("## Zero-copy")
    # both rows in the main table too
    assert "| dispatch_features, gpu + CUDA shm | native | - | - | 3,100.0 | 2.50 | 6.00 |" in (
        main_table
    )
    rows = [line for line in zero_copy.splitlines() if line.startswith("| ")]
    assert rows[2:] == [
        "| original design: zero-copy (quoted, average) | 3.8 | 2,890 |",
        "| original design: memcpy (quoted, average) | 8.1 | 1,940 |",
        "| this run: CUDA shm (measured, p50) | 2.50 | 3,100.0 |",
        "| this run: plain gRPC (measured, p50) | 5.00 | 2,480.0 |",
    ]
    assert "design 2.13x, this run 2.00x" in zero_copy
    assert "design 1.49x, this run 1.25x" in zero_copy
    assert "not measured here" in zero_copy
    assert DESIGN_FIGURES == (
        ("original design: zero-copy", 3.8, 2890.0),
        ("original design: memcpy", 8.1, 1940.0),
    )


def test_missing_feature_rows_leave_dashes_not_figures() -> None:
    summary = {
        "gpus": "-",
        "window": {"orders": 1, "riders": 1},
        "gpu_server": "native",
        "gpu_memory_mib_before": [],
    }
    text = render(summary, [Row("cpu (plain gRPC)", "embedded")])
    zero_copy = text.split("## Zero-copy")[1]
    assert "| this run: CUDA shm (measured, p50) | - | - |" in zero_copy
    assert "this run -." in zero_copy
