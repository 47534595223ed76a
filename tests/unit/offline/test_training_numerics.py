"""A training run pins the numeric libraries before numpy loads, so its bytes do not depend on
the kernels OpenBLAS would pick, its thread count or numpy's AVX-512 loops."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch_service.core.paths import REPO_ROOT
from dispatch_service.core.repository_layout import ONNX_FILE
from dispatch_service.offline.training.numerics import (
    PINNED_NUMERICS,
    cpu_flags,
    pin_numerics,
)

TRAINING = (sys.executable, "-m", "dispatch_service.offline.training")
HASWELL_CPU = frozenset({"sse2", "avx", "avx2", "fma"})
# Settings a caller may have that would change the bytes if the run kept them: another
# kernel this CPU runs, two threads, numpy's loops unrestricted.
FOREIGN = {"OPENBLAS_CORETYPE": "Sandybridge", "OPENBLAS_NUM_THREADS": "2"}


def test_pinning_overrides_what_the_caller_set() -> None:
    environ = {**FOREIGN, "NPY_DISABLE_CPU_FEATURES": "", "HOME": "/root"}
    assert pin_numerics(environ, machine="x86_64", flags=HASWELL_CPU) is None
    assert environ == {
        "OPENBLAS_CORETYPE": "Haswell",
        "OPENBLAS_NUM_THREADS": "1",
        "NPY_DISABLE_CPU_FEATURES": "AVX512F AVX512CD AVX512_KNL AVX512_KNM AVX512_SKX "
        "AVX512_CLX AVX512_CNL AVX512_ICL",
        "HOME": "/root",
    }


@pytest.mark.parametrize(
    ("machine", "flags", "reason"),
    [
        ("aarch64", frozenset({"asimd"}), "a aarch64 CPU runs other kernels"),
        ("x86_64", frozenset({"sse2", "avx"}), "this CPU lacks avx2, fma"),
        ("x86_64", frozenset({"avx", "avx2"}), "this CPU lacks fma"),
    ],
)
def test_a_cpu_that_cannot_run_the_pinned_kernels_keeps_its_own_but_one_thread(
    machine: str, flags: frozenset[str], reason: str
) -> None:
    environ: dict[str, str] = {}
    unpinned = pin_numerics(environ, machine=machine, flags=flags)
    assert unpinned is not None and unpinned.startswith(reason)
    assert environ == {"OPENBLAS_NUM_THREADS": "1"}  # never a core type it would die on


def test_cpu_flags_reads_the_flags_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 fma\n")
    assert cpu_flags(cpuinfo) == frozenset({"fpu", "sse2", "avx2", "fma"})
    assert cpu_flags(tmp_path / "absent") == frozenset()


def test_importing_the_training_package_loads_no_numpy() -> None:
    """`python -m dispatch_service.offline.training` imports the package before its
    ``__main__`` can pin anything: the package must leave numpy unloaded."""
    probe = (
        "import sys, dispatch_service.offline.training, "
        "dispatch_service.offline.training.numerics; print('numpy' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=REPO_ROOT
    )
    assert out.stdout.strip() == "False"


def _train(out_dir: Path, environ: dict[str, str]) -> str:
    subprocess.run(
        [*TRAINING, "--quick", "--no-eval", "--out-dir", str(out_dir)],
        check=True,
        capture_output=True,
        cwd=REPO_ROOT,
        env=environ,
    )
    return hashlib.sha256((out_dir / ONNX_FILE).read_bytes()).hexdigest()


@pytest.mark.skipif(
    pin_numerics({}, machine=platform.machine(), flags=cpu_flags()) is not None,
    reason="the pinned kernels need an x86-64 CPU with AVX2 and FMA",
)
def test_the_model_bytes_do_not_depend_on_the_callers_blas_settings(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in PINNED_NUMERICS}
    pinned = _train(tmp_path / "pinned", clean)
    foreign = _train(tmp_path / "foreign", {**clean, **FOREIGN})
    assert foreign == pinned
    # The same foreign settings, in a process that loaded numpy before the CLI ran, do
    # change the bytes (Sandybridge kernels, two threads): what the pinning prevents.
    script = (
        "import sys, numpy; from dispatch_service.offline.training.cli import main; "
        f"sys.exit(main(['--quick', '--no-eval', '--out-dir', {str(tmp_path / 'late')!r}]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**clean, **FOREIGN},
    )
    assert "training: not bit-reproducible: BLAS (architecture, threads)" in run.stderr
    late = hashlib.sha256((tmp_path / "late" / ONNX_FILE).read_bytes()).hexdigest()
    assert late != pinned
