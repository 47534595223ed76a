"""The GPU check's host: the GPUs nvidia-smi sees, which tritonserver can serve ONNX on them,
and the scratch repository that puts `dispatch_model`'s ONNX Runtime session on CUDA.

Used by `perf.gpu_check` (see its docstring for the runs).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from dispatch_service.core.model_config import read_model_config, write_model_config
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.ops.server import TritonRuntime

__all__ = [
    "NATIVE_TRITONSERVER",
    "NoGpuError",
    "derived_repository",
    "gpu_memory_mib",
    "gpu_names",
    "load_failure",
    "native_tritonserver",
]

NATIVE_TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")


class NoGpuError(RuntimeError):
    pass


def gpu_memory_mib() -> list[int]:
    """Memory in use per GPU (nvidia-smi); raises NoGpuError without a usable GPU."""
    if shutil.which("nvidia-smi") is None:
        raise NoGpuError("no NVIDIA GPU: nvidia-smi not found")
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    values = [int(v) for v in done.stdout.split() if v.strip().isdigit()]
    if done.returncode != 0 or not values:
        raise NoGpuError(f"no NVIDIA GPU: nvidia-smi failed ({done.stderr.strip()[:200]})")
    return values


def gpu_names() -> str:
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return "; ".join(line.strip() for line in done.stdout.splitlines() if line.strip())


def native_tritonserver(given: Path | None) -> Path | None:
    """A tritonserver that has the onnxruntime backend next to it, if any."""
    for candidate in (given, NATIVE_TRITONSERVER):
        if candidate is not None and candidate.exists():
            runtime = TritonRuntime.from_install(candidate, Path(sys.prefix) / "bin")
            if (runtime.backend_dir / "onnxruntime").is_dir():
                return candidate
    return None


def derived_repository(target: Path, kind: str) -> Path:
    """The model repository with dispatch_model's `gpu` config = its `cpu` config on CUDA."""
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for folder in MODEL_REPOSITORY.iterdir():
        if folder.is_dir() and folder.name != SCORING_MODEL:
            (target / folder.name).symlink_to(folder.resolve(), target_is_directory=True)
    source = model_layout(MODEL_REPOSITORY, SCORING_MODEL)
    model = model_layout(target, SCORING_MODEL)
    model.folder.mkdir()
    for entry in source.folder.iterdir():
        if entry != source.profiles:
            (model.folder / entry.name).symlink_to(entry.resolve())
    config = read_model_config(source.config)
    del config.instance_group[:]
    group = config.instance_group.add()
    group.count = 1
    group.kind = group.Kind.Value(kind)
    config.parameters["execution_provider"].string_value = "cuda"
    model.profiles.mkdir()
    write_model_config(model.profile("gpu"), config)
    return target


def load_failure(log: Path) -> str:
    """The server log's first model-load failure, on one line (why a gpu server did not start)."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in lines:
        if "failed to load '" in line and "version" in line:
            return line.split("] ", 1)[-1].split("\\n", 1)[0][:400]
    return ""
