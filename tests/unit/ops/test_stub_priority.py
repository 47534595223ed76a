"""The bulk models' stubs put in SCHED_BATCH, the lane's left alone
(dispatch_service.ops.stub_priority), on real processes: each thread's policy is read back
from /proc/<pid>/task/<tid>/stat (field 41), not through the module."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dispatch_service.ops.stub_priority import LANE_MODELS, BulkStubScheduling, thread_policies

# A process with two waiting threads; on each line "spawn" its main thread starts one more
# and prints "started"; it ends when its input closes.
CHILD = textwrap.dedent(
    """
    import sys, threading
    stop = threading.Event()
    for _ in range(2):
        threading.Thread(target=stop.wait, daemon=True).start()
    print("ready", flush=True)
    for line in sys.stdin:
        threading.Thread(target=stop.wait, daemon=True).start()
        print("started", flush=True)
    """
)


@contextmanager
def child() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    try:
        yield process
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.wait(timeout=30)
        process.stdout.close()


def spawn_thread(process: subprocess.Popen[str]) -> None:
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("spawn\n")
    process.stdin.flush()
    assert process.stdout.readline() == "started\n"


def policies(pid: int) -> list[int]:
    """Each thread's policy as the kernel reports it in /proc (0 other, 3 batch)."""
    found = []
    for task in sorted(Path(f"/proc/{pid}/task").iterdir()):
        stat = (task / "stat").read_text()
        found.append(int(stat[stat.rfind(")") + 2 :].split()[38]))
    return found


def test_every_bulk_thread_is_batch_the_lanes_untouched_and_later_threads_too() -> None:
    (lane_model,) = LANE_MODELS
    scheduling = BulkStubScheduling()
    with child() as lane, child() as bulk:
        stubs = {lane.pid: lane_model, bulk.pid: "dispatch_fused"}
        assert policies(bulk.pid) == [os.SCHED_OTHER] * 3  # main + 2 threads
        assert scheduling.apply(stubs) == [bulk.pid]
        assert policies(bulk.pid) == [os.SCHED_BATCH] * 3
        assert policies(lane.pid) == [os.SCHED_OTHER] * 3
        assert set(thread_policies(bulk.pid).values()) == {os.SCHED_BATCH}
        assert scheduling.apply(stubs) == []  # nothing new: each thread is set once

        spawn_thread(bulk)  # started by a batch thread: batch from its first instant
        spawn_thread(lane)
        assert policies(bulk.pid) == [os.SCHED_BATCH] * 4
        assert policies(lane.pid) == [os.SCHED_OTHER] * 4
        assert scheduling.apply(stubs) == [bulk.pid]  # the new thread was looked at
        assert policies(lane.pid) == [os.SCHED_OTHER] * 4


def test_a_thread_of_a_stub_left_in_the_default_policy_is_set_at_the_next_look() -> None:
    """A thread started between two looks by a thread not yet set (a stub's thread made
    while the launcher read its task list) is found at the next look."""
    scheduling = BulkStubScheduling()
    with child() as bulk:
        stubs = {bulk.pid: "feature_encoder"}
        scheduling.apply(stubs)
        os.sched_setscheduler(bulk.pid, os.SCHED_OTHER, os.sched_param(0))  # main thread only
        spawn_thread(bulk)  # made by the main thread: SCHED_OTHER, not yet seen
        assert sorted(policies(bulk.pid)) == [os.SCHED_OTHER] * 2 + [os.SCHED_BATCH] * 2
        assert scheduling.apply(stubs) == [bulk.pid]
        # The new thread is set; the main thread was set once already and is not looked at
        # again (the launcher never undoes it; only this test did).
        assert sorted(policies(bulk.pid)) == [os.SCHED_OTHER] + [os.SCHED_BATCH] * 3


def test_ended_stubs_are_forgotten_and_an_ended_pid_is_no_error() -> None:
    scheduling = BulkStubScheduling()
    with child() as bulk:
        pid = bulk.pid
        assert scheduling.apply({pid: "dispatch_fused"}) == [pid]
    assert scheduling.apply({pid: "dispatch_fused"}) == []  # gone: nothing to set, no error
    assert thread_policies(pid) == {}
