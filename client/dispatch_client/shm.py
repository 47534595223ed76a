"""Shared-memory transport: tensors travel through pre-registered memory, gRPC carries metadata.

A co-located caller (same host as the server) writes each request's tensors into a region
the server already knows and asks Triton to write the answer into a second region; the
gRPC message then holds only names, shapes and offsets. Two region kinds share one code
path behind `RegionBackend`:

- `SystemShmBackend`: POSIX shared memory (`/dev/shm`) through
  `tritonclient.utils.shared_memory`; works wherever client and server share a host.
- `CudaShmBackend`: CUDA IPC memory on a GPU through `tritonclient.utils.cuda_shared_memory`
  (imported only when this backend is built; it needs an NVIDIA GPU and `cuda-python` 12.x,
  whose `cuda.cudart` module that tritonclient 2.51 imports is gone from cuda-python 13).

`ShmRegionPool` owns `size` region sets (one input and one output region each). They are
created and registered with the server once and reused; a caller checks a set out for one
request and returns it after the response has been read, so concurrent callers never share a
region in flight. Regions are released (unregistered from the server, unmapped and unlinked)
on `close()`, when a request fails in a way that leaves the server possibly still writing
(timeout, lost connection, an interrupt or any unexpected exception: that set is retired and
a fresh one replaces it on demand), at interpreter exit (`atexit`) and on SIGTERM (the pool
turns a default SIGTERM into `SystemExit` so `finally` blocks and `atexit` run). Triton
refuses to unregister a region a request still uses; such regions are unmapped and unlinked
at once and unregistered as soon as the server lets go (retried before later checkouts and
at close).

Sizing. Regions are sized once, from a `ShmCapacity` (the largest window the caller will
send). Inputs are laid out back to back at 64-byte aligned offsets; BYTES tensors use
Triton's wire form (a 4-byte little-endian length before each element). Output sizes are
not known before the answer, so each output gets a slot bounded from the request: B orders,
K <= min(top_k, riders or candidates) Top-K columns, and for BYTES outputs (rider ids) 4 bytes
of length prefix plus the longest rider id of the request (at most 64 bytes, the contract's
limit) per element. A request whose tensors do not fit raises `ShmRegionTooSmallError`
naming the tensor, its byte size and the region size, before anything is sent.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import math
import os
import signal
import struct
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, ClassVar, Final, Literal, Protocol, Self

import numpy as np
import tritonclient.grpc as grpcclient
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException, np_to_triton_dtype, serialize_byte_tensor
from tritonclient.utils import shared_memory as system_shm

from dispatch_client.closing import Closing
from dispatch_client.errors import DispatchError, DispatchServerError
from dispatch_client.keys import SHM_KEY_ENV, SHM_KEY_HEADER, grpc_headers, read_key
from dispatch_client.transport import DEFAULT_GRPC_URL, DEFAULT_TIMEOUT_S, grpc_error, split_url
from dispatch_contract import (
    DISPATCH_ENSEMBLE_INPUTS,
    DISPATCH_ENSEMBLE_OUTPUTS,
    FEATURE_ENTRY_INPUTS,
    MAX_CANDIDATES,
    MAX_ID_BYTES,
    TensorSpec,
)

__all__ = [
    "ALIGNMENT",
    "BYTES_PREFIX",
    "REGION_PREFIX",
    "CudaShmBackend",
    "GrpcShmTransport",
    "Region",
    "RegionBackend",
    "RegionSet",
    "ShmCapacity",
    "ShmError",
    "ShmKind",
    "ShmPoolClosedError",
    "ShmRegionPool",
    "ShmRegionTooSmallError",
    "ShmUnavailableError",
    "Slot",
    "SystemShmBackend",
    "output_sizes",
    "plan_slots",
    "region_name",
]

ShmKind = Literal["system", "cuda"]

ALIGNMENT: Final = 64  # every tensor starts on a cache line (and a safe GPU alignment)
BYTES_PREFIX: Final = 4  # Triton's BYTES wire form: uint32 little-endian length per element
REGION_PREFIX: Final = "dispatch_client"  # /dev/shm/dispatch_client_<pid>_<n>_{in,out}

_SPECS: Final[dict[str, TensorSpec]] = {
    spec.name: spec
    for spec in (*DISPATCH_ENSEMBLE_INPUTS, *FEATURE_ENTRY_INPUTS, *DISPATCH_ENSEMBLE_OUTPUTS)
}
_COUNTER = itertools.count()
_COUNTER_LOCK = threading.Lock()


# ---- errors -------------------------------------------------------------------------------


class ShmError(DispatchError):
    """A shared-memory problem on the client side (region setup, pool state)."""


class ShmUnavailableError(ShmError):
    """The requested kind of shared memory cannot be used here (no GPU, missing module)."""


class ShmPoolClosedError(ShmError):
    """The transport was closed; its regions are gone."""


class ShmRegionTooSmallError(ShmError):
    """A tensor does not fit its shared-memory region; nothing was sent.

    `tensor` is the tensor's name, `byte_size` its size in bytes, `region_bytes` the size of
    the region it had to go in and `direction` ``"input"`` or ``"output"``.
    """

    def __init__(self, tensor: str, byte_size: int, region_bytes: int, direction: str) -> None:
        self.tensor = tensor
        self.byte_size = byte_size
        self.region_bytes = region_bytes
        self.direction = direction
        super().__init__(
            f"{tensor} ({byte_size} bytes) does not fit the {region_bytes}-byte {direction} "
            "shared-memory region together with the tensors before it; "
            "build the transport with a larger ShmCapacity"
        )


# ---- naming and layout -----------------------------------------------------------------------


def region_name(role: str) -> str:
    """A name no other process or pool uses: prefix, pid, a per-process counter, role."""
    with _COUNTER_LOCK:
        number = next(_COUNTER)
    return f"{REGION_PREFIX}_{os.getpid()}_{number}_{role}"


def _aligned(offset: int) -> int:
    return -(-offset // ALIGNMENT) * ALIGNMENT


@dataclass(frozen=True)
class Slot:
    """Where one tensor lives in a region."""

    name: str
    offset: int
    byte_size: int

    @property
    def end(self) -> int:
        return self.offset + self.byte_size


def plan_slots(sizes: Sequence[tuple[str, int]], region_bytes: int, direction: str) -> list[Slot]:
    """Place tensors back to back at aligned offsets; raise if one passes the region's end."""
    slots: list[Slot] = []
    offset = 0
    for name, byte_size in sizes:
        offset = _aligned(offset)
        if offset + byte_size > region_bytes:
            raise ShmRegionTooSmallError(name, byte_size, region_bytes, direction)
        slots.append(Slot(name, offset, byte_size))
        offset += byte_size
    return slots


# ---- capacity: how large the regions are ------------------------------------------------------


def _element_bytes(spec: TensorSpec, id_bytes: int) -> int:
    return BYTES_PREFIX + id_bytes if spec.triton_dtype == "BYTES" else spec.numpy_dtype.itemsize


def _bound_shape(name: str, orders: int, riders: int, candidates: int, top_k: int) -> list[int]:
    """The largest shape `name` takes for a window of that many orders, riders, N and K."""
    spec = _SPECS[name]
    lead = {
        "ORDER": orders,
        "RIDER": riders,
        "PAIR": orders * candidates,
        "CANDIDATE": orders,
        "TOPK": orders,
        "ASSIGNED": orders,
    }.get(name.split("_", 1)[0])
    if lead is None:  # COORD_SYSTEM, DISPATCH_TIME, OBJECTIVE_WEIGHTS: fixed dims
        return list(spec.dims)
    tail = [
        (candidates if name.startswith("CANDIDATE") else top_k) if dim < 0 else dim
        for dim in spec.dims[1:]
    ]
    return [lead, *tail]


def _bound_bytes(sizes: Sequence[tuple[str, int]]) -> int:
    end = 0
    for _, byte_size in sizes:
        end = _aligned(end) + byte_size
    return end


@dataclass(frozen=True)
class ShmCapacity:
    """The largest request a pool's regions must hold; sizes follow from the contract.

    `top_k` bounds K of the answer (K = min(top_k of topk_resolver, N) <= MAX_CANDIDATES,
    so the default always fits); lower it to the server's top_k to save memory.
    `candidates_per_order` bounds N for `dispatch_features` requests.
    """

    max_orders: int = 64
    max_riders: int = 1024
    top_k: int = MAX_CANDIDATES
    candidates_per_order: int = MAX_CANDIDATES
    max_id_bytes: int = MAX_ID_BYTES

    def __post_init__(self) -> None:
        for name in ("max_orders", "max_riders", "top_k", "candidates_per_order", "max_id_bytes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"ShmCapacity.{name} must be >= 1")

    def _sizes(self, specs: Sequence[TensorSpec]) -> list[tuple[str, int]]:
        return [
            (
                spec.name,
                math.prod(
                    _bound_shape(
                        spec.name,
                        self.max_orders,
                        self.max_riders,
                        self.candidates_per_order,
                        self.top_k,
                    )
                )
                * _element_bytes(spec, self.max_id_bytes),
            )
            for spec in specs
        ]

    @property
    def input_bytes(self) -> int:
        """Room for either entry point's inputs (a window, or pair features)."""
        return max(
            _bound_bytes(self._sizes(DISPATCH_ENSEMBLE_INPUTS)),
            _bound_bytes(self._sizes(FEATURE_ENTRY_INPUTS)),
        )

    @property
    def output_bytes(self) -> int:
        """Room for every `dispatch` output at B = max_orders, K = top_k, 64-byte ids."""
        return _bound_bytes(self._sizes(DISPATCH_ENSEMBLE_OUTPUTS))

    @classmethod
    def for_window(cls, tensors: Mapping[str, Any], *, top_k: int = MAX_CANDIDATES) -> Self:
        """Just large enough for this window (e.g. a one-shot CLI call).

        Ids longer than the contract allows still fit, so the server, not the region size,
        tells the caller which rule the window broke.
        """
        orders = len(np.asarray(tensors.get("ORDER_IDS", ())).reshape(-1))
        riders = len(np.asarray(tensors.get("RIDER_IDS", ())).reshape(-1))
        longest = max(
            (
                _longest(np.asarray(tensors[name], dtype=object))
                for name in ("ORDER_IDS", "ORDER_USER_IDS", "RIDER_IDS", "COORD_SYSTEM")
                if tensors.get(name) is not None
            ),
            default=0,
        )
        return cls(
            max_orders=max(orders, 1),
            max_riders=max(riders, 1),
            top_k=top_k,
            max_id_bytes=max(MAX_ID_BYTES, longest),
        )


# ---- region backends -------------------------------------------------------------------------


@dataclass(eq=False)
class Region:
    """One region: its server-side name, size and the backend's handle (and host view)."""

    name: str
    byte_size: int
    handle: Any
    view: NDArray[np.uint8] | None = None  # host mapping (system shm only)
    registered: bool = False
    destroyed: bool = False


class RegionBackend(Protocol):
    """Create, register, write, read, unregister and destroy one kind of region."""

    kind: ShmKind

    def create(self, name: str, byte_size: int) -> Region: ...

    def register(self, client: Any, region: Region) -> None: ...

    def unregister(self, client: Any, region: Region) -> None: ...

    def write(self, region: Region, chunks: Sequence[tuple[Slot, NDArray[np.uint8]]]) -> None:
        """Copy each chunk (raw bytes as uint8) to its slot; slots are in offset order."""
        ...

    def read(self, region: Region, byte_size: int) -> NDArray[np.uint8]:
        """The region's first `byte_size` bytes on the host, valid until the set is returned."""
        ...

    def destroy(self, region: Region) -> None: ...


class SystemShmBackend:
    """POSIX shared memory (`/dev/shm/<name>`) via `tritonclient.utils.shared_memory`."""

    kind: ShmKind = "system"

    def __init__(self, headers: Mapping[str, str] | None = None) -> None:
        """`headers` go with (un)registration: the server's shared-memory key (see `keys`)."""
        self.headers = dict(headers or {})

    def _auth(self) -> dict[str, Any]:
        return {"headers": self.headers} if self.headers else {}

    def create(self, name: str, byte_size: int) -> Region:
        handle = system_shm.create_shared_memory_region(name, f"/{name}", byte_size)
        try:
            # A writable uint8 view of the mapping: requests are copied in and answers out
            # with one memcpy each, no intermediate buffers.
            view = system_shm.get_contents_as_numpy(handle, np.uint8, [byte_size])
        except BaseException:
            system_shm.destroy_shared_memory_region(handle)
            raise
        return Region(name=name, byte_size=byte_size, handle=handle, view=view)

    def register(self, client: Any, region: Region) -> None:
        client.register_system_shared_memory(
            region.name, f"/{region.name}", region.byte_size, **self._auth()
        )

    def unregister(self, client: Any, region: Region) -> None:
        client.unregister_system_shared_memory(region.name, **self._auth())

    def write(self, region: Region, chunks: Sequence[tuple[Slot, NDArray[np.uint8]]]) -> None:
        assert region.view is not None
        for slot, data in chunks:
            region.view[slot.offset : slot.end] = data

    def read(self, region: Region, byte_size: int) -> NDArray[np.uint8]:
        assert region.view is not None
        return region.view[:byte_size]

    def destroy(self, region: Region) -> None:
        region.view = None  # drop our reference to the mapping before it is unmapped
        system_shm.destroy_shared_memory_region(region.handle)


class CudaShmBackend:
    """CUDA IPC memory on GPU `device_id` via `tritonclient.utils.cuda_shared_memory`.

    Writes gather the request's inputs (gaps zero-filled) into one host buffer and copy it to
    the device at once; reads copy the region to the host once per answer.
    Needs an NVIDIA GPU, `cuda-python` 12.x and a server on the same GPU host.
    """

    kind: ShmKind = "cuda"

    def __init__(
        self, device_id: int = 0, *, module: Any = None, headers: Mapping[str, str] | None = None
    ) -> None:
        """`module` replaces tritonclient's cuda_shared_memory (a stand-in in tests);
        `headers` go with (un)registration: the server's shared-memory key (see `keys`)."""
        self.device_id = device_id
        self.headers = dict(headers or {})
        if module is not None:
            self._cuda: Any = module
            return
        try:
            with warnings.catch_warnings():
                # cuda-python 12.x warns that `cuda.cudart` (which tritonclient uses) is
                # deprecated; that is its business, not a failure of ours.
                warnings.simplefilter("ignore", FutureWarning)
                warnings.simplefilter("ignore", DeprecationWarning)
                from tritonclient.utils import cuda_shared_memory
        except (ImportError, RuntimeError) as exc:
            raise ShmUnavailableError(
                "CUDA shared memory needs tritonclient.utils.cuda_shared_memory, which did not "
                f"import ({type(exc).__name__}: {exc}); it needs cuda-python 12.x "
                "(tritonclient 2.51 imports cuda.cudart, removed in cuda-python 13)"
            ) from exc
        self._cuda = cuda_shared_memory

    def _auth(self) -> dict[str, Any]:
        return {"headers": self.headers} if self.headers else {}

    def create(self, name: str, byte_size: int) -> Region:
        try:
            handle = self._cuda.create_shared_memory_region(name, byte_size, self.device_id)
        except Exception as exc:
            raise ShmUnavailableError(
                f"cannot allocate CUDA shared memory on GPU {self.device_id} ({exc}); "
                "is an NVIDIA GPU visible to this process?"
            ) from exc
        return Region(name=name, byte_size=byte_size, handle=handle)

    def register(self, client: Any, region: Region) -> None:
        raw = self._cuda.get_raw_handle(region.handle)
        client.register_cuda_shared_memory(
            region.name, raw, self.device_id, region.byte_size, **self._auth()
        )

    def unregister(self, client: Any, region: Region) -> None:
        client.unregister_cuda_shared_memory(region.name, **self._auth())

    def write(self, region: Region, chunks: Sequence[tuple[Slot, NDArray[np.uint8]]]) -> None:
        # tritonclient writes arrays back to back from offset 0, one cudaMemcpy each: fill
        # the gaps and hand it one buffer, so a request costs one host-to-device transfer.
        pieces: list[NDArray[np.uint8]] = []
        offset = 0
        for slot, data in chunks:
            if slot.offset > offset:
                pieces.append(np.zeros(slot.offset - offset, dtype=np.uint8))
            pieces.append(np.ascontiguousarray(data))
            offset = slot.end
        if pieces:
            self._cuda.set_shared_memory_region(region.handle, [np.concatenate(pieces)])

    def read(self, region: Region, byte_size: int) -> NDArray[np.uint8]:
        host = self._cuda.get_contents_as_numpy(region.handle, np.uint8, [region.byte_size])
        return np.asarray(host, dtype=np.uint8)[:byte_size]

    def destroy(self, region: Region) -> None:
        self._cuda.destroy_shared_memory_region(region.handle)


# ---- the pool --------------------------------------------------------------------------------


@dataclass(eq=False)
class RegionSet:
    """One input and one output region, used by one request at a time."""

    input: Region
    output: Region
    # Held while the host touches the memory; close() takes it before unmapping.
    lock: threading.Lock = field(default_factory=threading.Lock)
    released: bool = False

    @property
    def names(self) -> tuple[str, str]:
        return self.input.name, self.output.name

    @contextlib.contextmanager
    def touching(self) -> Iterator[None]:
        """Hold the set while reading or writing its memory; fails if it was released."""
        with self.lock:
            if self.released:
                raise ShmPoolClosedError("the shared-memory regions were released (closed)")
            yield


_SIGTERM_LOCK = threading.Lock()
_SIGTERM_INSTALLED = False


def _sigterm_to_system_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _install_sigterm_handler() -> None:
    """Turn a default (fatal) SIGTERM into SystemExit so `finally` and `atexit` run.

    Only from the main thread and only when nobody installed a handler: an application's
    own SIGTERM handling is left alone.
    """
    global _SIGTERM_INSTALLED
    with _SIGTERM_LOCK:
        if _SIGTERM_INSTALLED or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _sigterm_to_system_exit)
        _SIGTERM_INSTALLED = True


class ShmRegionPool(Closing):
    """`size` region sets, registered with the server once, lent out one request at a time.

    Thread-safe. `checkout()` blocks (up to its timeout) while every set is in use. A set
    returned after a clean answer or a server-side refusal goes back to the pool; one whose
    request ended any other way (the server may still write into it) is retired: unregistered
    and destroyed, and a new set replaces it the next time one is needed.
    """

    close_wait_s: ClassVar[float] = 5.0

    def __init__(
        self,
        backend: RegionBackend,
        client: Any,
        *,
        input_bytes: int,
        output_bytes: int,
        size: int = 4,
        handle_sigterm: bool = True,
    ) -> None:
        if size < 1:
            raise ValueError("pool size must be >= 1")
        if input_bytes < 1 or output_bytes < 1:
            raise ValueError("region sizes must be >= 1 byte")
        self.backend = backend
        self.client = client
        self.input_bytes = input_bytes
        self.output_bytes = output_bytes
        self.size = size
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self._idle: list[RegionSet] = []
        self._busy: set[RegionSet] = set()
        # Every live set, wherever it is: close() releases what an interrupt left stranded.
        self._live: set[RegionSet] = set()
        # Regions the server would not unregister yet (a timed-out request still uses them).
        self._pending: list[Region] = []
        self._creating = 0
        self._closed = False
        if handle_sigterm:
            _install_sigterm_handler()
        atexit.register(self.close)
        try:
            for _ in range(size):
                self._idle.append(self._new_set())
        except BaseException:
            self.close()
            raise

    # -- state --------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return self._closed

    def region_names(self) -> list[str]:
        """Names of every live region of this pool (idle and in use)."""
        with self._cond:
            sets = list(self._live)
        return [name for regions in sets for name in regions.names]

    def counts(self) -> tuple[int, int]:
        """(idle, in use) region sets."""
        with self._cond:
            return len(self._idle), len(self._busy)

    # -- lifecycle of one set -----------------------------------------------------------
    def _new_set(self) -> RegionSet:
        made: list[Region] = []
        try:
            for role, byte_size in (("in", self.input_bytes), ("out", self.output_bytes)):
                region = self.backend.create(region_name(role), byte_size)
                made.append(region)
                self.backend.register(self.client, region)
                region.registered = True
        except BaseException as exc:
            for region in made:
                self._release(region)
            if isinstance(exc, ShmError):
                raise
            if isinstance(exc, InferenceServerException):
                raise ShmError(
                    f"the server refused to register a {self.backend.kind} shared-memory "
                    f"region: {exc.message() or exc}"
                ) from exc
            if isinstance(exc, Exception):
                raise ShmError(
                    f"cannot set up a {self.backend.kind} shared-memory region: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            raise
        regions = RegionSet(input=made[0], output=made[1])
        with self._cond:
            self._live.add(regions)
        return regions

    def _release(self, region: Region) -> None:
        """Unregister, then unmap and unlink; best effort and idempotent.

        Each flag flips before its call: an interrupt in between may leak a region to the
        OS, but a region is never destroyed twice (a double unmap could crash the process).
        """
        if region.registered:
            region.registered = False
            if not self._unregister(region):
                # Triton refuses while a request still uses the region (e.g. after a client
                # timeout); retried before later checkouts and at close.
                with self._cond:
                    self._pending.append(region)
        if not region.destroyed:
            region.destroyed = True
            with contextlib.suppress(Exception):
                self.backend.destroy(region)

    def _unregister(self, region: Region) -> bool:
        """True when the server no longer holds the region (or cannot be reached at all)."""
        try:
            self.backend.unregister(self.client, region)
        except InferenceServerException as exc:
            return str(exc.status()) == "StatusCode.UNAVAILABLE"  # server gone: nothing to undo
        except Exception:
            return False
        return True

    def _retry_unregister(self) -> bool:
        """Try the pending unregistrations again; True when none is left."""
        with self._cond:
            pending, self._pending = self._pending, []
        failed = [region for region in pending if not self._unregister(region)]
        with self._cond:
            self._pending.extend(failed)
            return not self._pending

    def _retire(self, regions: RegionSet) -> None:
        with regions.lock:
            regions.released = True  # first: nobody touches the memory from now on
            self._release(regions.input)
            self._release(regions.output)
        with self._cond:
            self._live.discard(regions)

    # -- lending ------------------------------------------------------------------------
    def _acquire(self, timeout_s: float) -> RegionSet:
        if self._pending:
            self._retry_unregister()
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._closed:
                    raise ShmPoolClosedError("the shared-memory transport is closed")
                if self._idle:
                    regions = self._idle.pop()
                    self._busy.add(regions)
                    return regions
                if len(self._busy) + self._creating < self.size:
                    self._creating += 1  # replace a retired set, outside the lock
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ShmError(
                        f"all {self.size} shared-memory region sets stayed in use for "
                        f"{timeout_s:g} s; raise the pool size or lower the concurrency"
                    )
                self._cond.wait(left)
        try:
            regions = self._new_set()
        except BaseException:
            with self._cond:
                self._creating -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._creating -= 1
            if self._closed:
                closed = True
            else:
                closed = False
                self._busy.add(regions)
        if closed:
            self._retire(regions)
            raise ShmPoolClosedError("the shared-memory transport is closed")
        return regions

    def _return(self, regions: RegionSet, reusable: bool) -> None:
        with self._cond:
            self._busy.discard(regions)
            keep = reusable and not self._closed and not regions.released
            if keep:
                self._idle.append(regions)
            self._cond.notify_all()
        if not keep:
            self._retire(regions)

    @contextlib.contextmanager
    def checkout(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> Iterator[RegionSet]:
        """Lend one region set for one request; it comes back (or is retired) on exit."""
        regions = self._acquire(timeout_s)
        reusable = False
        try:
            yield regions
            reusable = True
        except DispatchServerError:
            reusable = True  # the server answered: it is done with these regions
            raise
        finally:
            self._return(regions, reusable)

    # -- teardown -----------------------------------------------------------------------
    def close(self) -> None:
        """Unregister and destroy every region; idempotent, safe from atexit and handlers.

        Sets lent out are released when they come back; after `close_wait_s` the rest are
        released anyway (a caller then gets ShmPoolClosedError, never freed memory). A region
        the server still uses (a request abandoned after a client timeout) is unregistered
        as soon as the server lets go, within the same `close_wait_s`.
        """
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._cond.notify_all()
        if os.getpid() != self._pid:
            return  # a forked child: the regions belong to the parent
        for regions in idle:
            self._retire(regions)
        deadline = time.monotonic() + self.close_wait_s
        with self._cond:
            while self._busy and time.monotonic() < deadline:
                self._cond.wait(max(0.0, deadline - time.monotonic()))
            stragglers = list(self._live)
        for regions in stragglers:
            self._retire(regions)
        while not self._retry_unregister() and time.monotonic() < deadline:
            time.sleep(0.05)  # an abandoned request still holds a region on the server
        # Last: should a second signal cut this short, atexit still gets its turn.
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)


# ---- (de)serialising tensors -------------------------------------------------------------------


def _wire(array: NDArray[Any]) -> tuple[str, NDArray[np.uint8]]:
    """(Triton datatype, raw bytes) of one input tensor; str elements go out as UTF-8."""
    if array.dtype == np.object_ or array.dtype.kind in "SU":
        if array.size == 0:
            return "BYTES", np.zeros(0, dtype=np.uint8)
        serialized = serialize_byte_tensor(np.asarray(array, dtype=object))
        return "BYTES", np.frombuffer(serialized.item(), dtype=np.uint8)
    contiguous = np.ascontiguousarray(array)
    return np_to_triton_dtype(contiguous.dtype), contiguous.reshape(-1).view(np.uint8)


def _decode_bytes(buffer: NDArray[np.uint8], count: int, name: str) -> list[bytes]:
    """`count` length-prefixed elements from `buffer`, refusing to run past its end."""
    data = buffer.tobytes()
    items: list[bytes] = []
    offset = 0
    for _ in range(count):
        if offset + BYTES_PREFIX > len(data):
            raise DispatchServerError(f"malformed response: {name} runs past its region slot")
        (length,) = struct.unpack_from("<I", data, offset)
        offset += BYTES_PREFIX
        if offset + length > len(data):
            raise DispatchServerError(f"malformed response: {name} runs past its region slot")
        items.append(data[offset : offset + length])
        offset += length
    return items


def _byte_length(value: Any) -> int:
    return len(value.encode("utf-8")) if isinstance(value, str) else len(bytes(value))


def _longest(values: NDArray[Any] | None) -> int:
    """Bytes of the longest element of a BYTES tensor (0 when absent or empty)."""
    if values is None or values.size == 0:
        return 0
    return max(_byte_length(v) for v in values.flat)


def output_sizes(
    inputs: Mapping[str, NDArray[Any]], output_names: Sequence[str], capacity: ShmCapacity
) -> list[tuple[str, int]]:
    """Byte bound of each requested output for this request (see the module docstring)."""
    if "ORDER_IDS" in inputs:
        orders = int(inputs["ORDER_IDS"].shape[0])
        columns = int(inputs["RIDER_IDS"].shape[0]) if "RIDER_IDS" in inputs else capacity.top_k
    elif "CANDIDATE_RIDER_INDEX" in inputs and inputs["CANDIDATE_RIDER_INDEX"].ndim == 2:
        orders, columns = (int(d) for d in inputs["CANDIDATE_RIDER_INDEX"].shape)
    else:
        raise ValueError(
            "cannot bound the outputs: the request has neither ORDER_IDS nor a 2-D "
            "CANDIDATE_RIDER_INDEX"
        )
    top_k = min(capacity.top_k, columns)
    id_bytes = _longest(inputs.get("RIDER_IDS"))  # output ids are rider ids (or b"")
    sizes = []
    for name in output_names:
        spec = _SPECS.get(name)
        if spec is None or spec not in DISPATCH_ENSEMBLE_OUTPUTS:
            raise ValueError(f"no shared-memory size bound for output {name}")
        shape = _bound_shape(name, orders, 0, 0, top_k)
        sizes.append((name, math.prod(shape) * _element_bytes(spec, id_bytes)))
    return sizes


# ---- the transport ---------------------------------------------------------------------------


class GrpcShmTransport(Closing):
    """gRPC with tensors in shared memory; a `Transport`, so `DispatchClient` uses it as is.

    Safe to share between threads (each request borrows its own region set). Use it as a
    context manager or call `close()`; regions are released on exit, error or interrupt.

    >>> with DispatchClient(GrpcShmTransport("127.0.0.1:8001")) as client:  # doctest: +SKIP
    ...     result = client.dispatch(window)
    """

    def __init__(
        self,
        url: str = DEFAULT_GRPC_URL,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        capacity: ShmCapacity | None = None,
        pool_size: int = 4,
        backend: RegionBackend | ShmKind = "system",
        handle_sigterm: bool = True,
        shm_key: str | None = None,
    ) -> None:
        """`shm_key`: the server's shared-memory key; None reads it from the environment
        (`DISPATCH_SHM_KEY`, or the file named by `DISPATCH_SHM_KEY_FILE`)."""
        self.url, tls = split_url(url)
        if tls:  # the tensors never cross the network; only the small gRPC calls would
            raise ValueError("grpc-shm talks to a server on this host: use host:port, not https://")
        self.timeout_s = timeout_s
        self.capacity = capacity or ShmCapacity()
        headers = grpc_headers(SHM_KEY_HEADER, read_key(shm_key, SHM_KEY_ENV))
        if backend == "system":
            backend = SystemShmBackend(headers)
        elif backend == "cuda":
            backend = CudaShmBackend(headers=headers)
        elif isinstance(backend, str):
            raise ValueError(f"backend must be 'system', 'cuda' or a RegionBackend: {backend!r}")
        self._client: Any = grpcclient.InferenceServerClient(url=self.url)
        try:
            self.pool = ShmRegionPool(
                backend,
                self._client,
                input_bytes=self.capacity.input_bytes,
                output_bytes=self.capacity.output_bytes,
                size=pool_size,
                handle_sigterm=handle_sigterm,
            )
        except BaseException as exc:
            self._client.close()
            if isinstance(exc, ShmError) and isinstance(exc.__cause__, InferenceServerException):
                raise grpc_error(exc.__cause__, self.url, self.timeout_s) from exc
            raise

    @property
    def kind(self) -> ShmKind:
        return self.pool.backend.kind

    def infer(
        self,
        model_name: str,
        inputs: dict[str, NDArray[Any]],
        output_names: Sequence[str],
        *,
        request_id: str = "",
    ) -> dict[str, NDArray[Any]]:
        """One request through a borrowed region set; raises before sending if it won't fit."""
        wire = {name: _wire(np.asarray(value)) for name, value in inputs.items()}
        in_slots = plan_slots(
            [(name, data.size) for name, (_, data) in wire.items()],
            self.pool.input_bytes,
            "input",
        )
        out_slots = plan_slots(
            output_sizes(inputs, output_names, self.capacity), self.pool.output_bytes, "output"
        )
        with self.pool.checkout(self.timeout_s) as regions:
            with regions.touching():
                self.pool.backend.write(
                    regions.input, [(slot, wire[slot.name][1]) for slot in in_slots]
                )
            request = []
            for slot in in_slots:
                value = np.asarray(inputs[slot.name])
                item = grpcclient.InferInput(slot.name, list(value.shape), wire[slot.name][0])
                item.set_shared_memory(regions.input.name, slot.byte_size, slot.offset)
                request.append(item)
            wanted = []
            for slot in out_slots:
                output = grpcclient.InferRequestedOutput(slot.name)
                output.set_shared_memory(regions.output.name, slot.byte_size, slot.offset)
                wanted.append(output)
            try:
                result = self._client.infer(
                    model_name,
                    request,
                    outputs=wanted,
                    client_timeout=self.timeout_s,
                    request_id=request_id,
                )
            except InferenceServerException as exc:
                raise grpc_error(exc, self.url, self.timeout_s) from exc
            with regions.touching():
                return self._read_outputs(regions, result, out_slots)

    def _read_outputs(
        self, regions: RegionSet, result: Any, slots: Sequence[Slot]
    ) -> dict[str, NDArray[Any]]:
        used = max((slot.end for slot in slots), default=0)
        memory = self.pool.backend.read(regions.output, used)
        arrays: dict[str, NDArray[Any]] = {}
        for slot in slots:
            meta = result.get_output(slot.name)
            if meta is None:
                raise DispatchServerError(f"the response lacks the requested output {slot.name}")
            shape = [int(d) for d in meta.shape]
            count = math.prod(shape)
            chunk = memory[slot.offset : slot.end]
            if meta.datatype == "BYTES":
                array = np.empty(count, dtype=object)
                array[:] = _decode_bytes(chunk, count, slot.name)
                arrays[slot.name] = array.reshape(shape)
                continue
            spec = _SPECS[slot.name]
            dtype = spec.numpy_dtype
            if meta.datatype != spec.triton_dtype or count * dtype.itemsize > slot.byte_size:
                raise DispatchServerError(
                    f"malformed response: {slot.name} is {meta.datatype} {shape}, "
                    f"expected {spec.triton_dtype} within {slot.byte_size} bytes"
                )
            # copy: the region is reused as soon as this request returns it
            arrays[slot.name] = chunk[: count * dtype.itemsize].view(dtype).reshape(shape).copy()
        return arrays

    def close(self) -> None:
        """Release every region (unregister, unmap, unlink), then the gRPC channel."""
        try:
            self.pool.close()
        finally:
            self._client.close()
