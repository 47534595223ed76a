"""The shared-memory transport's pool and layout, on real POSIX shared memory, no server.

Regions are really created in /dev/shm through tritonclient's `shared_memory` module; the
server is a stand-in that records (un)registrations and, for the transport tests, reads the
request from and writes the answer into the regions through its own mapping of /dev/shm,
the way Triton does.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException

from dispatch_client import DispatchClient, window_from_json
from dispatch_client.cli import EXIT_INPUT, EXIT_OK, EXIT_SERVER, main
from dispatch_client.connect import ProtocolName
from dispatch_client.errors import DispatchConnectionError, DispatchServerError
from dispatch_client.keys import SHM_KEY_HEADER, grpc_headers
from dispatch_client.shm import (
    ALIGNMENT,
    REGION_PREFIX,
    CudaShmBackend,
    GrpcShmTransport,
    ShmCapacity,
    ShmError,
    ShmPoolClosedError,
    ShmRegionPool,
    ShmRegionTooSmallError,
    ShmUnavailableError,
    Slot,
    SystemShmBackend,
    output_sizes,
    plan_slots,
    region_name,
)
from dispatch_client.transport import Transport
from dispatch_contract import DISPATCH_ENSEMBLE_OUTPUTS, MAX_CANDIDATES, batched, pack_window
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window

Array = NDArray[Any]
SHM = Path("/dev/shm")
EXAMPLE = Path(__file__).resolve().parents[3] / "client" / "examples" / "window_small.json"
OUTPUT_NAMES = [spec.name for spec in DISPATCH_ENSEMBLE_OUTPUTS]


def our_files() -> set[str]:
    return {p.name for p in SHM.glob(f"{REGION_PREFIX}_{os.getpid()}_*")}


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    before = our_files()
    yield
    assert our_files() == before, "a test left shared-memory files behind"


class Registrar:
    """Stands in for the gRPC client's (un)register calls; can be told to refuse."""

    def __init__(self, refuse_after: int | None = None) -> None:
        self.registered: dict[str, tuple[str, int]] = {}
        self.calls: list[tuple[str, str]] = []
        self.refuse_after = refuse_after

    def register_system_shared_memory(self, name: str, key: str, byte_size: int) -> None:
        if self.refuse_after is not None and len(self.registered) >= self.refuse_after:
            raise InferenceServerException("failed to register shared memory region")
        assert name not in self.registered, f"{name} registered twice"
        self.registered[name] = (key, byte_size)
        self.calls.append(("register", name))

    def unregister_system_shared_memory(
        self, name: str, client_timeout: float | None = None
    ) -> None:
        self.registered.pop(name, None)
        self.calls.append(("unregister", name))


def make_pool(client: Any, size: int = 2, **kwargs: Any) -> ShmRegionPool:
    return ShmRegionPool(
        SystemShmBackend(),
        client,
        input_bytes=kwargs.pop("input_bytes", 4096),
        output_bytes=kwargs.pop("output_bytes", 1024),
        size=size,
        handle_sigterm=False,
        **kwargs,
    )


# ---- names and layout ---------------------------------------------------------------------


def test_region_names_are_unique_and_carry_the_pid() -> None:
    names: list[str] = []
    lock = threading.Lock()

    def take() -> None:
        mine = [region_name("in") for _ in range(500)]
        with lock:
            names.extend(mine)

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(names)) == len(names) == 2000
    assert all(n.startswith(f"{REGION_PREFIX}_{os.getpid()}_") for n in names)


def test_slots_are_aligned_and_back_to_back() -> None:
    slots = plan_slots([("A", 10), ("B", 64), ("C", 1)], 1000, "input")
    assert [(s.name, s.offset, s.byte_size) for s in slots] == [
        ("A", 0, 10),
        ("B", ALIGNMENT, 64),
        ("C", 2 * ALIGNMENT, 1),
    ]


def test_a_tensor_past_the_region_end_is_named_with_its_size() -> None:
    with pytest.raises(ShmRegionTooSmallError) as caught:
        plan_slots([("ORDER_IDS", 100), ("RIDER_IDS", 900)], 1000, "input")
    error = caught.value
    assert (error.tensor, error.byte_size, error.region_bytes) == ("RIDER_IDS", 900, 1000)
    assert error.direction == "input"
    assert "RIDER_IDS (900 bytes)" in error.message and "1000-byte input" in error.message
    assert isinstance(error, ShmError)


def test_output_region_is_sized_from_orders_k_and_64_byte_ids() -> None:
    capacity = ShmCapacity(max_orders=2, max_riders=3, top_k=3)
    expected = plan_slots(
        [  # contract v2: no ids in the answer, objectives as one [B, K, 4] matrix
            ("TOPK_RIDER_INDEX", 2 * 3 * 4),
            ("TOPK_OBJECTIVES", 2 * 3 * 4 * 4),
            ("ASSIGNED_RIDER_INDEX", 2 * 4),
            ("ASSIGNED_SCORE", 2 * 4),
            ("ASSIGNED_OBJECTIVES", 2 * 3 * 4),
            ("ORDER_MODEL_VERSION", 2 * 4),  # the routing outputs of `dispatch`
            ("ORDER_FALLBACK_LEVEL", 2 * 4),
            ("ORDER_LOCATION_SOURCE", 2 * 2 * 4),  # the encoder's: how points were found
            ("WINDOW_CITY", 4 + 64),  # and the city that served the window: an id <= 64 bytes
        ],
        10**6,
        "output",
    )
    assert capacity.output_bytes == expected[-1].end


def window(orders: int, riders: int, seed: int = 1) -> dict[str, Array]:
    """One window's v2 request tensors, batch dimension 1 first, as the client sends them."""
    return batched(window_to_wire(generate_window(np.random.default_rng(seed), orders, riders)))


def test_capacity_holds_a_window_of_its_size_with_64_byte_ids() -> None:
    capacity = ShmCapacity(max_orders=8, max_riders=40)
    tensors = window(8, 40)
    long_ids = np.array([b"r" * 64 for _ in range(40)], dtype=object)
    long_ids[:] = [b"%063d" % i + b"x" for i in range(40)]
    tensors["RIDER_IDS"] = long_ids[np.newaxis]
    tensors["ORDER_IDS"] = np.array([[b"%064d" % i for i in range(8)]], dtype=object)
    tensors["OBJECTIVE_WEIGHTS"] = np.array([[0.5, 0.3, 0.2]], np.float32)
    sizes = [(name, len(_raw(value))) for name, value in tensors.items()]
    plan_slots(sizes, capacity.input_bytes, "input")  # fits
    plan_slots(output_sizes(tensors, OUTPUT_NAMES, capacity), capacity.output_bytes, "output")
    larger = [(name, len(_raw(value))) for name, value in window(8, 120).items()]
    with pytest.raises(ShmRegionTooSmallError):  # a one-order, one-rider bound holds less
        plan_slots(larger, ShmCapacity(max_orders=1, max_riders=1).input_bytes, "input")


def test_output_bound_follows_the_request() -> None:
    capacity = ShmCapacity()  # top_k = MAX_CANDIDATES
    tensors = window(3, 4)
    sizes = dict(output_sizes(tensors, OUTPUT_NAMES, capacity))
    # K <= min(top_k, R): a 4-rider window has at most 4 columns
    assert sizes["TOPK_RIDER_INDEX"] == 3 * 4 * 4
    assert sizes["TOPK_OBJECTIVES"] == 3 * 4 * 4 * 4
    assert sizes["ASSIGNED_SCORE"] == 3 * 4
    assert sizes["ASSIGNED_OBJECTIVES"] == 3 * 3 * 4
    features = {
        "CANDIDATE_RIDER_INDEX": np.zeros((1, 3, 2), np.int32),
        "RIDER_IDS": tensors["RIDER_IDS"],
    }
    objectives = dict(output_sizes(features, OUTPUT_NAMES, capacity))["TOPK_OBJECTIVES"]
    assert objectives == 3 * 2 * 4 * 4
    with pytest.raises(ValueError, match="no shared-memory size bound for output X"):
        output_sizes(tensors, ["X"], capacity)
    assert capacity.top_k == MAX_CANDIDATES


def test_capacity_for_a_window() -> None:
    capacity = ShmCapacity.for_window(window(5, 9))
    assert (capacity.max_orders, capacity.max_riders) == (5, 9)
    with pytest.raises(ValueError, match="max_orders"):
        ShmCapacity(max_orders=0)


# ---- the pool -----------------------------------------------------------------------------


def test_regions_are_registered_once_and_reused() -> None:
    client = Registrar()
    with make_pool(client, size=2) as pool:
        names = set(pool.region_names())
        assert len(names) == 4 and set(client.registered) == names
        assert our_files() >= names
        for _ in range(50):
            with pool.checkout(1.0) as regions:
                assert set(regions.names) <= names
        assert set(pool.region_names()) == names
        assert len(client.calls) == 4  # four registrations, nothing since
        assert pool.counts() == (2, 0)
    assert client.registered == {}
    assert not (our_files() & names)


def test_close_releases_everything_and_is_idempotent() -> None:
    client = Registrar()
    pool = make_pool(client, size=3)
    names = set(pool.region_names())
    pool.close()
    pool.close()
    assert pool.closed
    assert client.registered == {}
    assert sorted(n for call, n in client.calls if call == "unregister") == sorted(names)
    assert not (our_files() & names)
    with pytest.raises(ShmPoolClosedError), pool.checkout(0.1):
        pass


def test_concurrent_callers_never_share_a_region_set() -> None:
    client = Registrar()
    holders: dict[str, int] = {}
    lock = threading.Lock()
    failures: list[str] = []

    def work(marker: int) -> None:
        for _ in range(200):
            with pool.checkout(10.0) as regions:
                key = regions.input.name
                with lock:
                    holders[key] = holders.get(key, 0) + 1
                    if holders[key] != 1:
                        failures.append(f"{key} held by {holders[key]} callers")
                view = regions.input.view
                assert view is not None
                view[:8] = np.frombuffer(struct.pack("<q", marker), np.uint8)
                time.sleep(0)  # let the others run while we hold it
                if struct.unpack("<q", view[:8].tobytes())[0] != marker:
                    failures.append(f"{key} overwritten while in use")
                with lock:
                    holders[key] -= 1

    with make_pool(client, size=3) as pool:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        assert pool.counts() == (3, 0)
        assert len(client.calls) == 6


def test_a_busy_pool_times_out_with_a_clear_error() -> None:
    with make_pool(Registrar(), size=1) as pool, pool.checkout(1.0):
        started = time.monotonic()
        busy = "all 1 shared-memory region sets stayed in use"
        with pytest.raises(ShmError, match=busy), pool.checkout(0.05):
            pass
        assert time.monotonic() - started < 5


def test_an_error_mid_request_retires_the_set_and_a_fresh_one_replaces_it() -> None:
    client = Registrar()
    with make_pool(client, size=1) as pool:
        (first,) = {n for n in pool.region_names() if n.endswith("_in")}
        old = set(pool.region_names())
        with pytest.raises(RuntimeError, match="boom"), pool.checkout(1.0):
            raise RuntimeError("boom")
        assert pool.region_names() == []
        assert not (our_files() & old)
        assert not (set(client.registered) & old)
        with pool.checkout(1.0) as regions:
            assert regions.input.name != first
            assert regions.input.name in client.registered
        assert pool.counts() == (1, 0)


def test_interrupts_release_the_set_too() -> None:
    client = Registrar()
    with make_pool(client, size=1) as pool:
        old = set(pool.region_names())
        with pytest.raises(KeyboardInterrupt), pool.checkout(1.0):
            raise KeyboardInterrupt
        assert not (our_files() & old)


def test_a_set_an_interrupt_left_locked_is_still_released_by_its_thread() -> None:
    """A signal can raise after `touching()` took the set's lock and before its `with` can
    release it; the set is then retired by the same thread on its way out, which must not
    wait for itself."""
    client = Registrar()
    pool = make_pool(client, size=1)
    old = set(pool.region_names())
    stranded: list[Any] = []

    def interrupted() -> None:
        with contextlib.suppress(KeyboardInterrupt), pool.checkout(1.0) as regions:
            touching = regions.touching()
            touching.__enter__()  # the lock is taken; the interrupt lands before the body
            stranded.append(touching)
            raise KeyboardInterrupt
        stranded.clear()  # the traceback goes: the generator ends here and lets go

    worker = threading.Thread(target=interrupted, daemon=True)
    worker.start()
    worker.join(timeout=5)
    assert not worker.is_alive(), "retiring the set waited for its own stranded lock"
    assert not (our_files() & old)
    assert not (set(client.registered) & old)
    pool.close()
    assert client.registered == {}


def test_a_server_refusal_keeps_the_set() -> None:
    client = Registrar()
    with make_pool(client, size=1) as pool:
        names = set(pool.region_names())
        with pytest.raises(DispatchServerError), pool.checkout(1.0):
            raise DispatchServerError("ORDER_IDS: bad", "StatusCode.INVALID_ARGUMENT")
        assert set(pool.region_names()) == names
        assert pool.counts() == (1, 0)


def test_a_region_the_server_still_uses_is_unregistered_once_it_lets_go() -> None:
    class Busy(Registrar):
        refusals = 2

        def unregister_system_shared_memory(
            self, name: str, client_timeout: float | None = None
        ) -> None:
            if self.refusals > 0:
                self.refusals -= 1
                raise InferenceServerException("region is in use", "StatusCode.INTERNAL")
            super().unregister_system_shared_memory(name, client_timeout)

    client = Busy()
    with make_pool(client, size=1) as pool:
        old = set(pool.region_names())
        with pytest.raises(DispatchConnectionError), pool.checkout(1.0):
            raise DispatchConnectionError("no answer in time")
        assert not (our_files() & old)  # unmapped and unlinked at once
        assert set(client.registered) == old  # the server said "in use"
        with pool.checkout(1.0):  # the next checkout tries again
            pass
        assert not (set(client.registered) & old)
    assert client.registered == {}


def test_a_refused_registration_leaves_nothing_behind() -> None:
    client = Registrar(refuse_after=3)
    with pytest.raises(ShmError, match="refused to register"):
        make_pool(client, size=2)
    assert client.registered == {}


def test_closing_while_a_set_is_lent_releases_it_on_return() -> None:
    client = Registrar()
    pool = make_pool(client, size=2)
    pool.close_wait_s = 0.05  # type: ignore[misc]
    with pytest.raises(ShmPoolClosedError), pool.checkout(1.0) as regions:
        pool.close()
        with regions.touching():  # the memory is gone: refused, not touched
            pass
    assert client.registered == {}


# ---- the CUDA backend's logic (no GPU here) ---------------------------------------------------


class FakeCudaModule:
    def __init__(self) -> None:
        self.writes: list[list[Array]] = []

    def set_shared_memory_region(self, handle: Any, values: list[Array]) -> None:
        self.writes.append(values)


def test_cuda_writes_one_buffer_from_zero_with_zeroed_gaps() -> None:
    module = FakeCudaModule()
    backend = CudaShmBackend(module=module)
    region = SimpleNamespace(handle=object())
    chunks = [
        (Slot("A", 0, 3), np.frombuffer(b"abc", np.uint8)),
        (Slot("B", 64, 2), np.frombuffer(b"de", np.uint8)),
    ]
    backend.write(region, chunks)  # type: ignore[arg-type]
    ((buffer,),) = module.writes  # one buffer: one host-to-device transfer per request
    assert buffer.tobytes() == b"abc" + bytes(61) + b"de"


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="a GPU is present")
def test_cuda_shared_memory_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(ShmUnavailableError):
        CudaShmBackend().create(region_name("in"), 1024)


# ---- the transport against a stand-in server ------------------------------------------------


def _raw(value: Array) -> bytes:
    array = np.asarray(value)
    if array.dtype == object:
        return b"".join(struct.pack("<I", len(bytes(v))) + bytes(v) for v in array.flat)
    return np.ascontiguousarray(array).tobytes()


def _params(tensor: Any) -> tuple[str, int, int]:
    p = tensor.parameters
    return (
        p["shared_memory_region"].string_param,
        p["shared_memory_byte_size"].int64_param,
        p["shared_memory_offset"].int64_param,
    )


class ShmServer:
    """Reads requests from and writes answers into /dev/shm like Triton; Top-1 = rider 0."""

    registered: ClassVar[dict[str, str]] = {}
    requests: ClassVar[list[dict[str, Array]]] = []
    fail_with: ClassVar[BaseException | None] = None
    top_k: ClassVar[int] = 2

    def __init__(self, url: str, channel_args: object = None) -> None:
        self.url = url

    def register_system_shared_memory(self, name: str, key: str, byte_size: int) -> None:
        ShmServer.registered[name] = key

    def unregister_system_shared_memory(
        self, name: str, client_timeout: float | None = None
    ) -> None:
        ShmServer.registered.pop(name)

    def _mapping(self, region: str) -> mmap.mmap:
        with open(SHM / ShmServer.registered[region].lstrip("/"), "r+b") as handle:
            return mmap.mmap(handle.fileno(), 0)

    def infer(self, model: str, inputs: list[Any], outputs: list[Any], **kw: Any) -> Any:
        arrays = {}
        for item in inputs:
            tensor = item._get_tensor()
            region, size, offset = _params(tensor)
            with self._mapping(region) as memory:
                data = memory[offset : offset + size]
            if tensor.datatype == "BYTES":
                values, pos = [], 0
                while pos < len(data):
                    (length,) = struct.unpack_from("<I", data, pos)
                    values.append(data[pos + 4 : pos + 4 + length])
                    pos += 4 + length
                arrays[tensor.name] = np.array(values, dtype=object)
            else:
                dtype = {"FP64": np.float64, "FP32": np.float32, "INT64": np.int64}.get(
                    tensor.datatype, np.int32
                )
                arrays[tensor.name] = np.frombuffer(data, dtype).reshape(list(tensor.shape))
        ShmServer.requests.append(arrays)
        if ShmServer.fail_with is not None:
            raise ShmServer.fail_with
        n = len(arrays["ORDER_IDS"])
        k = ShmServer.top_k
        objectives = np.zeros((n, k, 4), np.float32)  # score, ETA, on-time, cost
        objectives[:, 0] = [0.5, 20, 0.9, 7]
        one_window = {
            "TOPK_RIDER_INDEX": np.array([[0] + [-1] * (k - 1)] * n, np.int32),
            "TOPK_OBJECTIVES": objectives,
            "ASSIGNED_RIDER_INDEX": np.array([0] + [-1] * (n - 1), np.int32),
            "ASSIGNED_SCORE": np.array([0.5] + [0.0] * (n - 1), np.float32),
            "ASSIGNED_OBJECTIVES": np.array([[20, 0.9, 7]] + [[0, 0, 0]] * (n - 1), np.float32),
            "ORDER_MODEL_VERSION": np.ones(n, np.int32),
            "ORDER_FALLBACK_LEVEL": np.zeros(n, np.int32),
            "ORDER_LOCATION_SOURCE": np.zeros((n, 2), np.int32),
            "WINDOW_CITY": np.array([b"shanghai"], dtype=object),
        }
        answer = {name: value[np.newaxis] for name, value in one_window.items()}
        meta = {}
        for item in outputs:
            tensor = item._get_tensor()
            region, size, offset = _params(tensor)
            raw = _raw(answer[tensor.name])
            if len(raw) > size:
                raise InferenceServerException(
                    f"shared memory size specified with the request for output "
                    f"'{tensor.name}' ({size} bytes) should be at least {len(raw)} bytes"
                )
            with self._mapping(region) as memory:
                memory[offset : offset + len(raw)] = raw
            value = answer[tensor.name]
            datatype = (
                "BYTES" if value.dtype == object else {"f": "FP32"}.get(value.dtype.kind, "INT32")
            )
            meta[tensor.name] = SimpleNamespace(shape=list(value.shape), datatype=datatype)
        return SimpleNamespace(get_output=meta.get)

    def close(self) -> None:
        pass


@pytest.fixture
def shm_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[ShmServer]]:
    monkeypatch.setattr("dispatch_client.shm.grpcclient.InferenceServerClient", ShmServer)
    # SIGTERM handling is tested in a child process (integration); keep pytest's own.
    monkeypatch.setattr("dispatch_client.shm_pool._install_sigterm_handler", lambda: None)
    ShmServer.registered = {}
    ShmServer.requests = []
    ShmServer.fail_with = None
    ShmServer.top_k = 2
    yield ShmServer
    assert ShmServer.registered == {}, "regions still registered after the test"


def test_the_transport_round_trips_through_shared_memory(shm_server: type[ShmServer]) -> None:
    tensors = window_from_json(EXAMPLE.read_bytes())
    with DispatchClient(GrpcShmTransport("local:1", capacity=ShmCapacity(4, 8))) as client:
        registered = dict(shm_server.registered)
        results = [client.dispatch(tensors) for _ in range(3)]
        assert shm_server.registered == registered  # registered once, reused
    (sent, *_) = shm_server.requests
    for name, value in batched(pack_window(tensors)).items():
        if value.dtype == object:  # the stand-in decodes BYTES flat
            assert sent[name].tolist() == value.reshape(-1).tolist(), name
        else:
            assert sent[name].tolist() == value.tolist(), name
    first = results[0].orders[0]
    assert first.assigned_rider_id == tensors["RIDER_IDS"][0].decode()
    assert [c.rider_id for c in first.top_k] == [first.assigned_rider_id]
    assert results[0].city == "shanghai"  # the stand-in's WINDOW_CITY, read from its slot
    assert results[0] == results[2]


def test_an_oversize_request_is_refused_before_sending(shm_server: type[ShmServer]) -> None:
    with GrpcShmTransport("local:1", capacity=ShmCapacity(1, 2), handle_sigterm=False) as t:
        with pytest.raises(ShmRegionTooSmallError) as caught:
            t.infer("dispatch", window(1, 200), OUTPUT_NAMES)  # 200 riders: inputs too big
        error = caught.value
        assert (error.direction, error.region_bytes) == ("input", t.pool.input_bytes)
        assert error.tensor.startswith("RIDER_")
        assert f"{error.tensor} ({error.byte_size} bytes)" in error.message
        assert shm_server.requests == []
        assert t.pool.counts() == (4, 0)
        small = window(1, 2)
        assert t.infer("dispatch", small, OUTPUT_NAMES)["ASSIGNED_RIDER_INDEX"].tolist() == [[0]]
    with GrpcShmTransport("local:1", capacity=ShmCapacity(1, 400), handle_sigterm=False) as t:
        with pytest.raises(ShmRegionTooSmallError) as caught:
            t.infer("dispatch", window(20, 5), OUTPUT_NAMES)  # 20 orders: answer too big
        error = caught.value
        assert (error.direction, error.region_bytes) == ("output", t.pool.output_bytes)
        assert len(shm_server.requests) == 1


def test_an_answer_wider_than_its_slot_is_a_server_error_not_garbage(
    shm_server: type[ShmServer],
) -> None:
    capacity = ShmCapacity(2, 8, top_k=1)  # the stand-in answers K = 2
    with GrpcShmTransport("local:1", capacity=capacity, handle_sigterm=False) as t:
        with pytest.raises(DispatchServerError, match="should be at least"):
            t.infer("dispatch", window(1, 8), OUTPUT_NAMES)
        assert t.pool.counts() == (4, 0)  # the server answered: the set is reusable


@pytest.mark.parametrize(
    ("error", "kind", "kept"),
    [
        (InferenceServerException("bad", "StatusCode.INVALID_ARGUMENT"), DispatchServerError, 1),
        (InferenceServerException("", "StatusCode.DEADLINE_EXCEEDED"), DispatchConnectionError, 0),
        (RuntimeError("boom"), RuntimeError, 0),
    ],
)
def test_failed_requests_keep_or_retire_their_set(
    shm_server: type[ShmServer], error: BaseException, kind: type[BaseException], kept: int
) -> None:
    with GrpcShmTransport("local:1", pool_size=1, handle_sigterm=False) as t:
        before = set(t.pool.region_names())
        shm_server.fail_with = error
        with pytest.raises(kind):
            t.infer("dispatch", window(1, 3), OUTPUT_NAMES)
        assert len(set(t.pool.region_names()) & before) == 2 * kept
        still_registered = before & set(shm_server.registered)
        assert still_registered == (before if kept else set())
        shm_server.fail_with = None
        answer = t.infer("dispatch", window(1, 3), OUTPUT_NAMES)
        assert answer["TOPK_RIDER_INDEX"].shape == (1, 1, 2)


def test_unreachable_server_at_setup_is_a_connection_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Down(ShmServer):
        def register_system_shared_memory(self, name: str, key: str, byte_size: int) -> None:
            raise InferenceServerException(
                "failed to connect to all addresses", "StatusCode.UNAVAILABLE"
            )

    monkeypatch.setattr("dispatch_client.shm.grpcclient.InferenceServerClient", Down)
    with pytest.raises(DispatchConnectionError, match="cannot reach local:1 over gRPC"):
        GrpcShmTransport("local:1", handle_sigterm=False)


def test_cli_grpc_shm(shm_server: type[ShmServer], capsys: pytest.CaptureFixture[str]) -> None:
    built: list[str] = []

    def factory(protocol: ProtocolName, url: str | None, timeout_s: float) -> Transport:
        built.append(protocol)
        return GrpcShmTransport(url or "local:1", timeout_s=timeout_s, handle_sigterm=False)

    assert main(["--protocol", "grpc-shm", str(EXAMPLE)], transport_factory=factory) == EXIT_OK
    assert built == ["grpc-shm"]
    assert '"assigned_rider_id"' in capsys.readouterr().out


def test_cli_grpc_shm_default_factory_sizes_regions_for_the_window(
    shm_server: type[ShmServer], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--protocol", "grpc-shm", str(EXAMPLE)]) == EXIT_OK
    assert capsys.readouterr().err == ""
    shm_server.fail_with = InferenceServerException("nope", "StatusCode.INTERNAL")
    argv = ["--protocol", "grpc-shm", "--request-id", "r-1", str(EXAMPLE)]
    assert main(argv) == EXIT_SERVER
    assert capsys.readouterr().err == "error: nope (request id r-1)\n"
    shm_server.fail_with = InferenceServerException("bad", "StatusCode.INVALID_ARGUMENT")
    assert main(argv) == EXIT_INPUT  # the server refused the input: the same rule as ours
    assert capsys.readouterr().err == "error: bad (request id r-1)\n"


def test_a_window_with_overlong_ids_still_fits_so_the_server_names_the_rule() -> None:
    tensors = window(2, 3)
    tensors["RIDER_IDS"] = np.array([[b"r" * 100, b"s", b"t"]], dtype=object)
    capacity = ShmCapacity.for_window(tensors)
    assert capacity.max_id_bytes == 100
    sizes = [(name, len(_raw(value))) for name, value in tensors.items()]
    plan_slots(sizes, capacity.input_bytes, "input")
    plan_slots(output_sizes(tensors, OUTPUT_NAMES, capacity), capacity.output_bytes, "output")


SMALL_POOL: dict[str, Any] = {
    "input_bytes": 64,
    "output_bytes": 64,
    "size": 1,
    "handle_sigterm": False,
}


class KeyedRegistrar:
    """A server that, like a locked Triton, (un)registers only with the shm key header."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.registered: set[str] = set()

    def _check(self, headers: dict[str, str] | None) -> None:
        if (headers or {}).get("triton-grpc-protocol-shm-key") != self.key:
            raise InferenceServerException(
                "This API is restricted", status="StatusCode.UNAVAILABLE"
            )

    def register_system_shared_memory(
        self, name: str, key: str, byte_size: int, headers: dict[str, str] | None = None
    ) -> None:
        self._check(headers)
        self.registered.add(name)

    def unregister_system_shared_memory(
        self, name: str, headers: dict[str, str] | None = None, client_timeout: float | None = None
    ) -> None:
        self._check(headers)
        self.registered.discard(name)


def test_the_shm_key_travels_with_registration_and_unregistration() -> None:
    server = KeyedRegistrar("k3y")
    backend = SystemShmBackend(grpc_headers(SHM_KEY_HEADER, "k3y"))
    pool = ShmRegionPool(
        backend, server, input_bytes=64, output_bytes=64, size=1, handle_sigterm=False
    )
    assert len(server.registered) == 2
    pool.close()
    assert server.registered == set()


def test_without_the_shm_key_registration_is_refused_and_nothing_is_left() -> None:
    server = KeyedRegistrar("k3y")
    with pytest.raises(ShmError, match="refused to register"):
        ShmRegionPool(
            SystemShmBackend(),
            server,
            input_bytes=64,
            output_bytes=64,
            size=1,
            handle_sigterm=False,
        )
    assert server.registered == set()
