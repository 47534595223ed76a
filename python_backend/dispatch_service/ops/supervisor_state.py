"""What the launcher's supervisor is told (`SupervisorSettings`), watches
(`SupervisedServer`) and knows (`SupervisorState`): shared by the supervisor (`supervisor`)
and its stub healing (`stub_healing`)."""

from __future__ import annotations

import subprocess
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, Protocol

from dispatch_service.ops.health import Probe

__all__ = ["DeadPolicy", "SupervisedServer", "SupervisorSettings", "SupervisorState"]

DeadPolicy = Literal["exit", "restart"]


class SupervisedServer(Protocol):
    """What the supervisor needs of `server.TritonServer` (kept apart: no import cycle)."""

    @property
    def process(self) -> subprocess.Popen[bytes] | None: ...
    @property
    def http_url(self) -> str: ...
    @property
    def grpc_url(self) -> str: ...
    @property
    def metrics_url(self) -> str: ...
    @property
    def admin_key(self) -> str | None: ...
    @property
    def priority_key(self) -> str | None: ...
    @property
    def required_models(self) -> tuple[str, ...]: ...

    def start(self, timeout_s: float = ...) -> object: ...
    def stop(self, timeout_s: float = ..., *, graceful: bool = ...) -> None: ...


@dataclass(frozen=True)
class SupervisorSettings:
    poll_s: float = 0.25
    check_every_s: float = 1.0
    check_timeout_s: float = 2.0
    # No good check for this long: dead. Worst case from a hang to the verdict is
    # dead_after_s + check_every_s + check_timeout_s = 9 s, inside the 10 s target.
    dead_after_s: float = 6.0
    on_dead: DeadPolicy = "exit"
    # `restart` gives up like `exit` after this many restarts in a row whose server never
    # became ready (a server that cannot start is for the process manager's back-off and a
    # person), each tried again after failed_start_wait_s. Crashes after ready never count.
    max_failed_starts: int = 5
    failed_start_wait_s: float = 2.0
    # Triton 2.51 never ends a model's replaced instances once one of its stubs died, nor
    # reaps the dead stubs: the server is restarted cleanly once it holds this many dead or
    # replaced (stale) stubs, or any for stub_leak_max_age_s
    # (with no stub death in the last LEAK_QUIET_S).
    stub_leak_limit: int = 16
    stub_leak_max_age_s: float = 120.0
    drain_timeout_s: float = 30.0
    # On SIGTERM, readiness turns false this long before the entry points refuse new windows.
    drain_grace_s: float = 1.0
    quiet_s: float = 1.0
    health_host: str = "127.0.0.1"
    health_port: int = 8003  # 0: any free port (tests)


@dataclass
class SupervisorState:
    """What the supervisor knows of its server; read and written under its lock."""

    ready: bool = False
    draining: bool = False
    # model -> when its reload finished (inf while reloading): only a deep check begun after
    # that may end its recovery (one begun earlier may have been answered by the fallback).
    recovering: dict[str, float] = field(default_factory=dict)
    recovery_started: float = 0.0
    last_ok: float = 0.0
    last_probes: list[Probe] = field(default_factory=list)
    restarts: Counter[str] = field(default_factory=Counter)
    server_restarts: int = 0
    restarting: bool = False  # the restart policy is replacing the server: stubs come and go
    dead_reason: str = ""
    # entry point -> the fallback level its last probe was answered at (the scoring model
    # away or failing, the rule fallback answering): alive and serving, but degraded
    degraded: dict[str, int] = field(default_factory=dict)
    # models whose instances are not all back (a reload refused or failing): not ready
    unhealed: dict[str, str] = field(default_factory=dict)
    probes: Counter[str] = field(default_factory=Counter)  # deep-check windows sent
    leaked_stubs: int = 0  # dead (unreaped) and stale stubs the server holds, at the last look
    leak_restarts: int = 0  # clean server restarts that released them
