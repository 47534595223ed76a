"""Readings of the node's GPUs through one interface: NVML on a GPU host, scripted in tests.

`GpuSampler.sample()` returns one `GpuSample` per GPU, or None when the host has no usable
NVML (a CPU host): the monitor then reports "no GPU" once and stops. A device NVML cannot
read still yields a sample, with ``error`` set, so a GPU that fell off the bus counts as
over threshold instead of disappearing.

Whether a CUDA context can be created is not an NVML question: `ContextProber` asks a child
process (ctypes on libcuda, so nothing is loaded into the launcher and a hung driver only
costs the child's timeout) every ``context_probe_period_s`` and keeps the last answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "CONTEXT_PROBE_SCRIPT",
    "ContextProber",
    "GpuSample",
    "GpuSampler",
    "NvmlSampler",
    "ScriptedSampler",
    "open_nvml_sampler",
    "run_context_probe",
]


@dataclass(frozen=True)
class GpuSample:
    """One reading of one GPU. None: the device does not report that figure."""

    index: int
    uuid: str = ""
    utilization_percent: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    temperature_c: float | None = None
    ecc_uncorrected: int | None = None  # volatile uncorrected ECC errors since driver load
    context_ok: bool | None = None  # None: not probed (yet)
    error: str | None = None  # NVML could not read the device

    @property
    def memory_percent(self) -> float | None:
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return 100.0 * self.memory_used_bytes / self.memory_total_bytes

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> GpuSample:
        """A sample from a recorded JSON object (the keys of this dataclass)."""
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown GPU sample field(s) {', '.join(unknown)}")
        if "index" not in data:
            raise ValueError("a GPU sample needs its index")
        return cls(**dict(data))


class GpuSampler(Protocol):
    def sample(self) -> Sequence[GpuSample] | None:
        """One reading per GPU, or None when the host has no GPU to read."""

    def close(self) -> None: ...


class ScriptedSampler:
    """Recorded or synthetic readings, one list per call (tests, replays).

    After the script ends the last step repeats, so a monitor thread can keep running.
    ``None`` as a step means "no NVML on this host".
    """

    def __init__(self, steps: Iterable[Sequence[GpuSample] | None]) -> None:
        self._steps = list(steps)
        if not self._steps:
            raise ValueError("a scripted sampler needs at least one step")
        self._lock = threading.Lock()
        self._next = 0
        self.calls = 0

    @classmethod
    def from_json(cls, path: Path) -> ScriptedSampler:
        """Steps from a JSON file: a list of steps, each a list of sample objects or null."""
        raw = json.loads(path.read_text())
        if not isinstance(raw, list):
            raise ValueError(f"{path}: expected a JSON list of steps")
        return cls(
            None if step is None else [GpuSample.from_mapping(item) for item in step]
            for step in raw
        )

    def replace(self, steps: Iterable[Sequence[GpuSample] | None]) -> None:
        """Play these steps from the next call on (a test changing the scene live)."""
        with self._lock:
            self._steps = list(steps)
            self._next = 0

    def sample(self) -> Sequence[GpuSample] | None:
        with self._lock:
            step = self._steps[min(self._next, len(self._steps) - 1)]
            self._next += 1
            self.calls += 1
            return step

    def close(self) -> None:
        return None


# ---- CUDA context probe ------------------------------------------------------------------

# argv: GPU indices. Prints {"<index>": <CUresult>} (0 = a context was created and synced),
# or {"init": <CUresult>} when the driver itself fails. PCI bus order, like NVML's indices.
CONTEXT_PROBE_SCRIPT = r"""
import ctypes, json, sys
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as exc:
    print(json.dumps({"init": str(exc)})); sys.exit(0)
rc = cuda.cuInit(0)
if rc:
    print(json.dumps({"init": rc})); sys.exit(0)
out = {}
for arg in sys.argv[1:]:
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    rc = cuda.cuDeviceGet(ctypes.byref(dev), int(arg))
    if rc == 0:
        rc = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
        if rc == 0:
            rc = cuda.cuCtxSetCurrent(ctx) or cuda.cuCtxSynchronize()
            cuda.cuDevicePrimaryCtxRelease_v2(dev)
    out[arg] = rc
print(json.dumps(out))
"""


def run_context_probe(indices: Sequence[int], timeout_s: float) -> dict[int, bool]:
    try:
        done = subprocess.run(
            [sys.executable, "-c", CONTEXT_PROBE_SCRIPT, *map(str, indices)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
            check=False,
        )
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError, OSError):
        return dict.fromkeys(indices, False)  # a probe that hangs or dies is a failure
    if "init" in answer:
        return dict.fromkeys(indices, False)
    return {index: answer.get(str(index)) == 0 for index in indices}


class ContextProber:
    """Keeps the last answer to "can a CUDA context be created on GPU i?", refreshed in the
    background every ``period_s`` (0: never asked, every answer None)."""

    def __init__(
        self,
        period_s: float,
        timeout_s: float,
        probe: Callable[[Sequence[int], float], dict[int, bool]] = run_context_probe,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.period_s = period_s
        self.timeout_s = timeout_s
        self._probe = probe
        self._clock = clock
        self._lock = threading.Lock()
        self._answers: dict[int, bool] = {}
        self._last: float | None = None
        self._running: threading.Thread | None = None

    def status(self, indices: Sequence[int]) -> dict[int, bool | None]:
        """The last answers (None where none yet); starts a probe in the background if due."""
        with self._lock:
            due = self.period_s > 0 and (
                self._last is None or self._clock() - self._last >= self.period_s
            )
            if due and (self._running is None or not self._running.is_alive()):
                self._last = self._clock()
                self._running = threading.Thread(
                    target=self._refresh, args=(tuple(indices),), daemon=True, name="cuda-probe"
                )
                self._running.start()
            return {i: self._answers.get(i) for i in indices}

    def _refresh(self, indices: tuple[int, ...]) -> None:
        answers = self._probe(indices, self.timeout_s)
        with self._lock:
            self._answers.update(answers)

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for a probe in flight (tests)."""
        running = self._running
        if running is not None:
            running.join(timeout_s)


# ---- NVML --------------------------------------------------------------------------------


class NvmlSampler:
    """The node's GPUs through NVML (package nvidia-ml-py, module ``pynvml``)."""

    def __init__(self, nvml: Any, prober: ContextProber | None = None) -> None:
        self._nvml = nvml
        self._prober = prober
        self._handles = [
            nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())
        ]
        self._uuids = [self._uuid(h) for h in self._handles]

    @property
    def device_count(self) -> int:
        return len(self._handles)

    def _uuid(self, handle: Any) -> str:
        try:
            uuid = self._nvml.nvmlDeviceGetUUID(handle)
        except self._nvml.NVMLError:
            return ""
        return uuid.decode() if isinstance(uuid, bytes) else str(uuid)

    def _optional(self, read: Callable[[], Any]) -> Any:
        """A figure the device may not support (ECC on consumer boards, utilisation under
        MIG): None then. Any other NVML error means the device cannot be read."""
        try:
            return read()
        except self._nvml.NVMLError_NotSupported:
            return None

    def _read(self, index: int, handle: Any, context_ok: bool | None) -> GpuSample:
        nvml = self._nvml
        try:  # utilisation is not supported on MIG-enabled GPUs: None, not an error
            utilization = self._optional(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            temperature = self._optional(
                lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            )
            ecc = self._optional(
                lambda: nvml.nvmlDeviceGetTotalEccErrors(
                    handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                )
            )
        except nvml.NVMLError as exc:
            return GpuSample(index, self._uuids[index], context_ok=context_ok, error=str(exc))
        return GpuSample(
            index=index,
            uuid=self._uuids[index],
            utilization_percent=None if utilization is None else float(utilization.gpu),
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
            temperature_c=None if temperature is None else float(temperature),
            ecc_uncorrected=None if ecc is None else int(ecc),
            context_ok=context_ok,
        )

    def sample(self) -> Sequence[GpuSample] | None:
        indices = list(range(len(self._handles)))
        contexts = self._prober.status(indices) if self._prober else dict.fromkeys(indices)
        return [self._read(i, h, contexts.get(i)) for i, h in enumerate(self._handles)]

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def open_nvml_sampler(prober: ContextProber | None = None) -> NvmlSampler | None:
    """NVML's sampler, or None on a host without NVML, a driver or a device."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver (libnvidia-ml.so missing) or no device
        return None
    try:
        sampler = NvmlSampler(pynvml, prober)
    except pynvml.NVMLError:
        pynvml.nvmlShutdown()
        return None
    if not sampler.device_count:
        sampler.close()
        return None
    return sampler
