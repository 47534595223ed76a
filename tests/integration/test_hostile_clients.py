"""The launcher against hostile clients, on real servers, loopback only.

Each test runs small in `make test`; `make test-hostile` sets ``DISPATCH_HOSTILE_FULL=1`` and
runs the full counts (docs/operations.md):

- wrapped-shape requests (a declared shape whose byte size wraps onto the bytes sent: 2.51's
  stub aborts before the model runs) over gRPC and HTTP binary to both entry points: every
  model back at the instance count it started with, no zombie, Triton's RSS within 1.2x of
  its start (20; full 1,000);
- `/readyz` sampled every 20 ms through stub kills: never 200 while an entry point fails a
  valid window (2 kills; full 5);
- a second uid polling /dev/shm through reloads opens no backend region: they are made
  0600 from the first byte (the launcher preloads native/private_shm.c) (3; full 50);
- SIGTERM to the launcher's process group right after answered windows: it drains and exits
  within the drain timeout (3; full 50); `kill -9` of the launcher, then a start on the same
  ports at once: it starts.

The first three share one launcher, settled between them as a fresh one starts (a start is
about 10 CPU-seconds of stubs); the stops start their own. Figures are printed (pytest -s);
asserts are outcomes: waits poll against `patience` bounds.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from launcher_helpers import EXAMPLE, Launcher, free_port, status
from patience import patience, wait_for
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from dispatch_client import DispatchClient, window_from_json
from dispatch_client.errors import DispatchError
from dispatch_contract import batched
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.ops.host import SHM_PREFIX_ROOT, process_ended
from dispatch_service.ops.model_control import load_model, model_config, with_reload_mark
from dispatch_service.ops.server import Ports
from dispatch_service.ops.stubs import stub_versions, zombie_stubs
from other_user import as_other_user, needs_root

FULL = os.environ.get("DISPATCH_HOSTILE_FULL") == "1"
ENTRY_POINTS = ("dispatch", "dispatch_fused")
WRAP_ROWS = 1 + (1 << 61)  # ORDER_FIELDS: 56 bytes a row, 56 * WRAP_ROWS == 56 (mod 2^64)


def _count(small: int, full: int) -> int:
    return full if FULL else small


class Served:
    """A launcher on free loopback ports, its health URL and admin key."""

    def __init__(self, folder: Path, *extra: str) -> None:
        self.health_port = free_port()
        self.launcher = Launcher(
            Ports.free(),
            folder / "server.log",
            folder / "keys",
            "--health-port",
            str(self.health_port),
            *extra,
        )
        self.health = f"http://127.0.0.1:{self.health_port}"
        self.grpc = f"127.0.0.1:{self.launcher.ports.grpc}"
        self.http = f"127.0.0.1:{self.launcher.ports.http}"
        if not self.launcher.read_until("ready:", patience(240)):
            process = self.launcher.process
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)  # its output ended: it is exiting
            error = process.stderr.read() if process.poll() is not None and process.stderr else ""
            self.launcher.stop()
            raise AssertionError("\n".join([*self.launcher.lines, error]))
        self.admin_key = (folder / "keys" / "admin.key").read_text().strip()

    def triton_pid(self) -> int | None:
        found = self.launcher.children("tritonserver")
        return found[0] if found else None

    def ready(self) -> bool:
        return status(f"{self.health}/readyz") == 200

    def healthz(self) -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"{self.health}/healthz", timeout=10) as response:
                return dict(json.load(response))
        except urllib.error.HTTPError as exc:
            return dict(json.load(exc))

    def stubs(self) -> Counter[tuple[str, str]]:
        pid = self.triton_pid()
        return Counter() if pid is None else Counter(stub_versions(pid).values())

    def zombies(self) -> int:
        pid = self.triton_pid()
        return 0 if pid is None else len(zombie_stubs(pid))

    def serves(self, model: str) -> bool:
        window = window_from_json(EXAMPLE.read_bytes())
        try:
            with DispatchClient.grpc(self.grpc, model_name=model, timeout_s=10) as client:
                return bool(client.dispatch(window).orders)
        except DispatchError:
            return False


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def wrapped_inputs(protocol: str) -> list[Any]:
    """A valid one-order window whose ORDER_FIELDS declares 2^61 + 1 rows for 56 bytes."""
    window = generate_window(np.random.default_rng(5), 1, 4)
    tensors = batched(window_to_wire(window))
    module: Any = grpcclient if protocol == "grpc" else httpclient
    inputs = []
    for name, array in tensors.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        if protocol == "grpc":
            tensor.set_data_from_numpy(array)
        else:
            tensor.set_data_from_numpy(array, binary_data=True)
        if name == "ORDER_FIELDS":
            shape = [1, WRAP_ROWS, 7]
            if protocol == "grpc":
                del tensor._input.shape[:]
                tensor._input.shape.extend(shape)
            else:
                tensor._shape = shape
        inputs.append(tensor)
    return inputs


def send_wrapped(served: Served, protocol: str, model: str, request_id: str = "") -> str:
    client: Any = None
    try:
        if protocol == "grpc":
            client = grpcclient.InferenceServerClient(served.grpc)
            client.infer(model, wrapped_inputs("grpc"), client_timeout=20, request_id=request_id)
        else:
            client = httpclient.InferenceServerClient(served.http, network_timeout=20)
            client.infer(model, wrapped_inputs("http"), request_id=request_id)
    except InferenceServerException as exc:
        return str(exc.status())
    except Exception as exc:  # the connection reset or refused: the server restarting
        return type(exc).__name__
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
    return "served"


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    # Dead stubs held for 5 s (none dying for 10 s) are released by a restart: the tests
    # wait for that, not for the default 120 s.
    server = Served(tmp_path_factory.mktemp("hostile"), "--stub-leak-max-age", "5")
    server.launcher.keep_reading()
    try:
        yield server
    finally:
        server.launcher.stop()


@pytest.fixture
def served(launched: Served) -> Served:
    """The module's launcher as a fresh one starts: ready, both entry points serving, no
    dead or stale stub held (what an earlier test killed or reloaded is healed, and the
    launcher's restart for leaks has released the old stubs)."""

    def settled() -> bool:
        return (
            launched.ready()
            and launched.zombies() == 0
            and launched.healthz().get("leaked_stubs") == 0
            and launched.serves("dispatch_fused")
            and launched.serves("dispatch")
        )

    assert launched.launcher.process.poll() is None, "\n".join(launched.launcher.lines[-20:])
    wait_for(settled, "the launcher settled after the test before", 300, 1.0)
    return launched


def test_wrapped_shapes_leave_every_model_at_its_instance_count_no_zombie_bounded_rss(
    served: Served,
) -> None:
    """4 such requests took dispatch_fused from 4 stubs and 587 MiB to 16 stubs and
    2,327 MiB, with 5 zombies."""
    assert served.serves("dispatch_fused")
    start_stubs = served.stubs()
    pid = served.triton_pid()
    assert pid is not None
    start_rss = rss_kib(pid)
    restarts_before = sum(served.healthz()["stub_restarts"].values())
    outcomes: Counter[str] = Counter()
    sends = _count(20, 1000)
    for n in range(sends):
        protocol = ("grpc", "http")[n % 2]
        model = ENTRY_POINTS[(n // 2) % 2]
        outcome = send_wrapped(served, protocol, model)
        outcomes[outcome] += 1
        if outcome != "StatusCode.INTERNAL" and "500" not in outcome:
            time.sleep(0.2)  # down (restarting) or refused: no need to hammer
    assert served.launcher.process.poll() is None

    def settled() -> bool:
        return (
            served.ready()
            and served.zombies() == 0
            and served.stubs() == start_stubs
            and served.serves("dispatch_fused")
            and served.serves("dispatch")
        )

    wait_for(settled, "every model at its instance count, no zombie, serving", 300, 1.0)
    pid = served.triton_pid()
    assert pid is not None
    end_rss = rss_kib(pid)
    detail = served.healthz()
    print(
        f"\n{sends} wrapped-shape requests: {dict(outcomes)}; Triton RSS {start_rss} KiB at "
        f"start, {end_rss} KiB after; stub restarts {detail['stub_restarts']}, server "
        f"restarts {detail['server_restarts']} (for leaks {detail['leak_restarts']})"
    )
    assert sum(detail["stub_restarts"].values()) > restarts_before  # they did kill stubs
    assert end_rss <= 1.2 * start_rss


def test_a_client_that_keeps_killing_stubs_is_counted_and_its_request_ids_logged(
    served: Served,
) -> None:
    """A wrapped shape kills a 2.51 stub before the model runs, so no model can log it; the
    stub death makes the launcher log every request Triton prepares for a while, and the
    next wrapped-shape request is reported by its request id and counted."""
    restarts_before = sum(served.healthz()["stub_restarts"].values())
    send_wrapped(served, "grpc", "dispatch_fused", "first-kill")
    wait_for(
        lambda: sum(served.healthz()["stub_restarts"].values()) > restarts_before,
        "the stub death seen and healed",
        120,
        0.5,
    )
    sent: list[str] = []

    def reported() -> set[str]:
        lines = list(served.launcher.lines)
        events = [json.loads(line) for line in lines if '"impossible_shape_request"' in line]
        return {str(event["request_id"]) for event in events}

    def a_killer_logged() -> bool:
        """Killers over both protocols until one is reported (at most 8): a restart for the
        leaked stubs may refuse one, or start the next server before a death arms it."""
        if reported() & set(sent):
            return True
        if len(sent) < 8:
            sent.append(f"killer-{len(sent)}")
            send_wrapped(served, ("http", "grpc")[len(sent) % 2], "dispatch_fused", sent[-1])
        return False

    wait_for(a_killer_logged, "a killer's request id logged", 120, 0.5)
    logged = min(reported() & set(sent))
    event = next(
        json.loads(line)
        for line in list(served.launcher.lines)
        if '"impossible_shape_request"' in line and f'"{logged}"' in line
    )
    assert event["model"] == "dispatch_fused" and event["tensor"] == "ORDER_FIELDS"
    assert event["shape"] == [1, WRAP_ROWS, 7]
    with urllib.request.urlopen(f"{served.health}/metrics", timeout=10) as response:
        text = response.read().decode()
    counted = re.search(
        r'^dispatch_launcher_impossible_shape_requests_total\{model="dispatch_fused"\} (\S+)$',
        text,
        re.MULTILINE,
    )
    assert counted is not None and float(counted.group(1)) >= 1


def test_readyz_is_never_200_while_an_entry_point_fails_a_valid_window(served: Served) -> None:
    """/readyz answered 200 for 0.07-0.33 s spans with a stub missing. Sampled every 20 ms
    through stub kills; a window is sent after each 200, and a failure counts only when the
    readiness request began after the last kill."""
    window = window_from_json(EXAMPLE.read_bytes())
    last_kill = [0.0]
    violations: list[str] = []
    samples = Counter[str]()
    stop = threading.Event()

    def sample() -> None:
        clients = {
            m: DispatchClient.grpc(served.grpc, model_name=m, timeout_s=10) for m in ENTRY_POINTS
        }
        turn = 0
        try:
            while not stop.is_set():
                began = time.monotonic()
                code = status(f"{served.health}/readyz")
                samples[str(code)] += 1
                if code == 200:
                    model = ENTRY_POINTS[turn % len(ENTRY_POINTS)]
                    turn += 1
                    try:
                        clients[model].dispatch(window)
                    except DispatchError as exc:
                        if began > last_kill[0]:
                            violations.append(f"{model}: {exc}")
                stop.wait(0.02)
        finally:
            for client in clients.values():
                client.close()

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        for kill in range(_count(2, 5)):
            wait_for(served.ready, "ready before the next kill", 120, 0.2)
            time.sleep(1.0)
            pid = served.triton_pid()
            assert pid is not None
            victims = sorted(
                p for p, (model, _) in stub_versions(pid).items() if model == "dispatch_fused"
            )
            last_kill[0] = time.monotonic()
            os.kill(victims[kill % len(victims)], signal.SIGKILL)
            time.sleep(1.0)
        wait_for(served.ready, "ready after the last kill", 120, 0.2)
    finally:
        stop.set()
        sampler.join(timeout=60)
    print(f"\nreadiness samples: {dict(samples)}; failures while ready: {violations}")
    assert samples["200"] > 0 and samples["503"] > 0
    assert violations == []


@needs_root
def test_a_second_user_polling_dev_shm_through_reloads_opens_no_backend_region(
    served: Served,
) -> None:
    """A second local user polling /dev/shm through reloads opens none of the backend's
    regions: Triton 2.51's Python backend sets each region it makes to 0644 (boost's fchmod
    after shm_open), and the shim the launcher preloads keeps it 0600 (native/private_shm.c)."""
    # Where the other user can see it (pytest's temporary folders are private).
    stop_file = Path("/dev/shm") / f"hostile-test-stop-{os.getpid()}"
    stop_file.unlink(missing_ok=True)
    # This server's regions only: other servers on the host are no part of the test.
    prefix = f"{SHM_PREFIX_ROOT}{served.launcher.process.pid}_"

    def poll() -> dict[str, int]:
        seen: set[str] = set()
        opened = 0
        deadline = time.monotonic() + 600
        while not stop_file.exists() and time.monotonic() < deadline:
            for entry in os.scandir("/dev/shm"):
                if not entry.name.startswith(prefix):
                    continue
                seen.add(entry.name)
                try:
                    fd = os.open(entry.path, os.O_RDONLY)
                except OSError:
                    continue
                os.close(fd)
                opened += 1
        return {"seen": len(seen), "opened": opened}

    result: dict[str, Any] = {}
    poller = threading.Thread(target=lambda: result.update(as_other_user(poll)), daemon=True)
    poller.start()
    reloads = _count(3, 50)
    try:
        for _ in range(reloads):
            config = model_config(served.http, "dispatch_fused")
            load_model(
                served.health,
                "dispatch_fused",
                with_reload_mark(config),
                admin_key=served.admin_key,
            )
    finally:
        stop_file.touch()
        poller.join(timeout=120)
        stop_file.unlink(missing_ok=True)
    print(f"\n{reloads} reloads: the second user saw {result}")
    assert result["seen"] > 0  # it did look at the regions being made
    assert result["opened"] == 0


def _own_session_launcher(folder: Path, ports: Ports, health_port: int) -> subprocess.Popen[str]:
    """`make serve`'s launcher, started in a session of its own, as a service manager would."""
    argv = [
        sys.executable,
        "-m",
        "dispatch_service.ops.server",
        *("--http-port", str(ports.http), "--grpc-port", str(ports.grpc)),
        *("--metrics-port", str(ports.metrics), "--health-port", str(health_port)),
        *("--log", str(folder / "server.log"), "--key-dir", str(folder / "keys")),
        *("--drain-timeout", "30"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    with (folder / "launcher.out").open("w") as out:  # the child keeps its own copy
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
        )


def ready_or_exited(health_port: int, launcher: subprocess.Popen[str]) -> bool:
    return status(f"http://127.0.0.1:{health_port}/readyz") == 200 or launcher.poll() is not None


def test_sigterm_to_the_process_group_after_answered_windows_always_stops(tmp_path: Path) -> None:
    """3 of 9 such stops printed no drain_started within 60 s. Each one must drain and exit
    within the drain timeout (30 s) plus Triton's stop."""
    ports, health_port = Ports.free(), free_port()
    window = window_from_json(EXAMPLE.read_bytes())
    stops = _count(3, 50)
    seconds = []
    for attempt in range(stops):
        folder = tmp_path / str(attempt)
        folder.mkdir()
        launcher = _own_session_launcher(folder, ports, health_port)
        try:
            wait_for(
                partial(ready_or_exited, health_port, launcher), "the launcher ready", 240, 0.2
            )
            assert launcher.poll() is None, (folder / "launcher.out").read_text()
            with DispatchClient.grpc(f"127.0.0.1:{ports.grpc}", timeout_s=10) as client:
                for model in ("dispatch", "dispatch_fused"):
                    client.model_name = model
                    assert client.dispatch(window).orders
            stopped_at = time.monotonic()
            os.killpg(launcher.pid, signal.SIGTERM)
            code = launcher.wait(timeout=60)
            seconds.append(time.monotonic() - stopped_at)
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()
        out = (folder / "launcher.out").read_text()
        assert code == 0 and '"drain_started"' in out and "tritonserver stopped" in out, out
    print(f"\n{stops} stops: {min(seconds):.1f}-{max(seconds):.1f} s from SIGTERM to exit")


def test_after_kill_9_of_the_launcher_a_start_on_its_ports_succeeds_at_once(tmp_path: Path) -> None:
    """Its Triton, told to stop when the launcher died, held the ports for about 8 s: a
    start at once was refused "port(s) already in use"."""
    ports, health_port = Ports.free(), free_port()
    first = _own_session_launcher(tmp_path, ports, health_port)
    second_folder = tmp_path / "second"
    second_folder.mkdir()
    try:
        wait_for(
            lambda: status(f"http://127.0.0.1:{health_port}/readyz") == 200,
            "the first launcher ready",
            240,
            0.2,
        )
        first.kill()
        first.wait(timeout=30)
        second = _own_session_launcher(second_folder, ports, health_port)
        try:
            wait_for(
                partial(ready_or_exited, health_port, second), "the second one ready", 240, 0.2
            )
            out = (second_folder / "launcher.out").read_text()
            assert second.poll() is None, out
            print(f"\n{[line for line in out.splitlines() if 'orphaned' in line]}")
        finally:
            os.killpg(second.pid, signal.SIGTERM)
            second.wait(timeout=90)
    finally:
        if first.poll() is None:
            first.kill()
        first.wait(timeout=30)
        for pid_dir in Path("/proc").glob("[0-9]*"):  # nothing of the first left behind
            try:
                argv = (pid_dir / "cmdline").read_bytes()
            except OSError:
                continue
            if f"--grpc-port={ports.grpc}".encode() in argv:
                assert process_ended(int(pid_dir.name), timeout_s=30)
