"""Zero-copy transport and the feature-level entry point against the live server.

Regions are real /dev/shm regions registered with the real server; "ours" are those whose
name carries this process's pid (or a child's). After every test the server lists none of
ours and /dev/shm holds no file of ours. The many-requests test sends 2,000 windows;
`make test-hostile` (``DISPATCH_HOSTILE_FULL=1``) sends 10,000.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from dispatch_client import DispatchClient, DispatchResult
from dispatch_client.errors import DispatchConnectionError, DispatchServerError
from dispatch_client.keys import SHM_KEY_ENV, SHM_KEY_HEADER, grpc_headers
from dispatch_client.shm import REGION_PREFIX, GrpcShmTransport, ShmCapacity, ShmRegionTooSmallError
from dispatch_contract import (
    FEATURE_ENTRY_INPUTS,
    FEATURE_ENTRY_MODEL_NAME,
    FEATURE_ENTRY_OUTPUTS,
    batched,
)
from dispatch_service.core.backend_shm import stub_region_name
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.core.repository_layout import ENCODER_MODEL, model_layout
from dispatch_service.core.settings import load_settings
from dispatch_service.domain.cities import CitySettings
from dispatch_service.domain.features import EncoderSettings, encode_window
from dispatch_service.domain.window_wire import window_from_wire
from dispatch_service.ops.host import proc_stat
from dispatch_service.ops.server import TritonServer
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from dispatch_service.pipeline.stacking import StackingSettings
from other_user import as_other_user, needs_root, try_open
from triton_helpers import grpc_inputs, sim_window

Arrays = dict[str, np.ndarray[Any, Any]]
# What both entry points answer (`dispatch` adds ORDER_LOCATION_SOURCE, from its encoder).
NAMES = [spec.name for spec in FEATURE_ENTRY_OUTPUTS]
EXAMPLE = REPO_ROOT / "client" / "examples" / "window_small.json"
SHM = Path("/dev/shm")


def infer_raw(client: grpcclient.InferenceServerClient, tensors: Arrays, model: str) -> Arrays:
    outputs = [grpcclient.InferRequestedOutput(n) for n in NAMES]
    result = client.infer(model, grpc_inputs(tensors), outputs=outputs)
    return {name: result.as_numpy(name) for name in NAMES}


def assert_same(left: Arrays, right: Arrays) -> None:
    assert set(left) == set(right)
    for name in left:
        assert left[name].dtype == right[name].dtype, name
        assert left[name].shape == right[name].shape, name
        assert np.array_equal(left[name], right[name]), name


def server_regions(client: grpcclient.InferenceServerClient, pid: int) -> set[str]:
    # The shared-memory group is locked: the conftest exports the session server's key.
    headers = grpc_headers(SHM_KEY_HEADER, os.environ[SHM_KEY_ENV])
    status = client.get_system_shared_memory_status(headers=headers)
    return {name for name in status.regions if name.startswith(f"{REGION_PREFIX}_{pid}_")}


def shm_files(pid: int) -> set[str]:
    return {p.name for p in SHM.glob(f"{REGION_PREFIX}_{pid}_*")}


@pytest.fixture(autouse=True)
def nothing_left_behind(grpc_client: grpcclient.InferenceServerClient) -> Iterator[None]:
    yield
    assert server_regions(grpc_client, os.getpid()) == set(), "regions still registered"
    assert shm_files(os.getpid()) == set(), "stale /dev/shm files"


def transport(triton: TritonServer, capacity: ShmCapacity, **kwargs: Any) -> GrpcShmTransport:
    # SIGTERM handling is exercised in child processes below; keep pytest's own here.
    return GrpcShmTransport(triton.grpc_url, capacity=capacity, handle_sigterm=False, **kwargs)


# ---- results ------------------------------------------------------------------------------


def test_results_through_shared_memory_equal_plain_grpc(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    window = sim_window(seed=2024, orders=64, riders=200)
    plain = infer_raw(grpc_client, window, "dispatch")
    with transport(triton, ShmCapacity.for_window(window)) as shm:
        through_shm = shm.infer("dispatch", batched(window), NAMES)
        assert_same(through_shm, plain)
        with DispatchClient(shm) as over_shm, DispatchClient.grpc(triton.grpc_url) as over_grpc:
            assert over_shm.dispatch(window) == over_grpc.dispatch(window)


def test_many_requests_reuse_the_regions_and_leave_nothing_behind(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    # Eight different tiny windows, so an answer delivered to the wrong caller shows.
    windows = [sim_window(seed=100 + i, orders=1, riders=5) for i in range(8)]
    expected = [infer_raw(grpc_client, w, "dispatch") for w in windows]
    threads = 4
    per_thread = 2500 if os.environ.get("DISPATCH_HOSTILE_FULL") == "1" else 500
    mismatches: list[str] = []
    errors: list[BaseException] = []

    with transport(triton, ShmCapacity(max_orders=1, max_riders=5), pool_size=threads) as shm:
        registered = server_regions(grpc_client, os.getpid())
        assert registered == set(shm.pool.region_names()) and len(registered) == 2 * threads

        def work(worker: int) -> None:
            try:
                for i in range(per_thread):
                    k = (worker + i) % len(windows)
                    got = shm.infer("dispatch", batched(windows[k]), NAMES)
                    for name in ("TOPK_RIDER_INDEX", "TOPK_OBJECTIVES", "ASSIGNED_RIDER_INDEX"):
                        if not np.array_equal(got[name], expected[k][name]):
                            mismatches.append(f"request {worker}/{i}: {name}")
            except BaseException as exc:
                errors.append(exc)

        started = time.monotonic()
        pool = [threading.Thread(target=work, args=(w,)) for w in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        elapsed = time.monotonic() - started
        assert errors == [] and mismatches == []
        # registered once at the start and reused for every request
        assert server_regions(grpc_client, os.getpid()) == registered
    print(f"{threads * per_thread} shm requests in {elapsed:.1f} s ({threads} threads)")
    assert server_regions(grpc_client, os.getpid()) == set()
    assert shm_files(os.getpid()) == set()


# ---- failures ------------------------------------------------------------------------------


def test_an_oversize_request_errors_cleanly_and_the_next_one_works(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    small = sim_window(seed=7, orders=1, riders=5)
    with transport(triton, ShmCapacity(max_orders=1, max_riders=5)) as shm:
        with pytest.raises(ShmRegionTooSmallError) as caught:
            shm.infer("dispatch", batched(sim_window(seed=8, orders=1, riders=200)), NAMES)
        assert caught.value.direction == "input"
        assert f"{caught.value.region_bytes}-byte input" in caught.value.message
        assert_same(
            shm.infer("dispatch", batched(small), NAMES), infer_raw(grpc_client, small, "dispatch")
        )


def test_a_server_rejection_keeps_the_regions_for_the_next_request(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    good = sim_window(seed=9, orders=2, riders=8)
    bad = dict(good)
    bad["ORDER_FIELDS"] = good["ORDER_FIELDS"].copy()
    bad["ORDER_FIELDS"][0, 0] = 91.0  # pickup_lat
    with transport(triton, ShmCapacity(max_orders=2, max_riders=8), pool_size=1) as shm:
        names = set(shm.pool.region_names())
        with pytest.raises(DispatchServerError, match=r"ORDER_FIELDS\[pickup_lat, pickup_lon\]"):
            shm.infer("dispatch", batched(bad), NAMES)
        assert set(shm.pool.region_names()) == names
        assert_same(
            shm.infer("dispatch", batched(good), NAMES), infer_raw(grpc_client, good, "dispatch")
        )


@pytest.mark.parametrize("failure", [RuntimeError("boom"), KeyboardInterrupt()])
def test_an_exception_mid_request_releases_the_region(
    triton: TritonServer,
    grpc_client: grpcclient.InferenceServerClient,
    monkeypatch: pytest.MonkeyPatch,
    failure: BaseException,
) -> None:
    window = sim_window(seed=11, orders=1, riders=5)
    with transport(triton, ShmCapacity(max_orders=1, max_riders=5), pool_size=1) as shm:
        before = server_regions(grpc_client, os.getpid())
        real = shm._client.infer

        def broken(*args: Any, **kwargs: Any) -> Any:  # inputs are already in the region
            raise failure

        monkeypatch.setattr(shm._client, "infer", broken)
        with pytest.raises(type(failure)):
            shm.infer("dispatch", batched(window), NAMES)
        assert server_regions(grpc_client, os.getpid()) == set()
        assert shm_files(os.getpid()) == set()
        monkeypatch.setattr(shm._client, "infer", real)
        assert_same(
            shm.infer("dispatch", batched(window), NAMES),
            infer_raw(grpc_client, window, "dispatch"),
        )
        after = server_regions(grpc_client, os.getpid())
        assert len(after) == 2 and not after & before  # a fresh set replaced the lost one


def test_a_timed_out_request_retires_its_regions(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    window = sim_window(seed=12, orders=1, riders=5)
    with transport(triton, ShmCapacity(max_orders=1, max_riders=5), pool_size=1) as shm:
        before = set(shm.pool.region_names())
        shm.timeout_s = 1e-6  # the server may still write later: the set must not be reused
        with pytest.raises(DispatchConnectionError, match="no answer"):
            shm.infer("dispatch", batched(window), NAMES)
        shm.timeout_s = 60.0
        assert not set(shm.pool.region_names()) & before
        assert not shm_files(os.getpid()) & before  # unmapped and unlinked at once
        expected = infer_raw(grpc_client, window, "dispatch")
        assert_same(shm.infer("dispatch", batched(window), NAMES), expected)
    # the server unregisters the old pair once the abandoned request lets go (by close)
    assert not server_regions(grpc_client, os.getpid()) & before


CHILD = """
import faulthandler, signal, sys, time
# Python keeps an inherited SIG_IGN for SIGINT (a test run started in the background has
# one), and the case under test is Ctrl-C's KeyboardInterrupt: ask for it.
signal.signal(signal.SIGINT, signal.default_int_handler)
faulthandler.register(signal.SIGUSR1)  # the test asks for the stacks of a child that hangs
from dispatch_client import DispatchClient, window_from_json
from dispatch_client.shm import GrpcShmTransport, ShmCapacity

url, mode, path = sys.argv[1:4]
window = window_from_json(open(path, "rb").read())
transport = GrpcShmTransport(url, capacity=ShmCapacity.for_window(window))
client = DispatchClient(transport)
client.dispatch(window)
if mode == "exit":  # never closed: atexit must release the regions
    print("ready", flush=True)
    sys.exit(0)
with client:
    print("ready", flush=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # requests until a signal stops us
        client.dispatch(window)
"""


@pytest.mark.parametrize(
    ("mode", "signum"), [("loop", signal.SIGTERM), ("loop", signal.SIGINT), ("exit", None)]
)
def test_a_child_releases_its_regions_on_signal_or_exit(
    triton: TritonServer,
    grpc_client: grpcclient.InferenceServerClient,
    mode: str,
    signum: signal.Signals | None,
) -> None:
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, triton.grpc_url, mode, str(EXAMPLE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as child:
        try:
            assert child.stdout is not None and child.stderr is not None
            ready, _, _ = select.select([child.stdout], [], [], 60)
            assert ready and child.stdout.readline().strip() == "ready", child.stderr.read()
            if signum is not None:
                assert len(server_regions(grpc_client, child.pid)) == 8  # 4 region sets
                time.sleep(0.3)  # let it get into the middle of requests
                child.send_signal(signum)
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.send_signal(signal.SIGUSR1)
                time.sleep(1)
                child.kill()
                _, err = child.communicate()
                pytest.fail(f"the child did not exit within 30 s of {signum!r}:\n{err[-4000:]}")
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    if signum == signal.SIGTERM:
        assert child.returncode == 128 + signal.SIGTERM
    elif signum is None:
        assert child.returncode == 0
    assert server_regions(grpc_client, child.pid) == set()
    assert shm_files(child.pid) == set()


def test_cli_grpc_shm_answers_like_grpc(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    cli = Path(sys.prefix) / "bin" / "dispatch-client"

    def run(protocol: str) -> tuple[int, str, str, int]:
        with subprocess.Popen(
            [str(cli), "--url", triton.grpc_url, "--protocol", protocol, str(EXAMPLE)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as process:
            out, err = process.communicate(timeout=60)
        return process.returncode, out, err, process.pid

    code_shm, out_shm, err_shm, pid = run("grpc-shm")
    code_grpc, out_grpc, _, _ = run("grpc")
    assert code_shm == code_grpc == 0, err_shm
    assert json.loads(out_shm) == json.loads(out_grpc)
    # The CLI's own regions only: /dev/shm is the host's, shared with every other client.
    assert shm_files(pid) == set()
    assert server_regions(grpc_client, pid) == set()


# ---- the feature-level entry point --------------------------------------------------------


def encoded(window: Arrays) -> Arrays:
    """What a co-located feature service sends: the server's own encoder, run locally."""
    parameters = config_parameters(model_layout(MODEL_REPOSITORY, ENCODER_MODEL).config)
    located = window_from_wire(window)
    city = load_settings(CitySettings, parameters).registry().locate(located)
    pairs = encode_window(located, city, load_settings(EncoderSettings, parameters))
    tensors = {
        "PAIR_FEATURES": pairs.pair_features,
        "CANDIDATE_RIDER_INDEX": pairs.candidate_rider_index,
        **{name: window[name] for name in ("ORDER_TEXT", "RIDER_IDS", "RIDER_FIELDS")},
    }
    for optional in ("OBJECTIVE_WEIGHTS", "MODEL_VERSION_TAG", "ORDER_FIELDS"):
        if optional in window:
            tensors[optional] = window[optional]
    return tensors


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"OBJECTIVE_WEIGHTS": np.array([0.1, 0.1, 0.8], np.float32)},
        {"MODEL_VERSION_TAG": np.array([b"canary"], dtype=object)},
    ],
    ids=["defaults", "weights", "canary-tag"],
)
def test_features_computed_locally_give_exactly_the_answer_of_dispatch(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient, extra: Arrays
) -> None:
    window = {**sim_window(seed=2024, orders=64, riders=200), **extra}
    via_window = infer_raw(grpc_client, window, "dispatch")
    via_features = infer_raw(grpc_client, encoded(window), FEATURE_ENTRY_MODEL_NAME)
    assert_same(via_features, via_window)


def test_features_without_creation_times_are_resolved_stand_alone(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    """Without ORDER_FIELDS the resolver cannot order a rider's new orders: the answer is the
    library's with topk_resolver's stack_aware off (the window stacks: dispatch differs)."""
    window = sim_window(seed=12, orders=48, riders=12)
    features = {n: a for n, a in encoded(window).items() if n != "ORDER_FIELDS"}
    served = infer_raw(grpc_client, features, FEATURE_ENTRY_MODEL_NAME)
    library = DispatchPipeline.from_repository()
    stand_alone = dataclasses.replace(
        library, resolver=dataclasses.replace(library.resolver, stacking=StackingSettings(False))
    )
    local = stand_alone.run(window)
    for name, value in local.items():  # the resolver's outputs (the routing ones are not)
        np.testing.assert_allclose(served[name][0], value, rtol=1e-5, err_msg=name)
    stacked = infer_raw(grpc_client, window, "dispatch")
    assert not np.array_equal(stacked["TOPK_OBJECTIVES"], served["TOPK_OBJECTIVES"])


def test_feature_entry_through_the_client_and_shared_memory(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    window = sim_window(seed=31, orders=16, riders=60)
    features = encoded(window)
    with DispatchClient.grpc(triton.grpc_url) as client:
        expected = client.dispatch(window)
        assert expected.city == "shanghai"  # the simulator's default city, where sim_window draws
        assert client.dispatch_features(window["ORDER_IDS"], features) == without_sources(expected)
    with DispatchClient(transport(triton, ShmCapacity(max_orders=16, max_riders=60))) as client:
        assert client.dispatch_features(window["ORDER_IDS"], features) == without_sources(expected)
        assert client.dispatch(window) == expected


@pytest.mark.parametrize("with_optional", [False, True], ids=["alone", "with-optional"])
def test_feature_entry_names_a_missing_required_input(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient, with_optional: bool
) -> None:
    window = sim_window(seed=43, orders=4, riders=20)
    good = encoded(window)
    optional = {"OBJECTIVE_WEIGHTS": np.array([0.5, 0.3, 0.2], np.float32)}
    required = [s.name for s in FEATURE_ENTRY_INPUTS if not s.optional]
    for missing in required:
        tensors = {n: a for n, a in good.items() if n != missing}
        with pytest.raises(InferenceServerException) as caught:
            infer_raw(grpc_client, tensors | (optional if with_optional else {}),
                      FEATURE_ENTRY_MODEL_NAME)  # fmt: skip
        assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
        message = str(caught.value.message())
        assert missing in message and "missing" in message, message
    assert_same(
        infer_raw(grpc_client, good, FEATURE_ENTRY_MODEL_NAME),
        infer_raw(grpc_client, window, "dispatch"),
    )


def without_sources(result: DispatchResult) -> DispatchResult:
    """`dispatch`'s answer as the feature-level entry point gives it: no encoder, so no
    location sources and no city."""
    orders = tuple(
        dataclasses.replace(order, pickup_source=None, dropoff_source=None)
        for order in result.orders
    )
    return dataclasses.replace(result, orders=orders, city=None)


@pytest.mark.parametrize(
    ("tensor", "spoil"),
    [
        ("PAIR_FEATURES", lambda a: a[:-1]),  # not B x N rows
        ("CANDIDATE_RIDER_INDEX", lambda a: a + 100),  # rows past RIDER_IDS
        ("ORDER_FIELDS", lambda a: a[:-1]),  # not one row per order (the resolver reads it)
    ],
)
def test_feature_entry_rejects_bad_features_and_keeps_serving(
    triton: TritonServer,
    grpc_client: grpcclient.InferenceServerClient,
    tensor: str,
    spoil: Any,
) -> None:
    window = sim_window(seed=41, orders=4, riders=20)
    good = encoded(window)
    with pytest.raises(InferenceServerException) as caught:
        infer_raw(grpc_client, {**good, tensor: spoil(good[tensor])}, FEATURE_ENTRY_MODEL_NAME)
    assert caught.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert f"{tensor}: must" in str(caught.value.message())
    assert_same(
        infer_raw(grpc_client, good, FEATURE_ENTRY_MODEL_NAME),
        infer_raw(grpc_client, window, "dispatch"),
    )


# ---- another local user ---------------------------------------------------------------------


def stub_regions(server: TritonServer) -> dict[int, str]:
    """pid -> the region each Python-backend stub of ``server`` was started with."""
    assert server.process is not None
    regions = {}
    for entry in Path("/proc").glob("[0-9]*"):
        stat = proc_stat(entry)
        if stat is None or stat.parent != server.process.pid:
            continue
        with contextlib.suppress(OSError):
            name = stub_region_name((entry / "cmdline").read_bytes())
            if name is not None:
                regions[int(entry.name)] = name
    return regions


@needs_root
def test_another_user_can_neither_read_nor_take_the_transports_regions(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    window = sim_window(seed=31, orders=2, riders=8)
    with transport(triton, ShmCapacity(max_orders=2, max_riders=8), pool_size=1) as shm:
        paths = [SHM / name for name in sorted(shm.pool.region_names())]
        for path in paths:
            status = path.stat()
            assert (status.st_uid, status.st_mode & 0o777) == (os.geteuid(), 0o600), path
        seen = as_other_user(
            lambda: [[try_open(p, os.O_RDONLY), try_open(p, os.O_RDWR | os.O_CREAT)] for p in paths]
        )
        assert seen == [["EACCES", "EACCES"]] * len(paths)
        assert_same(
            shm.infer("dispatch", batched(window), NAMES),
            infer_raw(grpc_client, window, "dispatch"),
        )


@needs_root
def test_the_backends_regions_can_be_neither_opened_nor_registered(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient
) -> None:
    regions = stub_regions(triton)
    assert len(regions) >= 5, regions  # one stub per Python model instance
    paths = [SHM / name for name in regions.values()]
    assert not any(path.exists() for path in paths)  # sealed: no name left to open
    named = sorted(SHM.glob(f"{triton.shm_prefix}*"))
    assert all(path.stat().st_mode & 0o077 == 0 for path in named), named
    seen = as_other_user(lambda: [try_open(p, os.O_RDONLY) for p in [*paths, *named]])
    assert set(seen) <= {"ENOENT", "EACCES"}, seen
    # Even with the shared-memory key, Triton cannot be told to map the backend's arena.
    headers = grpc_headers(SHM_KEY_HEADER, os.environ[SHM_KEY_ENV])
    for name in list(regions.values())[:2]:
        with pytest.raises(InferenceServerException, match="Unable to open shared memory"):
            grpc_client.register_system_shared_memory("stolen", f"/{name}", 1024, headers=headers)
    assert grpc_client.is_server_ready()
