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
  (`stub_deaths`); the others are logged as ``stub_retired`` and left alone;
- sends a small real window to each entry point every ``check_every_s`` with a short
  deadline (`health.deep_check`, at the highest priority level); a probe refused or timed
  out for want of capacity counts as answered while its entry point keeps completing other
  requests (Triton's success counters, read beside the probes): a server shedding load is
  alive, a hung one completes nothing. When no check succeeded for ``dead_after_s`` it is
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
- on SIGTERM turns readiness false, waits until Triton is quiet (nothing pending and no
  request completing over ``quiet_s``), bounded by ``drain_timeout_s``, then stops Triton.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
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
    "RECOVERY_GRACE_S",
    "RELOAD_RETRY_WAITS_S",
    "DeadPolicy",
    "SupervisedServer",
    "Supervisor",
    "SupervisorSettings",
    "instance_count",
    "stub_deaths",
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
        model_py = Path(argv[1].decode(errors="replace"))
        found[int(entry.name)] = (model_py.parent.parent.name, model_py.parent.name)
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
) -> dict[str, list[int]]:
    """model -> pids of the ``lost`` stubs that died rather than being ended by Triton.

    Triton ends a version's stubs when it unloads that version (then it is no longer READY)
    and the old instances' stubs when it reloads a model with a new config (then the new
    stubs already serve the version: as many as ``instances`` asks). A lost stub whose
    version is READY with fewer ``alive`` stubs than its model's instance count died.
    """
    deaths: dict[str, list[int]] = {}
    for pid, key in sorted(lost.items()):
        model = key[0]
        if key not in ready:
            continue  # unloaded (or unloading): Triton ended it
        serving = sum(1 for other in alive.values() if other == key)
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


class Supervisor:
    """Watches one started TritonServer until stopped; see the module docstring."""

    def __init__(
        self,
        server: SupervisedServer,
        settings: SupervisorSettings | None = None,
        report: Callable[[str], None] = logger.warning,
    ) -> None:
        self.server = server
        self.settings = settings or SupervisorSettings()
        self.report = report
        self.models = server.required_models or ("dispatch",)
        self.state = _State(ready=True, last_ok=time.monotonic())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.dead = threading.Event()
        self._stubs: dict[int, StubKey] = {}
        self._successes: dict[str, float] = {}
        self._restarted_at: list[float] = []  # monotonic times of the policy's restarts
        self._live: dict[str, dict[str, Any]] = {}  # LIVE_MODELS' configs at the last good check
        self._threads: list[threading.Thread] = []
        self._http: ThreadingHTTPServer | None = None

    # -- verdicts -------------------------------------------------------------------------
    def live(self) -> bool:
        with self._lock:
            return not self.state.dead_reason

    def ready(self) -> bool:
        with self._lock:
            s = self.state
            return s.ready and not s.draining and not s.recovering and not s.dead_reason

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            s = self.state
            return {
                "live": not s.dead_reason,
                "ready": s.ready and not s.draining and not s.recovering and not s.dead_reason,
                "draining": s.draining,
                "recovering": sorted(s.recovering),
                "dead_reason": s.dead_reason,
                "seconds_since_last_good_check": round(time.monotonic() - s.last_ok, 3),
                "entry_points": [
                    {"model": p.model, "ok": p.ok, "detail": p.detail, "ms": p.seconds * 1e3}
                    for p in s.last_probes
                ],
                "stub_restarts": dict(s.restarts),
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
        ]
        return "\n".join(lines) + "\n"

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
        """Readiness false, wait for quiet (bounded), stop Triton; returns seconds drained."""
        with self._lock:
            self.state.draining = True
        self._event("drain_started", timeout_s=self.settings.drain_timeout_s)
        start = time.monotonic()
        deadline = start + self.settings.drain_timeout_s
        quiet_since: float | None = None
        last_done = -1.0
        while time.monotonic() < deadline:
            try:
                pending, done = triton_activity(self.server.metrics_url)
            except (urllib.error.URLError, OSError, ValueError):
                break  # no metrics: nothing more to learn, stop as usual
            now = time.monotonic()
            if pending == 0 and done == last_done:
                quiet_since = quiet_since or now
                if now - quiet_since >= self.settings.quiet_s:
                    break
            else:
                quiet_since = None
            last_done = done
            time.sleep(0.1)
        drained = time.monotonic() - start
        self._event("drain_finished", seconds=round(drained, 3))
        self.stop()
        self.server.stop()
        return drained

    # -- watchers -------------------------------------------------------------------------
    def _current_stubs(self) -> dict[int, StubKey]:
        process = self.server.process
        return {} if process is None else stub_versions(process.pid)

    def _watch_stubs(self) -> None:
        while not self._stop.wait(self.settings.poll_s):
            self._check_stubs()

    def _check_stubs(self) -> None:
        """One look at the stubs: recover the models whose stubs died."""
        with self._lock:
            if self.state.draining or self.state.dead_reason or self.state.restarting:
                return  # stubs end with a stopping server and start with a new one
        process = self.server.process
        if process is None or process.poll() is not None:
            # Triton itself is gone (crashed or stopped) and its stubs with it: that is the
            # deep check's verdict to give, not a stub death per model to reload.
            self._stubs = {}
            return
        now = self._current_stubs()
        lost = {pid: key for pid, key in self._stubs.items() if pid not in now}
        self._stubs = now
        if not lost:
            return
        deaths = self._deaths(lost, now)
        retired = sorted(pid for pid in lost if not any(pid in d for d in deaths.values()))
        if retired:
            models = sorted({lost[pid][0] for pid in retired})
            self._event("stub_retired", models=models, pids=retired)
        for model, pids in sorted(deaths.items()):
            self._recover(model, pids)

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
        return stub_deaths(lost, now, ready, instances)

    def _recover(self, model: str, pids: list[int]) -> None:
        with self._lock:
            self.state.recovering[model] = float("inf")
            self.state.recovery_started = time.monotonic()
            self.state.restarts[model] += 1
        self._event("stub_died", model=model, pids=pids)
        url, key = self.server.http_url, self.server.admin_key
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
        config: dict[str, Any] | None = None
        unloaded = False
        for attempt, retry_in_s in enumerate((*RELOAD_RETRY_WAITS_S, None), start=1):
            try:
                if config is None:  # read once: an unloaded model has no config to read
                    config = model_config(url, model)
                if model == SCORING_MODEL_NAME:
                    if not unloaded:
                        unload_model(url, model, admin_key=key)
                        unloaded = True
                    load_model(url, model, config, admin_key=key)
                else:
                    load_model(url, model, with_reload_mark(config), admin_key=key)
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
                self._event("model_reloaded", model=model, attempt=attempt)
                break
        self._stubs = self._current_stubs()
        with self._lock:
            self.state.recovering[model] = time.monotonic()
        probes = deep_check(self.server.grpc_url, self.models, self.settings.check_timeout_s)
        with self._lock:
            self.state.last_probes = probes
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
        with self._lock:
            state = self.state
            state.last_probes = probes
            state.ready = healthy
            if healthy:
                state.last_ok = now
                state.recovering = {m: t for m, t in state.recovering.items() if t > started}
            silent = now - state.last_ok
            # A reload in progress may take a while; one stuck for 30 s is a dead server.
            recovering = bool(state.recovering) and (
                now - state.recovery_started < RECOVERY_GRACE_S
            )
        if healthy:
            if settings.on_dead == "restart":  # only a restart loads them back
                self._remember_live()
            return True
        if silent < settings.dead_after_s or recovering:
            return True
        return self._dead("; ".join(p.line() for p in probes if not p.ok), silent=silent)

    def _remember_live(self) -> None:
        """Keep the configs `deploy` and `rollback` set live, for a restart to load back."""
        live = {}
        for model in LIVE_MODELS:
            with contextlib.suppress(ModelControlError):  # not loaded: nothing to restore
                live[model] = model_config(
                    self.server.http_url, model, self.settings.check_timeout_s
                )
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
            self.server.stop(timeout_s=5)
            self.server.start()
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
