"""The launcher as an operator runs it (`python -m dispatch_service.ops.server`, what
`make serve` runs): keys created and printed, a second launcher on the same ports refused
without harming the first, readiness that names a missing entry point,
and a launcher that is killed or hung up on takes its Triton with it."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from launcher_helpers import EXAMPLE, Launcher, SharedLauncher

from dispatch_client import DispatchClient, window_from_json
from dispatch_client.errors import DispatchError
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.ops.host import ports_in_use, process_ended
from dispatch_service.ops.server import Ports


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedLauncher]:
    """The module's launcher: the tests that end it run last (each one after the first that
    ends it gets a new one)."""
    shared = SharedLauncher(tmp_path_factory.mktemp("launcher"))
    try:
        yield shared
    finally:
        shared.stop()


@pytest.fixture
def first(shared: SharedLauncher) -> tuple[Launcher, Path, Path]:
    """A running launcher, its log and its keys folder."""
    launcher = shared.get()
    return launcher, launcher.key_dir.parent / "server.log", launcher.key_dir


def test_a_start_without_keys_creates_private_ones_and_says_where(
    first: tuple[Launcher, Path, Path],
) -> None:
    launcher, _, keys = first
    text = "\n".join(launcher.lines)
    for name in ("admin.key", "shm.key"):
        path = keys / name
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert str(path) in text
        assert path.read_text().strip() not in text  # the path is printed, never the key
    assert "dispatch: ok" in text and "dispatch_fused: ok" in text


def test_a_second_launcher_on_the_same_ports_leaves_the_first_serving(
    first: tuple[Launcher, Path, Path], tmp_path: Path
) -> None:
    launcher, log, _ = first
    window = window_from_json(EXAMPLE.read_bytes())
    url = f"127.0.0.1:{launcher.ports.grpc}"
    failures: list[str] = []
    served = 0
    stop = threading.Event()

    def traffic() -> None:
        nonlocal served
        with DispatchClient.grpc(url, timeout_s=30) as client:
            while not stop.is_set():
                try:
                    client.dispatch(window)
                    served += 1
                except DispatchError as exc:
                    failures.append(exc.message)

    log_before = log.read_bytes()
    # The first server's regions only: /dev/shm is shared with every other server on the host.
    # Its stubs' regions are no longer named there (each stub removes its region's name as it
    # starts: docs/security.md); whatever is still named must stay, and its traffic flow.
    ours = f"dispatchsrv_{launcher.process.pid}_*"
    regions_before = {p.name for p in Path("/dev/shm").glob(ours)}
    thread = threading.Thread(target=traffic)
    thread.start()
    try:
        second = Launcher(launcher.ports, log, tmp_path / "keys")
        out, err = second.process.communicate(timeout=120)
        time.sleep(1.0)  # traffic keeps flowing after the second one is gone
    finally:
        stop.set()
        thread.join(timeout=60)
    assert second.process.returncode == 1, out + err
    assert "already in use" in err and str(launcher.ports.http) in err
    assert "ready:" not in out
    assert log.read_bytes()[: len(log_before)] == log_before  # not truncated
    assert regions_before <= {p.name for p in Path("/dev/shm").glob(ours)}
    assert failures == [] and served > 0
    assert launcher.process.poll() is None
    with DispatchClient.grpc(url, timeout_s=30) as client:
        assert client.dispatch(window).orders


def test_a_missing_required_entry_point_is_named_and_the_start_fails(tmp_path: Path) -> None:
    # The `dispatch` ensemble and its steps only: the start need not pay for the other entry
    # points' stubs to fail.
    repository = shutil.copytree(
        MODEL_REPOSITORY,
        tmp_path / "repo",
        ignore=shutil.ignore_patterns("__pycache__", "dispatch_fused", "dispatch_priority"),
    )
    launcher = Launcher(
        Ports.free(),
        tmp_path / "server.log",
        tmp_path / "keys",
        *("--model-repository", str(repository)),
        *("--require", "dispatch,no_such_entry_point"),
    )
    out, err = launcher.process.communicate(timeout=240)
    assert launcher.process.returncode == 1, out + err
    assert "ready:" not in out
    assert "no_such_entry_point" in err and "not in the model repository" in err
    assert "dispatch:" not in err.split("not serving", 1)[1]  # only the missing one is named


@pytest.mark.parametrize(
    ("signum", "exit_code"),
    [
        # kill -9, the OOM killer: no handler runs; Triton (its own process group) used to
        # keep serving with the ports and shared memory held.
        (signal.SIGKILL, -signal.SIGKILL),
        # A closed terminal: by default it ended the launcher at once, with the same result.
        (signal.SIGHUP, 0),
    ],
    ids=["killed", "hung_up"],
)
def test_a_launcher_that_ends_takes_its_triton_with_it(
    shared: SharedLauncher, signum: int, exit_code: int
) -> None:
    launcher = shared.get()
    triton = 0
    try:
        (triton,) = launcher.children("tritonserver")
        launcher.process.send_signal(signum)
        assert launcher.process.wait(timeout=90) == exit_code
        assert process_ended(triton, 90), "tritonserver outlived its launcher"
        ports = launcher.ports
        assert ports_in_use("127.0.0.1", (ports.http, ports.grpc, ports.metrics)) == []
    finally:
        launcher.stop()
        if triton and not process_ended(triton, 0):  # never leave one behind when this fails
            os.killpg(triton, signal.SIGKILL)  # its own group: its stubs too
