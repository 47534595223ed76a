"""Port checks, per-instance shm prefixes, crash leftovers and children that die with their
parent (dispatch_service.ops.host)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dispatch_service.core.repository_layout import model_layout
from dispatch_service.ops.host import (
    Leftovers,
    ProcStat,
    clean_leftovers,
    die_with_parent,
    exposed_listeners,
    find_leftovers,
    is_loopback,
    new_shm_prefix,
    orphaned_servers,
    ports_in_use,
    prefix_owner,
    proc_stat,
    process_ended,
    stop_orphaned_servers,
)


def test_a_listening_port_is_in_use_and_a_closed_one_is_not() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            free = probe.getsockname()[1]
        assert ports_in_use("127.0.0.1", [busy, free]) == [busy]
    assert ports_in_use("127.0.0.1", [busy]) == []


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("10.0.0.5", False),
        ("::", False),
        ("example.org", False),
    ],
)
def test_loopback_addresses(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


LOOPBACK = ["--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=::1"]


@pytest.mark.parametrize(
    "extra",
    [
        ["--metrics-address=0.0.0.0"],
        ["--metrics-address", "0.0.0.0"],
        ["--grpc-address=10.0.0.5"],
        ["--http-address", "example.org"],
        ["--http-address 0.0.0.0"],  # flag and value as one argument
        ["--metrics-addr=0.0.0.0"],  # getopt_long takes unambiguous abbreviations
        ["--grpc-a", "::"],
        ["--allow-sagemaker=true"],
        ["--allow-sagemaker", "1"],
        ["--allow-vert=on"],
        ["--allow-vertex-ai=TRUE"],
    ],
)
def test_every_listener_beyond_loopback_is_named(extra: list[str]) -> None:
    exposed = exposed_listeners([*LOOPBACK, *extra])
    assert len(exposed) == 1
    assert exposed[0].startswith(" ".join(extra))


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--metrics-address=127.0.0.1"],
        ["--http-address", "localhost"],
        ["--allow-sagemaker=false", "--allow-vertex-ai", "0"],
        ["--http-port=8000", "--metrics-port", "0.0.0.0"],  # ports, not addresses
        ["--allow-metrics=true", "--allow-gpu-metrics=true", "--log-format=ISO8601"],
    ],
)
def test_loopback_listeners_and_other_flags_pass(extra: list[str]) -> None:
    assert exposed_listeners([*LOOPBACK, *extra]) == []


def test_the_argument_after_a_bare_address_flag_is_its_value() -> None:
    # As getopt_long reads it: the next argument is the value, whatever it looks like.
    assert exposed_listeners(["--http-address", "--grpc-address=127.0.0.1"]) == [
        "--http-address --grpc-address=127.0.0.1"
    ]


def test_vertex_ai_turned_on_by_the_environment_counts_unless_turned_off() -> None:
    env = {"AIP_MODE": "PREDICTION"}
    (exposed,) = exposed_listeners(LOOPBACK, env)
    assert "AIP_MODE=PREDICTION" in exposed
    assert exposed_listeners([*LOOPBACK, "--allow-vertex-ai=false"], env) == []
    assert exposed_listeners(LOOPBACK, {"AIP_MODE": "other"}) == []


def test_prefixes_differ_per_instance_and_name_their_owner() -> None:
    one, two = new_shm_prefix(), new_shm_prefix()
    assert one != two
    assert prefix_owner(f"{one}abc") == os.getpid() == prefix_owner(two)
    assert prefix_owner("dispatch_client_1_0_in") is None
    assert prefix_owner("dispatch8000_x") is None


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_regions_and_stubs_of_dead_launchers_are_leftovers(tmp_path: Path) -> None:
    shm, proc = tmp_path / "shm", tmp_path / "proc"
    shm.mkdir()
    gone = dead_pid()
    stale, live = new_shm_prefix(gone), new_shm_prefix()
    for name in (f"{stale}r1", f"{live}r2", "dispatch_client_1_0_in", f"{stale}r3"):
        (shm / name).write_bytes(b"x")

    def fake_process(pid: int, argv: list[str]) -> None:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv))

    stub = "/x/backends/python/triton_python_backend_stub"
    model_py = str(model_layout(Path("/repo"), "m").python_model(1))
    fake_process(101, [stub, model_py, f"{stale}stub_1", "1048576"])
    fake_process(102, [stub, model_py, f"{live}stub_2", "1048576"])
    fake_process(103, ["/usr/bin/python3", f"{stale}not_a_stub"])
    found = find_leftovers(shm, proc)
    assert found == Leftovers(regions=(shm / f"{stale}r1", shm / f"{stale}r3"), stubs=(101,))


def test_cleaning_removes_regions_and_tolerates_vanished_ones(tmp_path: Path) -> None:
    region = tmp_path / "dispatchsrv_1_ab_r"
    region.write_bytes(b"x")
    # A pid above pid_max: no process can have it (a recycled pid could be anyone's).
    impossible = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    lines = clean_leftovers(Leftovers(regions=(region, tmp_path / "gone"), stubs=(impossible,)))
    assert not region.exists()
    assert lines == [f"removed stale shared-memory region {region}"]


def test_the_prefix_names_the_signal_for_setpriv() -> None:
    prefix = die_with_parent(signal.SIGKILL)
    if not prefix:
        pytest.skip("PR_SET_PDEATHSIG is Linux only, set by util-linux's setpriv")
    assert prefix[0].endswith("setpriv") and prefix[1:] == ["--pdeathsig=KILL", "--"]


@pytest.mark.parametrize("armed", [True, False], ids=["armed", "unarmed"])
def test_only_a_child_armed_to_die_with_its_parent_ends_when_the_parent_is_killed(
    armed: bool,
) -> None:
    # The parent starts a long sleep in its own session (as the launcher starts Triton),
    # behind die_with_parent's prefix or not, prints its pid, then waits. SIGKILL gives it no
    # chance to clean up, so only the kernel can end the sleep; unarmed, the sleep is left
    # running (what a SIGKILLed launcher did to its Triton).
    if armed and not die_with_parent():
        pytest.skip("PR_SET_PDEATHSIG is Linux only, set by util-linux's setpriv")
    arm = "die_with_parent() + " if armed else ""
    parent_code = (
        "import subprocess, time\n"
        "from dispatch_service.ops.host import die_with_parent\n"
        f"child = subprocess.Popen({arm}['sleep', '60'], start_new_session=True)\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert not process_ended(child)
        parent.kill()
        parent.wait(timeout=10)
        assert process_ended(child, 10.0 if armed else 1.0) is armed
    finally:
        if child and not process_ended(child):
            os.kill(child, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
        if parent.stdout is not None:
            parent.stdout.close()


def test_a_zombie_or_a_missing_process_has_ended(tmp_path: Path) -> None:
    for pid, state in ((10, "S"), (11, "Z"), (12, "R")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (some (odd) name) {state} 1 2 3\n")
    assert [process_ended(pid, proc=tmp_path) for pid in (10, 11, 12, 13)] == [
        False,
        True,
        False,
        True,
    ]


def test_proc_stat_reads_name_state_and_parent(tmp_path: Path) -> None:
    (tmp_path / "10").mkdir()
    (tmp_path / "10" / "stat").write_text("10 (a) b (c) S 77 10 10 0\n")  # comm "a) b (c"
    assert proc_stat(tmp_path / "10") == ProcStat("a) b (c", "S", 77)
    assert proc_stat(tmp_path / "11") is None  # gone
    mine = proc_stat(Path(f"/proc/{os.getpid()}"))
    assert mine is not None and mine.parent == os.getppid() and mine.state in "RS"


def _fake_triton(folder: Path, launcher_pid: int, grpc_port: int) -> subprocess.Popen[bytes]:
    """A process whose command line is a tritonserver's of this repository (the
    shared-memory prefix names its launcher), in a session of its own."""
    binary = folder / "bin" / "tritonserver"
    binary.parent.mkdir(exist_ok=True)
    if not binary.exists():
        binary.symlink_to(sys.executable)
    prefix = new_shm_prefix(launcher_pid)
    return subprocess.Popen(
        [
            str(binary),
            "-c",
            "import time; time.sleep(60)",
            f"--backend-config=python,shm-region-prefix-name={prefix}",
            "--http-port=1",
            f"--grpc-port={grpc_port}",
        ],
        start_new_session=True,
    )


def test_a_server_whose_launcher_died_is_found_by_its_ports_and_stopped(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=30)
    orphan = _fake_triton(tmp_path, gone.pid, 45123)
    owned = _fake_triton(tmp_path, os.getpid(), 45123)  # its launcher (this test) lives
    try:
        for _ in range(100):  # bounded: until its command line is readable
            if orphaned_servers([45123]):
                break
            threading.Event().wait(0.05)
        assert orphaned_servers([45123]) == [orphan.pid]
        assert orphaned_servers([45124]) == []  # other ports: another server's business
        lines = stop_orphaned_servers([45124, 45123])
        assert lines == [f"orphaned tritonserver pid {orphan.pid} (its launcher is gone) stopped"]
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        assert owned.poll() is None
    finally:
        for process in (orphan, owned):
            process.kill()
            process.wait(timeout=30)
