"""What the launcher checks and cleans on its host before a server starts.

- Ports: a second launcher on the ports of a running server must fail before it touches
  anything (the log file, /dev/shm): otherwise it would poll the first server's health,
  print `ready:`, truncate its log and delete its shared memory.
- Shared-memory prefixes: the Python backend names its regions after a prefix; one per
  server instance (``dispatchsrv_<launcher pid>_<random>_``), so a launcher removes only
  its own regions, and one that finds the prefix of a dead launcher knows the region is
  stale.
- Leftovers of a crash: regions under a dead launcher's prefix, and Python-backend stubs
  re-parented after their server died (their command line names the region), are removed
  at start.
- Listeners: every address tritonserver can be told to bind (`exposed_listeners`), one rule
  for the launcher's own flags and for those passed through with ``--triton-arg``.
- Children that outlive the launcher: Triton runs in a process group of its own (so a stop
  reaches its stubs), which also shields it from the launcher's death. A SIGKILLed launcher
  (the OOM killer, `kill -9`) left it serving, ports and shared memory held, until someone
  found it; `die_with_parent` makes the kernel stop it instead.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dispatch_service.core.backend_shm import STUB_NAME

__all__ = [
    "ADDRESS_FLAGS",
    "EXPOSURE_RISKS",
    "SHM_PREFIX_ROOT",
    "STUB_NAME",
    "WILDCARD_LISTENERS",
    "Leftovers",
    "ProcStat",
    "clean_leftovers",
    "describe_ports",
    "die_with_parent",
    "exposed_listeners",
    "find_leftovers",
    "is_loopback",
    "new_shm_prefix",
    "orphaned_servers",
    "ports_in_use",
    "prefix_owner",
    "proc_stat",
    "process_ended",
    "stop_orphaned_servers",
]

SHM_PREFIX_ROOT: Final = "dispatchsrv_"
_PREFIX = re.compile(rf"{SHM_PREFIX_ROOT}(\d+)_[0-9a-f]+_")

EXPOSURE_RISKS: Final = (
    "the embedded Triton 2.51 (nvidia-pytriton wheel) predates NVIDIA's August 2025 fixes: "
    "CVE-2025-23310 and CVE-2025-23311 (HTTP request parsing: a small HTTP JSON request can "
    "crash the server), CVE-2025-23319, CVE-2025-23320 and CVE-2025-23334 (the Python "
    "backend's shared memory reachable through the shared-memory API); expose the patched "
    "NGC image (docker/Dockerfile) instead, see docs/security.md"
)


def is_loopback(host: str) -> bool:
    """True for localhost and the loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# The tritonserver flags that set an address a listener binds to.
ADDRESS_FLAGS: Final = ("--http-address", "--grpc-address", "--metrics-address")
# Listeners with no address flag of their own: Triton 2.51 binds them to 0.0.0.0 (checked:
# "Started Sagemaker HTTPService at 0.0.0.0:<port>"). Vertex AI is also on by default when
# the environment has AIP_MODE=PREDICTION.
WILDCARD_LISTENERS: Final = ("--allow-sagemaker", "--allow-vertex-ai")
_VERTEX_ENV: Final = ("AIP_MODE", "PREDICTION")
_FALSE: Final = frozenset({"false", "0", "off", "no"})


def _named_flags(args: Sequence[str]) -> Iterable[tuple[str, str, str]]:
    """(flag, value, as written) for each argument that may set a flag of ADDRESS_FLAGS or
    WILDCARD_LISTENERS, read as tritonserver's getopt_long reads it: ``--flag=value`` or
    ``--flag value`` (the next argument), and any unambiguous abbreviation (``--metrics-addr``
    sets ``--metrics-address``). Fail-closed: a prefix shared by several flags (which
    tritonserver refuses as ambiguous) is read as each of them, and a flag and its value
    written as one argument (``"--http-address 0.0.0.0"``) is read as the flag too."""
    watched = (*ADDRESS_FLAGS, *WILDCARD_LISTENERS)
    position = 0
    while position < len(args):
        arg = args[position]
        position += 1
        if not arg.startswith("--") or arg == "--":
            continue
        name, equals, value = arg.partition("=")
        name, space, rest = name.strip().partition(" ")
        if not equals and space:  # "--flag value" as one argument
            value, equals = rest.strip(), "="
        matches = [flag for flag in watched if len(name) > 2 and flag.startswith(name)]
        if not matches:
            continue
        if not equals:  # the value is the next argument, whatever it looks like
            value = args[position] if position < len(args) else ""
            position += 1
            arg = f"{arg} {value}"
        for flag in matches:
            yield flag, value.strip(), arg


def exposed_listeners(args: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """What in a tritonserver command line and its environment listens beyond loopback:
    each address flag whose value is not a loopback address (`is_loopback`; a host name other
    than localhost counts as exposed), each SageMaker or Vertex AI listener turned on (they
    bind every interface), and Vertex AI turned on by ``AIP_MODE=PREDICTION`` unless the
    command turns it off. Empty when everything stays on loopback."""
    exposed: list[str] = []
    vertex_set = False
    for flag, value, written in _named_flags(args):
        if flag in ADDRESS_FLAGS:
            if not is_loopback(value.strip("[]")):
                exposed.append(written)
            continue
        vertex_set = vertex_set or flag == "--allow-vertex-ai"
        if value.lower() not in _FALSE:
            exposed.append(f"{written} (listens on 0.0.0.0, no address flag)")
    key, mode = _VERTEX_ENV
    if not vertex_set and (env or {}).get(key) == mode:
        exposed.append(f"{key}={mode} in the environment (Vertex AI listens on 0.0.0.0)")
    return exposed


def ports_in_use(host: str, ports: Iterable[int]) -> list[int]:
    """The ports of ``ports`` that something already listens on at ``host``.

    Binds with SO_REUSEADDR, as Triton does: a port in TIME_WAIT counts as free, one with a
    listener does not (Linux refuses the bind).
    """
    busy = []
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for port in ports:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                    busy.append(port)
                else:
                    raise
    return busy


def new_shm_prefix(pid: int | None = None) -> str:
    """A prefix no other server instance uses: the launcher's pid and 48 random bits."""
    return f"{SHM_PREFIX_ROOT}{os.getpid() if pid is None else pid}_{secrets.token_hex(6)}_"


def prefix_owner(name: str) -> int | None:
    """The launcher pid in a region or command line carrying a server prefix, else None."""
    match = _PREFIX.search(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class ProcStat:
    """What this package reads of ``/proc/<pid>/stat``."""

    name: str  # the command name (comm)
    state: str  # "R", "S", ... "Z" for a zombie
    parent: int  # ppid


def proc_stat(pid_dir: Path) -> ProcStat | None:
    """``pid_dir``'s ``stat`` (``/proc/<pid>``), or None when the process is gone. The line is
    ``pid (comm) state ppid ...``; comm may hold spaces and parentheses, so it ends at the
    last ")"."""
    try:
        text = (pid_dir / "stat").read_text()
        head, tail = text.rsplit(")", 1)
        state, parent = tail.split()[:2]
        return ProcStat(head.split("(", 1)[1], state, int(parent))
    except (OSError, ValueError, IndexError):  # gone, or vanished while read
        return None


def process_ended(pid: int, timeout_s: float = 0.0, proc: Path = Path("/proc")) -> bool:
    """Whether process ``pid`` has ended, waiting up to ``timeout_s`` (looked at least once).

    A zombie has ended too: its parent died or has not reaped it yet, and it holds nothing
    (a killed launcher stays one until whoever adopted it reaps it).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        stat = proc_stat(proc / str(pid))
        if stat is None or stat.state == "Z":
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    return not process_ended(pid)


@dataclass(frozen=True)
class Leftovers:
    regions: tuple[Path, ...]
    stubs: tuple[int, ...]  # pids


def die_with_parent(signum: int = signal.SIGTERM) -> list[str]:
    """A command prefix: the command it starts is sent ``signum`` when the thread that
    started it ends, the launcher's death included (Linux ``PR_SET_PDEATHSIG``, set by
    util-linux's ``setpriv`` and kept across exec). Empty where there is no ``setpriv`` (the
    child then outlives a SIGKILLed parent, as without it).

    A prefix, not a ``preexec_fn``: Python code run between fork and exec in a multi-threaded
    parent (the launcher, a test worker) is unsafe, as Python's subprocess docs warn. The kernel
    watches the starting thread, not the process: start children from a thread that lives as
    long as they should (the launcher's main thread, or the supervisor's watcher, which ends
    only when the server is being stopped anyway). A parent that dies in the instant before
    ``setpriv`` sets the signal is not caught: the next start finds its server orphaned
    (`orphaned_servers`).
    """
    if not sys.platform.startswith("linux"):
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return []
    return [setpriv, f"--pdeathsig={signal.Signals(signum).name.removeprefix('SIG')}", "--"]


def find_leftovers(shm_dir: Path = Path("/dev/shm"), proc: Path = Path("/proc")) -> Leftovers:
    """Regions and stubs under the prefix of a launcher that is gone."""
    regions = []
    if shm_dir.is_dir():
        for path in shm_dir.glob(f"{SHM_PREFIX_ROOT}*"):
            owner = prefix_owner(path.name)
            if owner is not None and not _alive(owner):
                regions.append(path)
    stubs = []
    for entry in proc.glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(STUB_NAME.encode()):
            continue
        owner = next(
            (prefix_owner(a.decode(errors="replace")) for a in argv if b"dispatchsrv_" in a),
            None,
        )
        if owner is not None and not _alive(owner):
            stubs.append(int(entry.name))
    return Leftovers(tuple(sorted(regions)), tuple(sorted(stubs)))


_PORT_FLAGS: Final = ("--http-port=", "--grpc-port=", "--metrics-port=")


def orphaned_servers(ports: Iterable[int], proc: Path = Path("/proc")) -> list[int]:
    """Pids of the tritonservers a launcher of this repository started (their shared-memory
    prefix names it) whose launcher is gone, listening on any of ``ports``: after a
    `kill -9` of the launcher its Triton, told to stop (`die_with_parent`), still held the
    gRPC and metrics ports for about 8 s while it unloaded, and a new start was refused."""
    wanted = {str(port) for port in ports}
    found = []
    for entry in proc.glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith("tritonserver"):
            continue
        owner = next((prefix_owner(a) for a in argv if SHM_PREFIX_ROOT in a), None)
        if owner is None or _alive(owner):
            continue
        listening = {a.split("=", 1)[1] for a in argv if a.startswith(_PORT_FLAGS)}
        if listening & wanted and not process_ended(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def stop_orphaned_servers(
    ports: Iterable[int], timeout_s: float = 15.0, proc: Path = Path("/proc")
) -> list[str]:
    """Kill the process group of each `orphaned_servers` on ``ports`` (its stubs with it) and
    wait for each to end, up to ``timeout_s``; one line per server."""
    lines = []
    for pid in orphaned_servers(ports, proc):
        try:
            os.killpg(pid, signal.SIGKILL)  # its own session: the group is its pid
        except (ProcessLookupError, PermissionError):
            continue
        ended = process_ended(pid, timeout_s, proc)
        state = "stopped" if ended else f"still running after {timeout_s:.0f} s"
        lines.append(f"orphaned tritonserver pid {pid} (its launcher is gone) {state}")
    return lines


def clean_leftovers(leftovers: Leftovers) -> list[str]:
    """Kill the orphaned stubs, unlink the stale regions; one line per thing removed."""
    lines = []
    for pid in leftovers.stubs:
        try:
            os.kill(pid, signal.SIGKILL)
            lines.append(f"killed orphaned backend stub pid {pid}")
        except (ProcessLookupError, PermissionError):
            pass
    for path in leftovers.regions:
        try:
            path.unlink()
            lines.append(f"removed stale shared-memory region {path}")
        except FileNotFoundError:
            pass
        except PermissionError:
            lines.append(f"cannot remove stale shared-memory region {path} (permission)")
    return lines


def describe_ports(host: str, busy: Sequence[int]) -> str:
    listed = ", ".join(str(p) for p in busy)
    return (
        f"port(s) {listed} on {host} already in use (another server?); nothing was started "
        "and no log or shared memory was touched: stop it or choose other ports "
        "(make serve HTTP_PORT=... GRPC_PORT=... METRICS_PORT=...)"
    )
