"""Shared-memory regions for the dispatch client: system and CUDA backends, and the pool of
region sets that requests borrow and return (released at exit and on SIGTERM).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, ClassVar, Protocol

import numpy as np
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException

from dispatch_client.closing import Closing
from dispatch_client.errors import DispatchServerError
from dispatch_client.shm_layout import (
    ShmError,
    ShmKind,
    ShmPoolClosedError,
    ShmUnavailableError,
    Slot,
    region_name,
)
from dispatch_client.shm_region import PrivateRegion, create_private_region
from dispatch_client.transport import DEFAULT_TIMEOUT_S

__all__ = [
    "CudaShmBackend",
    "Region",
    "RegionBackend",
    "RegionSet",
    "ShmRegionPool",
    "SystemShmBackend",
]

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

    def unregister(self, client: Any, region: Region, timeout_s: float) -> None: ...

    def write(self, region: Region, chunks: Sequence[tuple[Slot, NDArray[np.uint8]]]) -> None:
        """Copy each chunk (raw bytes as uint8) to its slot; slots are in offset order."""
        ...

    def read(self, region: Region, byte_size: int) -> NDArray[np.uint8]:
        """The region's first `byte_size` bytes on the host, valid until the set is returned."""
        ...

    def destroy(self, region: Region) -> None: ...


class SystemShmBackend:
    """POSIX shared memory (`/dev/shm/<name>`), private to this process's uid
    (`dispatch_client.shm_region`: created exclusively, mode 0600, owner checked)."""

    kind: ShmKind = "system"

    def __init__(self, headers: Mapping[str, str] | None = None) -> None:
        """`headers` go with (un)registration: the server's shared-memory key (see `keys`)."""
        self.headers = dict(headers or {})

    def _auth(self) -> dict[str, Any]:
        return {"headers": self.headers} if self.headers else {}

    def create(self, name: str, byte_size: int) -> Region:
        handle = create_private_region(name, byte_size)
        try:
            # A writable uint8 view of the mapping: requests are copied in and answers out
            # with one memcpy each, no intermediate buffers.
            view = np.frombuffer(handle.mapping, dtype=np.uint8, count=byte_size)
        except BaseException:
            handle.destroy()
            raise
        return Region(name=name, byte_size=byte_size, handle=handle, view=view)

    def register(self, client: Any, region: Region) -> None:
        handle: PrivateRegion = region.handle
        handle.verify()  # the server opens the region by name: it must still be ours
        client.register_system_shared_memory(
            region.name, f"/{region.name}", region.byte_size, **self._auth()
        )

    def unregister(self, client: Any, region: Region, timeout_s: float) -> None:
        client.unregister_system_shared_memory(
            region.name, client_timeout=timeout_s, **self._auth()
        )

    def write(self, region: Region, chunks: Sequence[tuple[Slot, NDArray[np.uint8]]]) -> None:
        assert region.view is not None
        for slot, data in chunks:
            region.view[slot.offset : slot.end] = data

    def read(self, region: Region, byte_size: int) -> NDArray[np.uint8]:
        assert region.view is not None
        return region.view[:byte_size]

    def destroy(self, region: Region) -> None:
        region.view = None  # drop our reference to the mapping before it is unmapped
        handle: PrivateRegion = region.handle
        handle.destroy()


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

    def unregister(self, client: Any, region: Region, timeout_s: float) -> None:
        client.unregister_cuda_shared_memory(region.name, client_timeout=timeout_s, **self._auth())

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
    # Held while the host touches the memory; retiring the set takes it before unmapping.
    # Reentrant: a signal's exception can land in `touching()` after the lock was taken and
    # before its `with` could undo that (the generator is left suspended, holding it); the
    # same thread then retires the set on its way out and must not wait for itself.
    lock: threading.RLock = field(default_factory=threading.RLock)
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
    # One unregistration call; an unanswered one is retried like a refused one, so a busy
    # or wedged server cannot hold close() (or a signal's exit) for long.
    unregister_timeout_s: ClassVar[float] = 2.0

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
        """Unmap and unlink, then unregister; best effort and idempotent.

        Local first: the server keeps its own mapping of a registered region, so unlinking
        ours never disturbs it, and a process killed while the server is slow to answer
        the unregistration leaves nothing in /dev/shm. Each flag flips before its call: an
        interrupt in between may leak a region, but a region is never destroyed twice (a
        double unmap could crash the process).
        """
        if not region.destroyed:
            region.destroyed = True
            with contextlib.suppress(Exception):
                self.backend.destroy(region)
        if region.registered:
            region.registered = False
            if not self._unregister(region):
                # Triton refuses while a request still uses the region (e.g. after a client
                # timeout); retried before later checkouts and at close.
                with self._cond:
                    self._pending.append(region)

    def _unregister(self, region: Region) -> bool:
        """True when the server no longer holds the region (or cannot be reached at all)."""
        try:
            self.backend.unregister(self.client, region, self.unregister_timeout_s)
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
