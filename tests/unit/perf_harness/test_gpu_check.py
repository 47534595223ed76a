"""perf/gpu_check: fails fast without a GPU; the derived gpu config; the report table."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from dispatch_service.core.model_config import read_model_config
from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.core.settings import load_settings, reject_unknown
from dispatch_service.pipeline.onnx_runner import OrtSettings
from perf.gpu_check import Row, derived_repository, load_failure, main, render

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
    cpu = load(MODEL_REPOSITORY / "dispatch_model" / "config.pbtxt")
    gpu = load(repo / "dispatch_model" / "configs" / "gpu.pbtxt")
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
        if folder.is_dir() and folder.name != "dispatch_model":
            assert (repo / folder.name).resolve() == folder.resolve()
    versions = [p.name for p in (MODEL_REPOSITORY / "dispatch_model").iterdir() if p.is_dir()]
    for version in versions:
        if version != "configs":
            assert (repo / "dispatch_model" / version).resolve() == (
                MODEL_REPOSITORY / "dispatch_model" / version
            ).resolve()


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
    table = [line for line in text.splitlines() if line.startswith("|")]
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
