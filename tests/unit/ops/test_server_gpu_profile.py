"""The launcher's `gpu` profile: memory-pool flags and a stock tritonserver install."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from dispatch_service.ops.server_cli import main


def runtime(root: Path) -> TritonRuntime:
    return TritonRuntime(
        tritonserver=root / "bin" / "tritonserver",
        library_path=root / "lib",
        backend_dir=root / "backends",
        python_bin_dir=root / "venv" / "bin",
    )


def test_the_gpu_profile_sizes_pinned_and_cuda_memory_pools(tmp_path: Path) -> None:
    options = ServerOptions(
        profile="gpu",
        pinned_memory_pool_bytes=1 << 28,
        cuda_memory_pool_bytes=1 << 27,
        cuda_memory_pool_devices=(0, 1),
    )
    command = TritonServer(runtime(tmp_path), options, tmp_path / "log").command()
    assert "--pinned-memory-pool-byte-size=268435456" in command
    assert "--cuda-memory-pool-byte-size=0:134217728" in command
    assert "--cuda-memory-pool-byte-size=1:134217728" in command
    assert "--model-config-name=gpu" in command


def test_the_default_gpu_pools_hold_128_of_the_largest_feature_tensors(tmp_path: Path) -> None:
    options = ServerOptions()
    largest = 32768 * 28 * 4  # PAIR_FEATURES of a full window, bytes
    assert options.pinned_memory_pool_bytes >= 128 * largest
    assert options.cuda_memory_pool_bytes >= 128 * largest


def test_the_cpu_profile_leaves_the_pools_alone(tmp_path: Path) -> None:
    command = TritonServer(runtime(tmp_path), ServerOptions(), tmp_path / "log").command()
    assert not any("memory-pool" in arg for arg in command)


def test_a_stock_install_brings_its_own_libraries_and_backends(tmp_path: Path) -> None:
    binary = tmp_path / "opt" / "tritonserver" / "bin" / "tritonserver"
    installed = TritonRuntime.from_install(binary, tmp_path / "venv" / "bin")
    root = (tmp_path / "opt" / "tritonserver").resolve()
    assert installed.tritonserver == binary
    assert installed.library_path == root / "lib"
    assert installed.backend_dir == root / "backends"
    assert installed.python_bin_dir == tmp_path / "venv" / "bin"


def test_main_runs_the_given_tritonserver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "ngc" / "bin" / "tritonserver"
    code = main(
        [
            "--tritonserver",
            str(binary),
            "--profile",
            "gpu",
            "--log",
            str(tmp_path / "server.log"),
            "--http-port",
            str(Ports.free().http),
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert str(binary) in err and str((tmp_path / "ngc" / "backends").resolve()) in err
