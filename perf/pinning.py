"""Which cores the server and the load generator get, and pinning a process tree to cores.

The open-loop overload bench (`perf.overload_bench`) measures the server, not the client: the
server and everything it started (tritonserver and its Python backend stubs) run on one set
of cores, the load generator and the probes on another, so neither takes CPU from the other.

- two cores: the server on core 1, the load on core 0;
- four or more: the server on the upper half, the load on the lower half (cores 0..n/2-1);
- one core (or three, where the halves cannot be equal and the spare goes to the server):
  the split leaves the load at least one core; with one core nothing is pinned.

`pin_tree(pid, cores)` runs `taskset -a -p -c CORES PID` for the process and every descendant
(all threads of each), so threads and processes started later inherit the same cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CoreSplit",
    "cpu_list",
    "descendants",
    "pin_tree",
    "split_cores",
]


@dataclass(frozen=True)
class CoreSplit:
    server: tuple[int, ...]
    load: tuple[int, ...]

    @property
    def pinned(self) -> bool:
        return bool(self.server) and bool(self.load) and not set(self.server) & set(self.load)

    def describe(self) -> str:
        if not self.pinned:
            return "not pinned (one core: the server and the load share it)"
        return f"server on cores {cpu_list(self.server)}, load on cores {cpu_list(self.load)}"


def cpu_list(cores: Iterable[int]) -> str:
    """taskset's -c form of a set of cores: "0", "2,3"."""
    return ",".join(str(core) for core in sorted(cores))


def split_cores(available: Sequence[int] | None = None) -> CoreSplit:
    """The documented split of `available` (default: this process's allowed cores)."""
    cores = sorted(available if available is not None else os.sched_getaffinity(0))
    if len(cores) < 2:
        return CoreSplit(tuple(cores), tuple(cores))
    half = len(cores) // 2
    return CoreSplit(server=tuple(cores[half:]), load=tuple(cores[:half]))


def descendants(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """`pid` and every process below it (parent links read from /proc/<pid>/stat)."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended while we looked
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        fields = stat[stat.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def pin_tree(pid: int, cores: Iterable[int]) -> list[int]:
    """Pin `pid`, all its descendants and all their threads to `cores`; the pids pinned."""
    taskset = shutil.which("taskset")
    if taskset is None:
        raise RuntimeError("taskset (util-linux) is needed to pin the server to its cores")
    wanted = cpu_list(cores)
    pinned = []
    for process in descendants(pid):
        done = subprocess.run(
            [taskset, "-a", "-p", "-c", wanted, str(process)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode == 0:
            pinned.append(process)
    return pinned
