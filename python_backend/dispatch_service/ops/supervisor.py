"""The launcher's watch over its Triton: stubs, a deep health check, drain on SIGTERM.

Triton 2.51 never restarts a Python-backend stub that dies (every request to that instance
then fails after about 1 s while `/v2/health/ready` stays 200), answers its health endpoints
while inference hangs, and fails in-flight ensemble requests when stopped (issue 10).
So the launcher:

- polls its server's stubs every ``poll_s`` (0.25 s): a stub that died marks the server
  not ready and its model is reloaded through the locked repository API (a load with the
  model's own config as an override forces Triton to build new instances); readiness
  returns when every entry point answers again. Restarts are counted (metric
  ``dispatch_launcher_stub_restarts_total``) and logged as JSON lines. Triton ends stubs
  itself too -- a version unloaded (``rollback --unload-canary``), a model reloaded with a
  new config (``deploy`` and ``rollback`` set the router's parameters that way; the new
  instances start before the old ones end) -- so a vanished stub counts as dead only while
  its version is still READY and fewer stubs than the model's instance count serve it
  (`stub_deaths`); the others are logged as ``stub_retired`` and left alone. Stubs that
  outlive the launcher's own reload are stale (2.51 never ends the replaced instances once
  one of their model's stubs died) and never count as serving. A model whose instances are
  not all back after its reload (refused, failing, or a new stub dead again) stays not ready
  (``unhealed``) and is recovered again after a bounded backoff (`HEAL_RETRY_WAITS_S`): every
  death is healed, or the server says it is not ready. On a verified server every reload
  (and a restart's live configs) is checked against the files first
  (`verified_load.check_load`): a changed version is never loaded, its refusal logged with
  the digest of what was found;
- sends a small real window to each entry point every ``check_every_s`` with a short
  deadline (`health.deep_check`, at the highest priority level); a probe refused or timed
  out for want of capacity counts as answered while its entry point keeps completing other
  requests (Triton's success counters, read beside the probes): a server shedding load is
  alive, a hung one completes nothing. A probe answered in full through a fallback (the
  scoring model away) makes the server degraded -- live, ready, ``degraded`` in `/healthz`
  and on `/metrics` -- never dead. When no check succeeded for ``dead_after_s`` it is
  declared dead and the policy applies (``exit``: stop it and exit non-zero for the process
  manager; ``restart``: stop and start it again, then load back the configs `deploy` and
  `rollback` set live -- the scoring versions, the router's and dispatch_fused's routing --
  as the last good check read them, so a restart does not end a rollout). Under ``restart``
  a Triton process that has exited is restarted at the next check, without that wait (2.51
  aborts with ``boost::interprocess::lock_exception`` now and then when a stub is SIGKILLed
  while it holds a shared-memory lock); under ``exit`` the launcher exits with Triton's
  status;
- serves the verdicts on its own HTTP port: ``/livez`` and ``/readyz`` (200 or 503),
  ``/healthz`` (JSON detail) and ``/metrics`` (Prometheus text);
- on SIGTERM turns readiness false, after ``drain_grace_s`` closes the entry points' gate (new
  windows refused UNAVAILABLE, `serving.drain`), waits until what was accepted is done
  (`drain_and_stop`), bounded by ``drain_timeout_s``, then stops Triton.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal, Protocol

from dispatch_service.core.signing import verify_version
from dispatch_service.ops.health import Probe, deep_check
from dispatch_service.ops.host import STUB_NAME, proc_stat
from dispatch_service.ops.model_control import (
    ModelControlError,
    load_model,
    model_config,
    repository_index,
    unload_model,
    with_reload_mark,
    without_reload_mark,
)
from dispatch_service.ops.restart import start_again
from dispatch_service.ops.verified_load import LoadVerifier, refusal_fields
from dispatch_service.routing.settings import (
    FUSED_MODEL_NAME,
    ROUTER_MODEL_NAME,
    SCORING_MODEL_NAME,
)


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
    def required_models(self) -> tuple[str, ...]: ...

    def start(self, timeout_s: float = ...) -> object: ...
    def stop(self, timeout_s: float = ...) -> None: ...


__all__ = [
    "ENTRY_MODELS",
    "GATE_MODELS",
    "HEAL_RETRY_WAITS_S",
    "RECOVERY_GRACE_S",
    "RELOAD_RETRY_WAITS_S",
    "RELOAD_TIMEOUT_S",
    "DeadPolicy",
    "SupervisedServer",
    "Supervisor",
    "SupervisorSettings",
    "drain_activity",
    "instance_count",
    "stub_deaths",
    "stub_model_files",
    "stub_models",
    "stub_versions",
    "triton_activity",
    "triton_successes",
]

logger = logging.getLogger(__name__)

DeadPolicy = Literal["exit", "restart"]
RECOVERY_GRACE_S = 30.0
# A dead stub's reload that fails (a stub too slow to start on a busy machine, the repository
# API briefly refusing) is tried again after these waits; after the last, the deep check's
# verdict decides (dead after `dead_after_s`, past RECOVERY_GRACE_S), as before.
RELOAD_RETRY_WAITS_S = (1.0, 3.0)
# A model still short of instances after those (a reload refused, failing, or a new stub dead
# again) stays not ready and is recovered again after these waits, the last repeated: bounded
# backoff, never given up while the server lives (the deep check still judges the server).
HEAL_RETRY_WAITS_S = (1.0, 2.0, 4.0, 8.0)
UNVERIFIED_CODE = "running code that does not verify"
# A reload's load request waits this long at most: 2.51 never finishes a load one of whose
# new stubs died while it started, and the watcher must not wait on it for minutes (the
# deep check declares the server dead after RECOVERY_GRACE_S meanwhile).
RELOAD_TIMEOUT_S = 60.0
# What `dispatch-admin deploy` / `rollback` change live, in the order a restart loads them
# back: the scoring versions, then the router, then dispatch_fused (which routes the same).
LIVE_MODELS = (SCORING_MODEL_NAME, ROUTER_MODEL_NAME, FUSED_MODEL_NAME)


@dataclass(frozen=True)
class SupervisorSettings:
    poll_s: float = 0.25
    check_every_s: float = 1.0
    check_timeout_s: float = 2.0
    # No good check for this long: dead. Worst case from a hang to the verdict is
    # dead_after_s + check_every_s + check_timeout_s = 9 s, inside issue 10's 10 s.
    dead_after_s: float = 6.0
    on_dead: DeadPolicy = "exit"
    # `restart` gives up like `exit` after this many restarts within restart_window_s: a
    # server that keeps dying is for the process manager's back-off and a person, not a loop.
    max_restarts: int = 5
    restart_window_s: float = 600.0
    drain_timeout_s: float = 30.0
    # On SIGTERM, readiness turns false this long before the entry points refuse new windows.
    drain_grace_s: float = 1.0
    quiet_s: float = 1.0
    health_host: str = "127.0.0.1"
    health_port: int = 8003  # 0: any free port (tests)


StubKey = tuple[str, str]  # (model, version folder)


def stub_models(parent_pid: int, proc: Path = Path("/proc")) -> dict[int, str]:
    """pid -> model of every Python-backend stub whose parent is ``parent_pid``."""
    return {pid: model for pid, (model, _) in stub_versions(parent_pid, proc).items()}


def stub_versions(parent_pid: int, proc: Path = Path("/proc")) -> dict[int, StubKey]:
    """pid -> (model, version) of every Python-backend stub whose parent is ``parent_pid``.

    A stub's command line is ``stub <repository>/<model>/<version>/model.py <region> ...``.
    """
    return {
        pid: (model_py.parent.parent.name, model_py.parent.name)
        for pid, model_py in stub_model_files(parent_pid, proc).items()
    }


def stub_model_files(parent_pid: int, proc: Path = Path("/proc")) -> dict[int, Path]:
    """pid -> the ``model.py`` each Python-backend stub of ``parent_pid`` runs (its folder is
    the version folder Triton loaded it from: a temporary one for files uploaded in a load
    request)."""
    found = {}
    for entry in proc.glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) < 2 or not argv[0].endswith(STUB_NAME.encode()):
            continue
        stat = proc_stat(entry)
        if stat is None or stat.state == "Z" or stat.parent != parent_pid:
            continue
        found[int(entry.name)] = Path(argv[1].decode(errors="replace"))
    return found


def instance_count(config: dict[str, Any]) -> int:
    """The stubs one version of a Python-backend model runs: its instance groups' counts
    (1 by default), a KIND_GPU group's once per listed GPU."""
    groups = config.get("instance_group") or [{}]
    total = 0
    for group in groups:
        count = int(group.get("count", 1) or 1)
        gpus = group.get("gpus") or []
        total += count * (len(gpus) if group.get("kind") == "KIND_GPU" and gpus else 1)
    return total


def stub_deaths(
    lost: dict[int, StubKey],
    alive: dict[int, StubKey],
    ready: set[StubKey],
    instances: dict[str, int],
    stale: frozenset[int] | set[int] = frozenset(),
) -> dict[str, list[int]]:
    """model -> pids of the ``lost`` stubs that died rather than being ended by Triton.

    Triton ends a version's stubs when it unloads that version (then it is no longer READY)
    and the old instances' stubs when it reloads a model with a new config (then the new
    stubs already serve the version: as many as ``instances`` asks). A lost stub whose
    version is READY with fewer ``alive`` stubs than its model's instance count died.

    ``stale`` stubs serve nothing: the old instances that Triton 2.51 never ends after one
    of their model's stubs died and the model was reloaded. Counted as serving, they hid
    the next death of a new instance (two deaths 3 s apart: the second was taken for a
    retirement and never healed). A lost stale stub is no death either.
    """
    deaths: dict[str, list[int]] = {}
    for pid, key in sorted(lost.items()):
        model = key[0]
        if key not in ready or pid in stale:
            continue  # unloaded (or unloading): Triton ended it
        serving = sum(1 for other, k in alive.items() if k == key and other not in stale)
        if serving >= instances.get(model, 1):
            continue  # replaced by a reload's new instances
        deaths.setdefault(model, []).append(pid)
    return deaths


_SAMPLE = re.compile(
    r"^(nv_inference_pending_request_count|nv_inference_request_success|"
    r"nv_inference_request_failure)\{([^}]*)\}\s+([0-9.eE+-]+)$",
    re.M,
)
_MODEL_LABEL = re.compile(r'model="([^"]*)"')


def _samples(metrics_url: str, timeout_s: float) -> list[tuple[str, str, float]]:
    """(metric, model, value) of Triton's request counters and gauges."""
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
        text = response.read().decode(errors="replace")
    samples = []
    for name, labels, value in _SAMPLE.findall(text):
        model = _MODEL_LABEL.search(labels)
        samples.append((name, model.group(1) if model else "", float(value)))
    return samples


def triton_activity(metrics_url: str, timeout_s: float = 2.0) -> tuple[float, float]:
    """(pending requests, completed requests) summed over models from Triton's metrics."""
    pending = done = 0.0
    for name, _, value in _samples(metrics_url, timeout_s):
        if name == "nv_inference_pending_request_count":
            pending += float(value)
        else:
            done += float(value)
    return pending, done


# The models that hold the drain gate (`serving.drain`): Triton counts each request they
# refuse as a success of theirs (the Python backend answered it), so their counters move
# under refused traffic; an ensemble counts the refusal as its failure.
GATE_MODELS = frozenset({"feature_encoder", FUSED_MODEL_NAME})
# Where windows enter the server: their pending gauges also count the requests the gate
# refuses; the models behind them see accepted work only.
ENTRY_MODELS = GATE_MODELS | {"dispatch", "dispatch_features"}


def drain_activity(metrics_url: str, timeout_s: float = 2.0) -> tuple[float, float]:
    """(pending requests in the models behind the entry points, successful requests of all
    but the gate models): what a drain with the gate closed waits on. Refused requests move
    neither; a window accepted before the gate closed moves both until it is answered."""
    pending = done = 0.0
    for name, model, value in _samples(metrics_url, timeout_s):
        if name == "nv_inference_pending_request_count" and model not in ENTRY_MODELS:
            pending += value
        elif name == "nv_inference_request_success" and model not in GATE_MODELS:
            done += value
    return pending, done


def triton_successes(metrics_url: str, timeout_s: float = 2.0) -> dict[str, float]:
    """Successful requests per model (all versions) from Triton's metrics."""
    successes: dict[str, float] = {}
    for name, model, value in _samples(metrics_url, timeout_s):
        if name == "nv_inference_request_success":
            successes[model] = successes.get(model, 0.0) + value
    return successes


@dataclass
class _State:
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


class Supervisor:
    """Watches one started TritonServer until stopped; see the module docstring."""

    def __init__(
        self,
        server: SupervisedServer,
        settings: SupervisorSettings | None = None,
        report: Callable[[str], None] = logger.warning,
        verifier: LoadVerifier | None = None,
    ) -> None:
        self.server = server
        self.settings = settings or SupervisorSettings()
        self.report = report
        # A verified server's: every reload and restored config is checked against the
        # files first (`verified_load.check_load`); None: the server does not verify.
        self.verifier = verifier
        self.models = server.required_models or ("dispatch",)
        self.state = _State(ready=True, last_ok=time.monotonic())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.dead = threading.Event()
        self._stubs: dict[int, StubKey] = {}
        self._stale: set[int] = set()  # old instances 2.51 left running after a reload
        self._unverified: dict[int, str] = {}  # stub pid -> model, running unverified code
        self._heal_due: dict[str, float] = {}  # model -> when to recover it again
        self._heal_tries: Counter[str] = Counter()
        self._successes: dict[str, float] = {}
        self._restarted_at: list[float] = []  # monotonic times of the policy's restarts
        self._live: dict[str, dict[str, Any]] = {}  # LIVE_MODELS' configs at the last good check
        self._threads: list[threading.Thread] = []
        self._http: ThreadingHTTPServer | None = None
        # More Prometheus text for `/metrics` (each called per scrape), e.g. the launcher's
        # crash counter (`ops.restart.CrashCounter.metrics_text`).
        self.metric_sources: list[Callable[[], str]] = []

    # -- verdicts -------------------------------------------------------------------------
    def live(self) -> bool:
        with self._lock:
            return not self.state.dead_reason

    def ready(self) -> bool:
        with self._lock:
            return self._ready_locked()

    def _ready_locked(self) -> bool:
        s = self.state
        return (
            s.ready and not s.draining and not s.recovering and not s.unhealed and not s.dead_reason
        )

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            s = self.state
            ready = self._ready_locked()
            status = (
                "dead"
                if s.dead_reason
                else "draining"
                if s.draining
                else "not_ready"
                if not ready
                else "degraded"
                if s.degraded
                else "ok"
            )
            return {
                "live": not s.dead_reason,
                "ready": ready,
                "status": status,
                "degraded": dict(sorted(s.degraded.items())),
                "unhealed": dict(sorted(s.unhealed.items())),
                "draining": s.draining,
                "recovering": sorted(s.recovering),
                "dead_reason": s.dead_reason,
                "seconds_since_last_good_check": round(time.monotonic() - s.last_ok, 3),
                "entry_points": [
                    {"model": p.model, "ok": p.ok, "detail": p.detail, "ms": p.seconds * 1e3}
                    for p in s.last_probes
                ],
                "stub_restarts": dict(s.restarts),
                "probes": dict(s.probes),
                "server_restarts": s.server_restarts,
            }

    def metrics_text(self) -> str:
        snap = self.snapshot()
        lines = [
            "# HELP dispatch_launcher_stub_restarts_total Python-backend stubs found dead "
            "and their model reloaded by the launcher.",
            "# TYPE dispatch_launcher_stub_restarts_total counter",
        ]
        lines += [
            f'dispatch_launcher_stub_restarts_total{{model="{m}"}} {n}'
            for m, n in sorted(snap["stub_restarts"].items())
        ]
        lines += [
            "# HELP dispatch_launcher_ready 1 when every entry point answers a small window.",
            "# TYPE dispatch_launcher_ready gauge",
            f"dispatch_launcher_ready {int(snap['ready'])}",
            "# HELP dispatch_launcher_server_restarts_total Servers restarted after a failed "
            "deep check.",
            "# TYPE dispatch_launcher_server_restarts_total counter",
            f"dispatch_launcher_server_restarts_total {snap['server_restarts']}",
            "# HELP dispatch_launcher_degraded 1 while the entry point answers its probe only "
            "through a fallback (the scoring model away or failing).",
            "# TYPE dispatch_launcher_degraded gauge",
        ]
        degraded = snap["degraded"]
        lines += [
            f'dispatch_launcher_degraded{{entry_point="{m}"}} {int(m in degraded)}'
            for m in self.models
        ]
        lines += [
            "# HELP dispatch_launcher_fallback_level The fallback level of the entry point's "
            "last probe answer (0: the chosen model version scored it).",
            "# TYPE dispatch_launcher_fallback_level gauge",
        ]
        lines += [
            f'dispatch_launcher_fallback_level{{entry_point="{m}"}} {degraded.get(m, 0)}'
            for m in self.models
        ]
        lines += [
            "# HELP dispatch_launcher_unhealed 1 while a model's instances are not all back "
            "(its reload refused or failing); the server is not ready meanwhile.",
            "# TYPE dispatch_launcher_unhealed gauge",
        ]
        lines += [f'dispatch_launcher_unhealed{{model="{m}"}} 1' for m in sorted(snap["unhealed"])]
        lines += [
            "# HELP dispatch_launcher_probes_total Deep-check windows sent to the entry point "
            "(counted by Triton's nv_inference_* like any request; the project's own metrics "
            "leave them out).",
            "# TYPE dispatch_launcher_probes_total counter",
        ]
        lines += [
            f'dispatch_launcher_probes_total{{entry_point="{m}"}} {n}'
            for m, n in sorted(snap["probes"].items())
        ]
        return "\n".join(lines) + "\n" + "".join(source() for source in self.metric_sources)

    def _event(self, event: str, **fields: Any) -> None:
        self.report(json.dumps({"event": event, **fields}, sort_keys=True))

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> Supervisor:
        self._stubs = self._current_stubs()
        self._serve_http()
        for target in (self._watch_stubs, self._watch_health):
            thread = threading.Thread(target=target, name=target.__name__, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    @property
    def health_url(self) -> str:
        assert self._http is not None
        host, port = self._http.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()

    def drain_and_stop(self) -> float:
        """Readiness false, after ``drain_grace_s`` the entry points' gate closed (new
        windows refused UNAVAILABLE, `serving.drain`), wait until what was accepted is done
        (bounded by ``drain_timeout_s`` in all), stop Triton; returns seconds drained.

        Done: for ``quiet_s``, no request completed and none waits in a model behind the
        gate. Refusals count as neither (they fail, and only at the gate), so continuous
        traffic no longer keeps a drain from ending. Then Triton is killed at once: nothing
        accepted is left, and a graceful stop of 2.51 answers NOT_FOUND ("no available
        versions") to every request while it unloads its models. A drain that ran into its
        timeout stops Triton gracefully instead (its exit timeout lets the rest finish).
        Without a gate (a server that has none) the old rule applies: nothing pending and
        nothing completing."""
        with self._lock:
            self.state.draining = True
        self._event("drain_started", timeout_s=self.settings.drain_timeout_s)
        start = time.monotonic()
        deadline = start + self.settings.drain_timeout_s
        # Readiness false first, new windows still served for a moment: a load balancer
        # that polls readiness moves its traffic away before anything is refused.
        time.sleep(min(self.settings.drain_grace_s, self.settings.drain_timeout_s))
        gated = self._close_gate()
        quiet_since: float | None = None
        last_done = -1.0
        quiet = False
        while time.monotonic() < deadline:
            try:
                pending, done = (
                    drain_activity(self.server.metrics_url)
                    if gated
                    else triton_activity(self.server.metrics_url)
                )
            except (urllib.error.URLError, OSError, ValueError):
                break  # no metrics: nothing more to learn, stop as usual
            now = time.monotonic()
            if pending == 0 and done == last_done:
                quiet_since = quiet_since or now
                if now - quiet_since >= self.settings.quiet_s:
                    quiet = True
                    break
            else:
                quiet_since = None
            last_done = done
            time.sleep(0.1)
        drained = time.monotonic() - start
        self._event("drain_finished", seconds=round(drained, 3), quiet=quiet)
        self.stop()
        process = self.server.process
        if gated and quiet and process is not None and process.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
        self.server.stop()
        return drained

    def _close_gate(self) -> bool:
        """Close the server's drain gate; False where it has none or it cannot be closed."""
        close = getattr(self.server, "close_gate", None)
        if close is None:
            return False
        try:
            close()
        except OSError as exc:
            self._event("drain_gate_failed", error=str(exc))
            return False
        return True

    # -- watchers -------------------------------------------------------------------------
    def _current_stubs(self) -> dict[int, StubKey]:
        process = self.server.process
        return {} if process is None else stub_versions(process.pid)

    def _watch_stubs(self) -> None:
        while not self._stop.wait(self.settings.poll_s):
            self._check_stubs()

    def _check_stubs(self) -> None:
        """One look at the stubs: recover the models whose stubs died, and again those whose
        earlier recovery did not bring every instance back, once their wait is over."""
        with self._lock:
            if self.state.draining or self.state.dead_reason or self.state.restarting:
                return  # stubs end with a stopping server and start with a new one
        process = self.server.process
        if process is None or process.poll() is not None:
            # Triton itself is gone (crashed or stopped) and its stubs with it: that is the
            # deep check's verdict to give, not a stub death per model to reload.
            self._stubs = {}
            self._stale.clear()
            self._unverified.clear()
            return
        now = self._current_stubs()
        lost = {pid: key for pid, key in self._stubs.items() if pid not in now}
        started = set(now) - set(self._stubs)
        self._stubs = now
        self._check_code(started, now)
        deaths = self._deaths(lost, now) if lost else {}
        self._stale &= set(now)
        retired = sorted(pid for pid in lost if not any(pid in d for d in deaths.values()))
        if retired:
            models = sorted({lost[pid][0] for pid in retired})
            self._event("stub_retired", models=models, pids=retired)
        for model, pids in sorted(deaths.items()):
            self._recover(model, pids)
        due = sorted(m for m, t in self._heal_due.items() if t <= time.monotonic())
        for model in due:
            if model not in deaths:
                self._recover(model, [])

    def _check_code(self, started: set[int], now: dict[int, StubKey]) -> None:
        """On a verified server, the code every new stub runs: its version folder must lie in
        the repository and verify now. Triton's repository API (behind the admin key) can
        load a model from files uploaded with the request, or from files changed on disk,
        without the launcher: such a stub is reported (``unverified_code_running``, with the
        digests) and keeps the server not ready while it runs. It cannot be stopped before
        its code ran (docs/security.md, "The admin key runs code")."""
        for pid in [p for p in self._unverified if p not in now]:
            self._unverified.pop(pid)
        if self.verifier is not None and started and self.server.process is not None:
            files = stub_model_files(self.server.process.pid)
            for pid in sorted(started):
                if pid in files:
                    self._check_stub_code(pid, files[pid])
        flagged = set(self._unverified.values())
        with self._lock:
            for model, why in list(self.state.unhealed.items()):
                if why == UNVERIFIED_CODE and model not in flagged:
                    del self.state.unhealed[model]
            for model in flagged:
                self.state.unhealed[model] = UNVERIFIED_CODE

    def _check_stub_code(self, pid: int, model_py: Path) -> None:
        assert self.verifier is not None
        folder = model_py.parent
        repository = self.verifier.repository.resolve()
        model = folder.parent.name
        fields: dict[str, Any]
        if folder.parent.parent.resolve() != repository or not folder.name.isdigit():
            try:
                digest = hashlib.sha256(model_py.read_bytes()).hexdigest()
            except OSError:
                digest = ""
            fields = {
                "model": model,
                "folder": str(folder),
                "reason": "loaded from outside the model repository (files uploaded with a "
                "load request?)",
                "file": model_py.name,
                "file_sha256": digest,
            }
        else:
            verdict = verify_version(folder, self.verifier.trusted)
            if verdict.accepted:
                return
            fields = refusal_fields(self.verifier.repository, verdict)
        self._unverified[pid] = model
        self._event("unverified_code_running", pid=pid, **fields)

    def _deaths(self, lost: dict[int, StubKey], now: dict[int, StubKey]) -> dict[str, list[int]]:
        """`stub_deaths` with what Triton says now; when it cannot say, every loss counts
        (the reload is what a dead stub needs, and the deep check watches the rest)."""
        url, key = self.server.http_url, self.server.admin_key
        timeout = self.settings.check_timeout_s
        try:
            ready = {
                (str(entry["name"]), str(entry["version"]))
                for entry in repository_index(url, key, timeout)
                if entry.get("state") == "READY" and "version" in entry
            }
        except ModelControlError:
            ready = set(lost.values())
        instances = {}
        for model in sorted({model for model, _ in lost.values()}):
            # Not loaded any more (then not READY either): stub_deaths assumes one instance.
            with contextlib.suppress(ModelControlError):
                instances[model] = instance_count(model_config(url, model, timeout))
        return stub_deaths(lost, now, ready, instances, self._stale)

    def _verified_config(self, model: str, config: dict[str, Any]) -> dict[str, Any] | None:
        """``config`` as it may load on a verified server: serving only the versions whose
        files verify now; None when none does (then nothing is loaded). Refusals are logged
        with the digest of the files found."""
        if self.verifier is None:
            return config
        check = self.verifier.check(model, without_reload_mark(config))
        for line in self.verifier.refusal_lines(check):
            self.report(line)
        restricted = check.restricted_config()
        if restricted is None:
            return None
        if "parameters" in config:  # keep a reload mark the caller added
            restricted["parameters"] = config["parameters"]
        return restricted

    def _missing(self, model: str, config: dict[str, Any], now: dict[int, StubKey]) -> int:
        """How many instances of a Python-backend ``model``'s READY versions have no live
        stub (stale ones not counted): 0 when all are there, and where that cannot be seen
        (no process, another backend, no repository index: the deep check judges then)."""
        if self.server.process is None or config.get("backend", "python") != "python":
            return 0
        try:
            versions = {
                str(entry["version"])
                for entry in repository_index(
                    self.server.http_url, self.server.admin_key, self.settings.check_timeout_s
                )
                if entry.get("name") == model
                and entry.get("state") == "READY"
                and "version" in entry
            }
        except ModelControlError:
            return 0
        wanted = instance_count(config)
        if not versions:
            return wanted  # nothing of it serves
        serving = Counter(key[1] for pid, key in now.items() if key[0] == model)
        for pid, key in now.items():
            if key[0] == model and pid in self._stale:
                serving[key[1]] -= 1
        return sum(max(0, wanted - serving[v]) for v in versions)

    def _recover(self, model: str, pids: list[int]) -> None:
        retry = model in self._heal_due
        with self._lock:
            self.state.recovering[model] = float("inf")
            if not retry:
                self.state.recovery_started = time.monotonic()
            if pids:
                self.state.restarts[model] += len(pids)  # each dead stub counts
        if pids:
            self._event("stub_died", model=model, pids=pids)
        else:
            self._event("model_recovery_retried", model=model, attempt=self._heal_tries[model])
        url, key = self.server.http_url, self.server.admin_key
        before = {pid for pid, k in self._current_stubs().items() if k[0] == model}
        # Triton keeps a dead stub's instance when asked to load an unchanged model
        # ("successfully loaded" in milliseconds, requests still fail); renaming the
        # instance groups is no better on 2.51. Two ways that work:
        # - the model is loaded with a new reload mark: Triton builds every instance anew
        #   while the old ones answer, and the model (and any ensemble running it) stays
        #   loaded. Unload + load made `dispatch` unknown for ~4 s when a feature_encoder
        #   or topk_resolver stub died (45 % of requests failed; now 0.1-0.4 %), and
        #   `dispatch_fused` unknown for ~3 s when one of its stubs died (23 %);
        # - the scoring model, which only the router and dispatch_fused call, and which
        #   they answer for with their fallback while it is away, is unloaded, then
        #   loaded with its own config (versions included): ready again in ~2.2 s,
        #   against 3-5 s with a mark.
        # On a verified server the versions to load are verified first, from the files as
        # they are now: a reload never brings up code or weights changed since the start.
        config: dict[str, Any] | None = None
        loading: dict[str, Any] | None = None
        unloaded = loaded = refused = False
        for attempt, retry_in_s in enumerate((*RELOAD_RETRY_WAITS_S, None), start=1):
            try:
                if config is None:  # read once: an unloaded model has no config to read
                    config = model_config(url, model)
                if model == SCORING_MODEL_NAME:
                    loading = self._verified_config(model, config)
                    if loading is None:
                        refused = True
                        break
                    if not unloaded:
                        unload_model(url, model, admin_key=key, timeout_s=RELOAD_TIMEOUT_S)
                        unloaded = True
                    load_model(url, model, loading, admin_key=key, timeout_s=RELOAD_TIMEOUT_S)
                else:
                    loading = self._verified_config(model, with_reload_mark(config))
                    if loading is None:
                        refused = True
                        break
                    load_model(url, model, loading, admin_key=key, timeout_s=RELOAD_TIMEOUT_S)
            except ModelControlError as exc:
                self._event(
                    "model_reload_failed",
                    model=model,
                    error=str(exc),
                    attempt=attempt,
                    retry_in_s=retry_in_s,
                )
                if retry_in_s is None or self._stop.wait(retry_in_s):
                    break
            else:
                loaded = True
                self._event("model_reloaded", model=model, attempt=attempt)
                break
        now = self._current_stubs()
        if loaded:
            # The replaced instances' stubs that are still running serve nothing (2.51
            # never ends them once one of their model's stubs died).
            self._stale |= before & set(now)
        # This model's stubs as they are now; the others' as last seen, so that a stub of
        # another model that died during this recovery is still found at the next look.
        self._stubs = {
            **{pid: k for pid, k in self._stubs.items() if k[0] != model},
            **now,
        }
        missing = self._missing(model, loading or config or {}, now) if loaded else 0
        if missing:  # a new stub died before it could be seen: a death like any other
            with self._lock:
                self.state.restarts[model] += missing
            self._event("stub_died", model=model, pids=[], missing=missing)
        healed = loaded and not missing
        if not healed:
            self._heal_tries[model] += 1
            waits = HEAL_RETRY_WAITS_S
            wait = waits[min(self._heal_tries[model], len(waits)) - 1]
            self._heal_due[model] = time.monotonic() + wait
            why = (
                "refused by signature verification"
                if refused
                else "reload failed"
                if not loaded
                else "instances missing after the reload"
            )
            with self._lock:
                self.state.unhealed[model] = why
            self._event("model_not_healed", model=model, reason=why, retry_in_s=wait)
            return
        self._heal_due.pop(model, None)
        self._heal_tries.pop(model, None)
        with self._lock:
            self.state.unhealed.pop(model, None)
            self.state.recovering[model] = time.monotonic()
        probes = deep_check(self.server.grpc_url, self.models, self.settings.check_timeout_s)
        with self._lock:
            self.state.last_probes = probes
            self.state.probes.update(p.model for p in probes)
            if all(p.ok for p in probes):
                self.state.recovering.pop(model, None)
                self.state.last_ok = time.monotonic()
        if all(p.ok for p in probes):
            self._event("recovered", model=model)

    def _watch_health(self) -> None:
        while not self._stop.wait(self.settings.check_every_s):
            if not self._check_health():
                return

    def _check_health(self) -> bool:
        """One deep check and its verdict; False once the server is given up (``exit``)."""
        settings = self.settings
        with self._lock:
            if self.state.draining or self.state.restarting:
                return True
        process = self.server.process
        code = None if process is None else process.poll()
        if code is not None:
            if settings.on_dead == "exit":
                return True  # the launcher exits with Triton's own status (`server.main`)
            return self._dead(f"tritonserver exited with {code}", silent=0.0)
        started = time.monotonic()
        # The counters are read beside the probes, not after them: a stopped server costs
        # one timeout in all.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="counters") as pool:
            reading = pool.submit(self._read_successes)
            probes = deep_check(self.server.grpc_url, self.models, settings.check_timeout_s)
            excused = self._shedding(probes, reading.result())
        now = time.monotonic()
        healthy = all(p.ok or p.model in excused for p in probes)
        # Answered through a fallback (the scoring model unloaded or failing): the server
        # serves, degraded -- alive and ready, never declared dead for it. Such an answer
        # says nothing of a model being reloaded, so it ends no recovery.
        serving = all(p.ok or p.model in excused or p.degraded for p in probes)
        with self._lock:
            state = self.state
            state.last_probes = probes
            state.probes.update(p.model for p in probes)
            state.ready = serving
            was_degraded = dict(state.degraded)
            state.degraded = {p.model: p.fallback_level for p in probes if p.degraded}
            if serving:
                state.last_ok = now
            if healthy:
                state.recovering = {m: t for m, t in state.recovering.items() if t > started}
            silent = now - state.last_ok
            # A reload in progress may take a while; one stuck for 30 s is a dead server.
            recovering = bool(state.recovering) and (
                now - state.recovery_started < RECOVERY_GRACE_S
            )
        if self.state.degraded != was_degraded:
            self._event("degraded" if self.state.degraded else "healthy", **self.state.degraded)
        if healthy:
            if settings.on_dead == "restart":  # only a restart loads them back
                self._remember_live()
            return True
        if serving:
            return True
        if silent < settings.dead_after_s or recovering:
            return True
        return self._dead("; ".join(p.line() for p in probes if not p.ok), silent=silent)

    def _remember_live(self) -> None:
        """Keep the configs `deploy` and `rollback` set live, for a restart to load back. A
        reading that fails keeps the last one: on a loaded host a read timed out now and
        then, and a crash just after it restarted the server with the file's routing."""
        live = {}
        for model in LIVE_MODELS:
            try:
                live[model] = model_config(
                    self.server.http_url, model, self.settings.check_timeout_s
                )
            except ModelControlError:  # not loaded, or no answer in time: the last reading
                if model in self._live:
                    live[model] = self._live[model]
        self._live = live

    def _restore_live(self) -> None:
        """Load back on a restarted server the live configs that differ from its files'
        (a canary's versions and routing), so a restart does not end a rollout."""
        url, key = self.server.http_url, self.server.admin_key
        for model, live in self._live.items():
            config = without_reload_mark(live)  # a stub's recovery is no deploy
            try:
                if without_reload_mark(model_config(url, model)) == config:
                    continue
                verified = self._verified_config(model, config)
                if verified != config:  # a version the restart refused stays out
                    self._event("live_config_restore_refused", model=model)
                    continue
                load_model(url, model, config, admin_key=key)
                self._event("live_config_restored", model=model)
            except ModelControlError as exc:
                self._event("live_config_restore_failed", model=model, error=str(exc))

    def _dead(self, reason: str, silent: float) -> bool:
        """Apply the policy to a dead server; False when the launcher gives it up."""
        self._event("server_dead", silent_s=round(silent, 1), reason=reason)
        settings = self.settings
        if settings.on_dead == "restart":
            now = time.monotonic()
            recent = [t for t in self._restarted_at if now - t < settings.restart_window_s]
            self._restarted_at = recent
            if len(recent) < settings.max_restarts:
                self._restarted_at.append(now)
                self._restart()
                return not self.dead.is_set()
            reason = (
                f"{reason} (given up: {len(recent)} restarts in the last "
                f"{settings.restart_window_s:.0f} s)"
            )
            self._event("restart_limit", restarts=len(recent))
        with self._lock:
            self.state.dead_reason = reason
        self.dead.set()
        return False

    def _read_successes(self) -> dict[str, float]:
        try:
            return triton_successes(self.server.metrics_url, self.settings.check_timeout_s)
        except OSError:
            return {}

    def _shedding(self, probes: list[Probe], successes: dict[str, float]) -> set[str]:
        """Entry points whose probe failed for want of capacity while they kept completing
        other requests since the last check: overloaded and shedding, not hung.

        A counter that went down was reset by a reload of the model (an ensemble is reloaded
        with the step whose stub died): what it counts since is the progress."""
        before, self._successes = self._successes, successes
        if not before:
            return set()  # the first reading: no progress to see yet

        def progressed(model: str) -> bool:
            now, then = successes.get(model, 0.0), before.get(model, 0.0)
            return now > then or 0.0 < now < then

        return {p.model for p in probes if not p.ok and p.busy and progressed(p.model)}

    def _restart(self) -> None:
        with self._lock:
            self.state.restarting = True
            self.state.ready = False
        try:
            start_again(self.server)  # stop, start; waits out ports the old one still holds
            self._restore_live()  # its reloads end stubs too: still inside `restarting`
        except Exception as exc:  # cannot come back: give up like `exit`
            with self._lock:
                self.state.dead_reason = f"restart failed: {exc}"
            self.dead.set()
            return
        finally:
            self._stubs = self._current_stubs()
            with self._lock:
                self.state.restarting = False
        with self._lock:
            self.state.server_restarts += 1
            self.state.last_ok = time.monotonic()
            self.state.recovering.clear()  # the old server's reloads: gone with it
            self.state.unhealed.clear()
        self._heal_due.clear()
        self._heal_tries.clear()
        self._stale.clear()
        self._unverified.clear()
        with self._lock:
            self.state.ready = True
        self._event("server_restarted")

    # -- HTTP -----------------------------------------------------------------------------
    def _serve_http(self) -> None:
        supervisor = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/livez":
                    ok = supervisor.live()
                    self._send(200 if ok else 503, b"live\n" if ok else b"dead\n", "text/plain")
                elif path == "/readyz":
                    ok = supervisor.ready()
                    body = b"ready\n" if ok else b"not ready\n"
                    self._send(200 if ok else 503, body, "text/plain")
                elif path == "/healthz":
                    snap = supervisor.snapshot()
                    code = 200 if snap["ready"] else 503
                    self._send(code, json.dumps(snap).encode(), "application/json")
                elif path == "/metrics":
                    self._send(200, supervisor.metrics_text().encode(), "text/plain; version=0.0.4")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(
            (self.settings.health_host, self.settings.health_port), Handler
        )
        self._http.daemon_threads = True
        thread = threading.Thread(target=self._http.serve_forever, name="health-http", daemon=True)
        thread.start()
