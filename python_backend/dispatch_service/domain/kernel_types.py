"""What the compiled kernels (`pair_kernels`, `window_kernels`) share: numba's array types
for their signatures, and the two ways a function of theirs is compiled.

A kernel is compiled with its explicit signature when its module is imported (`compiled`:
numba's on-disk cache, so a model pays for it at load, never on a request); a helper that
only kernels call is compiled into each of them instead (`inlined`: no code of its own to
load from the cache, which costs a stub a few ms of CPU per function).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import numba

__all__ = [
    "B_2D",
    "F4_2D",
    "F8",
    "F8_2D",
    "I4",
    "I8",
    "I8_2D",
    "INTP",
    "OUT_F8",
    "OUT_F8_2D",
    "U8",
    "U8_2D",
    "compiled",
    "inlined",
    "numba_types",
]

numba_types: Final[Any] = numba.types  # numba's types (untyped to mypy)
# The kernels' array types in numba's signatures (any layout: views are fine).
# Inputs are typed read-only (a writable array converts to that; a read-only one, e.g. a
# frozen window's, would match no writable signature); outputs writable.
F8: Final = numba_types.Array(numba_types.float64, 1, "A", readonly=True)
F8_2D: Final = numba_types.Array(numba_types.float64, 2, "A", readonly=True)
F4_2D: Final = numba_types.Array(numba_types.float32, 2, "A", readonly=True)
I4: Final = numba_types.Array(numba_types.int32, 1, "A", readonly=True)
I8: Final = numba_types.Array(numba_types.int64, 1, "A", readonly=True)
I8_2D: Final = numba_types.Array(numba_types.int64, 2, "A", readonly=True)
B_2D: Final = numba_types.Array(numba_types.boolean, 2, "A", readonly=True)
U8: Final = numba_types.Array(numba_types.uint64, 1, "A", readonly=True)
U8_2D: Final = numba_types.Array(numba_types.uint64, 2, "A", readonly=True)
INTP: Final = numba_types.Array(numba_types.intp, 1, "A", readonly=True)
OUT_F8: Final = numba_types.float64[:]
OUT_F8_2D: Final = numba_types.float64[:, :]


def compiled(signature: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """numba's ahead-of-request compile: explicit types, cached on disk, no GIL held,
    numpy's float semantics (no Python division checks). Where no cache directory is
    writable (a read-only install without a home), compiled at each import instead."""

    def compile_now(function: Callable[..., Any]) -> Callable[..., Any]:
        options: dict[str, Any] = {"nogil": True, "error_model": "numpy"}
        try:
            compiled: Callable[..., Any] = numba.njit(signature, cache=True, **options)(function)
        except RuntimeError:  # numba: "cannot cache function ...: no locator available"
            compiled = numba.njit(signature, **options)(function)
        return compiled

    return compile_now


def inlined(function: Callable[..., Any]) -> Callable[..., Any]:
    """A helper compiled into each kernel that calls it (module docstring)."""
    helper: Callable[..., Any] = numba.njit(inline="always", error_model="numpy")(function)
    return helper
