"""What every Python-backend stub of the service does first, before its model's own setup.

- its shared-memory region sealed (`backend_log.seal_backend_region`);
- Triton's BYTES decoding replaced by the faster one (`bytes_tensors`);
- its CPU priority lowered below the server's (``stub_nice``, default `DEFAULT_STUB_NICE`)
  once its instance is loaded (`settle_cpu_priority`, from `TritonResponder.loaded`):
  when the host's cores are saturated, Triton's own threads (accepting, queueing and
  refusing requests, answering health checks) run before model work, so an overloaded
  server still says "no" at once. Without saturation it changes nothing. The model's own
  setup runs at the server's priority: set up at niceness 10 beside a busy host's other
  work, a restart's `dispatch_fused` stubs were loaded 11-34 s after the priority lane's
  (the same code at niceness 0). Every thread of the stub is set; threads started later inherit it.
  Unprivileged, a process can only raise its niceness, so a stub never ends up above the
  server;
- its BLAS (numpy's OpenBLAS) on one thread (`single_threaded_blas`): the library runs its
  own threads where they pay (the encoder's ``selection_threads``) and the server runs
  several stubs, so BLAS threads on top only oversubscribe the cores, and they spin while
  they wait, taking CPU the other threads and stubs need.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from threadpoolctl import threadpool_limits

from dispatch_service.core.settings import (
    STUB_NICE_PARAMETER,
    SettingsError,
    parameters_from_model_config,
)
from dispatch_service.serving.backend_log import seal_backend_region
from dispatch_service.serving.bytes_tensors import use_fast_bytes_decoding

__all__ = [
    "DEFAULT_STUB_NICE",
    "lower_cpu_priority",
    "prepare_stub",
    "settle_cpu_priority",
    "single_threaded_blas",
    "stub_nice",
]

# Chosen so the server's threads win the core under overload (a refusal in milliseconds)
# while a stub alone on an idle host runs as fast as at 0; 19 is the lowest priority.
DEFAULT_STUB_NICE: Final = 10


def stub_nice(parameters: Mapping[str, str]) -> int:
    """The ``stub_nice`` parameter: 0 (the server's priority) to 19; absent: the default."""
    text = parameters.get(STUB_NICE_PARAMETER, "").strip()
    if not text:
        return DEFAULT_STUB_NICE
    try:
        nice = int(text)
    except ValueError:
        nice = -1
    if not 0 <= nice <= 19:
        raise SettingsError(f"{STUB_NICE_PARAMETER}: a whole number 0..19, got {text!r}")
    return nice


def lower_cpu_priority(nice: int, tasks: Path = Path("/proc/self/task")) -> list[int]:
    """Set every thread of this process to niceness ``nice`` where it runs at a higher
    priority; returns the thread ids changed (a thread that ended meanwhile is skipped)."""
    changed = []
    for task in sorted(tasks.iterdir()):
        tid = int(task.name)
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
                changed.append(tid)
        except OSError:
            continue
    return changed


def single_threaded_blas() -> None:
    """Run this process's BLAS calls on the calling thread only (see the module docstring)."""
    threadpool_limits(limits=1, user_api="blas")


# The niceness this stub takes once its instance is loaded: read by `prepare_stub`, applied
# by `settle_cpu_priority` (a stub process serves one model instance).
_nice_when_loaded: int | None = None


def prepare_stub(pb_utils: Any, args: Mapping[str, str]) -> dict[str, str]:
    """The first steps of a load (see the module docstring); returns the model's config
    parameters. A bad ``stub_nice`` raises SettingsError, which fails the load."""
    global _nice_when_loaded
    seal_backend_region(pb_utils, args["model_name"])
    use_fast_bytes_decoding(pb_utils)
    parameters = parameters_from_model_config(args["model_config"])
    single_threaded_blas()
    _nice_when_loaded = stub_nice(parameters)
    return parameters


def settle_cpu_priority() -> None:
    """Lower this stub to the niceness `prepare_stub` read, now that its instance is set up
    (see the module docstring); once, and nothing outside a prepared stub."""
    global _nice_when_loaded
    nice, _nice_when_loaded = _nice_when_loaded, None
    if nice is not None:
        lower_cpu_priority(nice)
