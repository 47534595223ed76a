"""Shared-memory transport: tensors travel through pre-registered memory, gRPC carries metadata.

A co-located caller (same host as the server) writes each request's tensors into a region
the server already knows and asks Triton to write the answer into a second region; the
gRPC message then holds only names, shapes and offsets. Two region kinds share one code
path behind `RegionBackend`:

- `SystemShmBackend`: POSIX shared memory (`/dev/shm`), each region private to the caller's
  uid (`dispatch_client.shm_region`); works wherever client and server share a host.
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
not known before the answer, so each output gets a slot bounded from the request: B orders
and K <= min(top_k, riders or candidates) Top-K columns (contract v2 answers carry no ids,
only rider indices and FP32 objective matrices). A request whose tensors do not fit raises
`ShmRegionTooSmallError` naming the tensor, its byte size and the region size, before
anything is sent.

Layout and sizing live in `dispatch_client.shm_layout`, the region kinds and the pool in
`dispatch_client.shm_pool`; this module is the transport and re-exports their public names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException

from dispatch_client.closing import Closing
from dispatch_client.errors import DispatchServerError
from dispatch_client.keys import SHM_KEY_ENV, SHM_KEY_HEADER, grpc_headers, read_key
from dispatch_client.priority import request_options
from dispatch_client.shm_layout import (
    ALIGNMENT,
    BYTES_PREFIX,
    REGION_PREFIX,
    ShmCapacity,
    ShmError,
    ShmKind,
    ShmPoolClosedError,
    ShmRegionTooSmallError,
    ShmUnavailableError,
    Slot,
    decode_bytes,
    output_sizes,
    plan_slots,
    region_name,
    tensor_bytes,
)
from dispatch_client.shm_pool import (
    CudaShmBackend,
    Region,
    RegionBackend,
    RegionSet,
    ShmRegionPool,
    SystemShmBackend,
)
from dispatch_client.transport import (
    DEFAULT_GRPC_URL,
    DEFAULT_TIMEOUT_S,
    grpc_channel_args,
    grpc_error,
    split_url,
)
from dispatch_contract import spec_by_name

# The transport, and (re-exported) the layout and region names callers already import here.
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
        self._client: Any = grpcclient.InferenceServerClient(
            url=self.url, channel_args=grpc_channel_args()
        )
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
        priority: int = 0,
        timeout_us: int = 0,
        priority_key: str = "",
    ) -> dict[str, NDArray[Any]]:
        """One request through a borrowed region set; raises before sending if it won't fit.
        `priority`, `timeout_us` and `priority_key` as in `Transport.infer`."""
        wire = {name: tensor_bytes(np.asarray(value)) for name, value in inputs.items()}
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
                    **request_options(priority, timeout_us, priority_key),
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
                array[:] = decode_bytes(chunk, count, slot.name)
                arrays[slot.name] = array.reshape(shape)
                continue
            spec = spec_by_name(slot.name)
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
