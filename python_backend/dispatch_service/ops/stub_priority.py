"""The bulk models' stubs scheduled behind the priority lane's: SCHED_BATCH.

Every stub but the lane's (`LANE_MODELS`) already lowers its own niceness once loaded
(``stub_nice``, 10, against the lane's 0: `serving.stub_setup`), which shares a saturated
core about 9 to 1 in the lane's favour. Niceness leaves the kernel's wake-up preemption as it
is: a bulk stub woken by a window may still preempt the lane's stub or Triton's own threads
mid-window. Under SCHED_BATCH the kernel treats a thread as CPU-bound and never lets its
wake-up preempt a running thread (sched(7)); its share of a busy core (its niceness) and its
speed on an idle one stay as they were.

The launcher's stub watch (`stub_healing.StubHealing`, every 0.25 s) hands every stub it
sees to `BulkStubScheduling.apply`: a server's first start, a restart's stubs and the
instances it adds later, a healed model's new stubs, any reload. No privilege is needed: any
process may put its own user's threads in SCHED_BATCH (no capability; `sched_setscheduler`
is allowed by the runtimes' default seccomp profiles), so it works as a non-root container
user. Negative niceness, which would put the lane above Triton, would need CAP_SYS_NICE: not
asked for.

A thread a stub starts inherits its creator's policy; the threads of a stub are looked at
again at every look, so one started between two looks is set at the next.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from dispatch_service.core.repository_layout import PRIORITY_MODEL

__all__ = ["BULK_POLICY", "LANE_MODELS", "BulkStubScheduling", "thread_ids", "thread_policies"]

# The models whose stubs keep the server's scheduling: the priority lane.
LANE_MODELS: Final = frozenset({PRIORITY_MODEL})
BULK_POLICY: Final = os.SCHED_BATCH


def thread_ids(pid: int, proc: Path = Path("/proc")) -> set[int]:
    """The ids of ``pid``'s threads (none when it has ended)."""
    try:
        return {int(name) for name in os.listdir(proc / str(pid) / "task") if name.isdigit()}
    except OSError:
        return set()


def thread_policies(pid: int, proc: Path = Path("/proc")) -> dict[int, int]:
    """thread id -> scheduling policy (``os.SCHED_*``) of each of ``pid``'s threads."""
    policies = {}
    for tid in sorted(thread_ids(pid, proc)):
        try:
            policies[tid] = os.sched_getscheduler(tid)
        except OSError:
            continue  # ended meanwhile
    return policies


class BulkStubScheduling:
    """Puts the threads of every stub not of `LANE_MODELS` in `BULK_POLICY` (see the module
    docstring), each thread once."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self.proc = proc
        self._done: dict[int, set[int]] = {}  # stub pid -> its threads already set

    def apply(self, stubs: Mapping[int, str]) -> list[int]:
        """``stubs``: pid -> model of every stub of the server now. Returns the pids of the
        stubs a thread of which was set by this call."""
        self._done = {pid: tids for pid, tids in self._done.items() if pid in stubs}
        changed = []
        for pid, model in sorted(stubs.items()):
            if model in LANE_MODELS:
                continue
            done = self._done.setdefault(pid, set())
            new = thread_ids(pid, self.proc) - done
            for tid in sorted(new):
                try:
                    os.sched_setscheduler(tid, BULK_POLICY, os.sched_param(0))
                except OSError:
                    continue  # ended meanwhile (or a stub of another user: left alone)
                done.add(tid)
            if new & done:
                changed.append(pid)
        return changed
