"""The numeric settings a trained model's bytes depend on, pinned before numpy loads.

numpy's OpenBLAS is built DYNAMIC_ARCH: it picks its matrix kernels by the CPU it finds
(Haswell, Zen, SkylakeX, ...) and splits products over as many threads as it is given, and
each kernel and split rounds differently. numpy's own loops (exp, log, ...) also dispatch
by CPU, to AVX-512 code where the CPU has it. A training run (``python -m
dispatch_service.offline.training``, ``__main__``) therefore pins, before numpy is imported:
the Haswell kernels (AVX2 and FMA: every x86-64 server CPU since 2013), one BLAS thread and
numpy's loops without AVX-512. Any x86-64 host with AVX2 and FMA then trains the same bytes.
These settings are read by the libraries when they load: this module must not import numpy.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from types import MappingProxyType
from typing import Final

__all__ = [
    "PINNED_NUMERICS",
    "REQUIRED_CPU_FLAGS",
    "cpu_flags",
    "pin_numerics",
    "pin_this_process",
    "unpinned_blas",
]

# numpy 1.26's dispatch targets above AVX2 (`numpy.core._multiarray_umath.__cpu_dispatch__`).
_AVX512_TARGETS: Final = (
    "AVX512F",
    "AVX512CD",
    "AVX512_KNL",
    "AVX512_KNM",
    "AVX512_SKX",
    "AVX512_CLX",
    "AVX512_CNL",
    "AVX512_ICL",
)

PINNED_NUMERICS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "OPENBLAS_CORETYPE": "Haswell",
        "OPENBLAS_NUM_THREADS": "1",  # as fast as two on the 2-core host, and any host has one
        "NPY_DISABLE_CPU_FEATURES": " ".join(_AVX512_TARGETS),
    }
)
# What the Haswell kernels execute; a CPU without them would die on an illegal instruction.
REQUIRED_CPU_FLAGS: Final = frozenset({"avx2", "fma"})
_X86_64: Final = frozenset({"x86_64", "amd64"})


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU's feature flags as Linux lists them; empty where there is no such file."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def pin_numerics(
    environ: MutableMapping[str, str], *, machine: str, flags: frozenset[str]
) -> str | None:
    """Set ``PINNED_NUMERICS`` in ``environ`` (over any value there); None when all are set,
    else why the bytes will not match a pinned host's (then only the thread count is set)."""
    environ["OPENBLAS_NUM_THREADS"] = PINNED_NUMERICS["OPENBLAS_NUM_THREADS"]
    if machine.lower() not in _X86_64:
        return f"a {machine} CPU runs other kernels than the pinned x86-64 ones"
    missing = REQUIRED_CPU_FLAGS - flags
    if missing:
        return f"this CPU lacks {', '.join(sorted(missing))} for the pinned Haswell kernels"
    environ.update(PINNED_NUMERICS)
    return None


def pin_this_process(environ: MutableMapping[str, str]) -> str | None:
    """`pin_numerics` for the machine this process runs on."""
    return pin_numerics(environ, machine=platform.machine(), flags=cpu_flags())


def unpinned_blas() -> str | None:
    """After numpy loaded: None when its BLAS runs as pinned, else how it runs (numpy was
    imported before `pin_this_process`, or the CPU cannot run the pinned kernels)."""
    from threadpoolctl import threadpool_info

    # numpy's OpenBLAS, and SciPy's own where SciPy is loaded: each reads the settings.
    blas = [info for info in threadpool_info() if info.get("user_api") == "blas"]
    actual = [(str(info.get("architecture")), int(info["num_threads"])) for info in blas]
    wanted = (PINNED_NUMERICS["OPENBLAS_CORETYPE"], int(PINNED_NUMERICS["OPENBLAS_NUM_THREADS"]))
    if actual and all(runs == wanted for runs in actual):
        return None
    return f"BLAS (architecture, threads) {actual}, pinned {wanted}"
