"""The launcher's watch over its Triton: stubs, a deep health check, drain on SIGTERM.

Triton 2.51 never restarts a Python-backend stub that dies (every request to that instance
then fails after about 1 s while `/v2/health/ready` stays 200), answers its health endpoints
while inference hangs, and fails in-flight ensemble requests when stopped. So the launcher:

- polls its server's stubs every ``poll_s`` (0.25 s): a stub that died marks the server
  not ready and its model is reloaded through the locked repository API (a load with the
  model's own config as an override forces Triton to build new instances); readiness
  returns when every entry point answers again. Restarts are counted (metric
  ``dispatch_launcher_stub_restarts_total``) and logged as JSON lines. Triton ends stubs
  itself too -- a version unloaded (``rollback --unload-canary``), a model reloaded with a
  new config (``deploy`` and ``rollback`` set the router's parameters that way; the new
  instances start before the old ones end) -- so a vanished stub counts as dead only while
  its version is still READY and fewer stubs than the model's instance count serve it
  (`stubs.stub_deaths`); the others are logged as ``stub_retired`` and left alone. Stubs that
  outlive the launcher's own reload are stale (2.51 never ends the replaced instances once
  one of their model's stubs died) and never count as serving; with the dead stubs 2.51
  never reaps, they are released by a clean restart at ``stub_leak_limit`` (or after
  ``stub_leak_max_age_s``: `StubHealing._leak_restart_reason`). A model whose instances are
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
  manager; ``restart``: stop and start it again with the configs `deploy` and `rollback`
  set live -- the scoring versions, the routing of the router and the in-process routing
  models -- as the last good check read them (a verified server starts from its files and
  loads them back, each checked), so a restart does not end a rollout;
  a crash after ready, whatever caused it, is restarted every time, and only a server that
  cannot start again, ``max_failed_starts`` times in a row, is given up).
  Under ``restart`` a Triton process that has exited, or was seen catching a crash signal
  (then SIGKILLed), is restarted within ``CRASH_POLL_S``, without that wait (2.51 aborts
  with ``boost::interprocess::lock_exception`` now and then when a stub is SIGKILLed while
  it holds a shared-memory lock, and dies of SIGSEGV under short client deadlines); under
  ``exit`` the launcher exits with Triton's status;
- serves the verdicts on its own HTTP port: ``/livez`` and ``/readyz`` (200 or 503),
  ``/healthz`` (JSON detail, the build) and ``/metrics`` (one prometheus_client registry);
- on SIGTERM turns readiness false, after ``drain_grace_s`` closes the entry points' gate (new
  windows refused UNAVAILABLE, `serving.drain`), waits until what was accepted is done
  (`drain_and_stop`), bounded by ``drain_timeout_s``, then stops Triton.

The stub watch is `stub_healing` (reading /proc through `stubs`), Triton's counters
`server_activity`, the HTTP endpoint `health_endpoint`; the settings and the state they share
`supervisor_state`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import urllib.error
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from aiohttp import web

from dispatch_service.ops.control_gate import ControlGate
from dispatch_service.ops.health import Probe, deep_check
from dispatch_service.ops.health_endpoint import HealthService, serve_health
from dispatch_service.ops.launcher_metrics import exposition, launcher_registry
from dispatch_service.ops.model_control import (
    ModelControlError,
    load_model,
    model_config,
    without_reload_mark,
)
from dispatch_service.ops.restart import start_again
from dispatch_service.ops.server_activity import drain_activity, triton_activity, triton_successes
from dispatch_service.ops.stub_healing import StubHealing
from dispatch_service.ops.supervisor_state import (
    SupervisedServer,
    SupervisorSettings,
    SupervisorState,
)
from dispatch_service.ops.verified_load import LoadVerifier
from dispatch_service.routing.settings import (
    IN_PROCESS_ROUTING_MODELS,
    ROUTER_MODEL_NAME,
    SCORING_MODEL_NAME,
)

__all__ = [
    "LIVE_MODELS",
    "RECOVERY_GRACE_S",
    "Supervisor",
]

logger = logging.getLogger(__name__)

RECOVERY_GRACE_S = 30.0

# Under ``restart``, how often the health watcher looks, between two deep checks, whether
# Triton's process exited or was seen catching a crash signal: a crashed server is started
# again within this, not up to a whole `check_every_s` later.
CRASH_POLL_S = 0.1

# What `dispatch-admin deploy` / `rollback` change live, in the order a restart loads them
# back: the scoring versions, then the router, then the in-process routing models (which
# route the same).
LIVE_MODELS = (SCORING_MODEL_NAME, ROUTER_MODEL_NAME, *IN_PROCESS_ROUTING_MODELS)


class Supervisor(StubHealing):
    """Watches one started TritonServer until stopped; see the module docstring."""

    def __init__(
        self,
        server: SupervisedServer,
        settings: SupervisorSettings | None = None,
        report: Callable[[str], None] = logger.warning,
        verifier: LoadVerifier | None = None,
        *,
        gate: ControlGate | None = None,
    ) -> None:
        self.server = server
        # The operators' control requests, served on the health port (`control_gate`).
        self.gate = gate
        self.settings = settings or SupervisorSettings()
        self.report = report
        # A verified server's: every reload and restored config is checked against the
        # files first (`verified_load.check_load`); None: the server does not verify.
        self.verifier = verifier
        self.models = server.required_models or ("dispatch",)
        self.state = SupervisorState(ready=True, last_ok=time.monotonic())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.dead = threading.Event()
        self._init_healing()
        self._successes: dict[str, float] = {}
        # Restarts in a row whose new server never became ready: only these count against
        # `max_failed_starts` (a crash after ready, however often traffic causes it, never
        # stops the service).
        self._failed_starts = 0
        self._live: dict[str, dict[str, Any]] = {}  # LIVE_MODELS' configs at the last good check
        self._threads: list[threading.Thread] = []
        self._http: HealthService | None = None
        # More Prometheus text for `/metrics` (each called per scrape), e.g. the launcher's
        # crash counter (`ops.restart.CrashCounter.metrics_text`).
        self.metric_sources: list[Callable[[], str]] = []
        # The one registry `/metrics` serves: the supervisor's series, the build, the text of
        # `metric_sources`; other parts register collectors of their own (the GPU monitor's).
        self.registry = launcher_registry(self.snapshot, self.models, self.metric_sources)
        # More routes for the health port (aiohttp route definitions), added before `start`.
        self.routes: list[web.AbstractRouteDef] = []
        # More fields for `/healthz` (each called per request), e.g. the fleet state served.
        self.detail_sources: dict[str, Callable[[], Any]] = {}
        # Whether the running server has been seen catching a crash signal (it may live on,
        # hung, for a while): not ready meanwhile (`restart.CrashCounter.current_crashed`).
        self.crash_seen: Callable[[], bool] = lambda: False
        # Told of each stub death, e.g. to log the next requests (`request_watch.RequestWatch.arm`).
        self.stub_died: Callable[[], None] = lambda: None

    # -- verdicts -------------------------------------------------------------------------
    def live(self) -> bool:
        with self._lock:
            return not self.state.dead_reason

    def ready(self) -> bool:
        """Ready as of the last checks, and every serving stub still running now."""
        with self._lock:
            ready = self._ready_locked()
        return ready and self._stubs_alive() and not self.crash_seen()

    def _ready_locked(self) -> bool:
        s = self.state
        return (
            s.ready and not s.draining and not s.recovering and not s.unhealed and not s.dead_reason
        )

    def snapshot(self) -> dict[str, Any]:
        stubs_alive = self._stubs_alive() and not self.crash_seen()
        # Outside the lock: a source may wait on a lock of its own (the fleet watcher's,
        # held while it applies a revision, a load that may take a minute), and a snapshot
        # holding this lock meanwhile stalled the drain (no ``drain_started`` after SIGTERM
        # for 60 s and more) and every readiness answer.
        details = {name: source() for name, source in self.detail_sources.items()}
        with self._lock:
            s = self.state
            ready = self._ready_locked() and stubs_alive
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
                "leaked_stubs": s.leaked_stubs,
                "leak_restarts": s.leak_restarts,
                **details,
            }

    def metrics_text(self) -> str:
        return exposition(self.registry)

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
        return self._http.url

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)
        if self._http is not None:
            self._http.stop()

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
        self._event("drain_started", timeout_s=self.settings.drain_timeout_s)
        with self._lock:
            self.state.draining = True
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
        self.server.stop(graceful=not (gated and quiet))
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

    # -- health watcher --------------------------------------------------------------------

    def _watch_health(self) -> None:
        while not self._wait_for_next_check():
            if not self._check_health():
                return

    def _wait_for_next_check(self) -> bool:
        """Wait ``check_every_s``, less when the server crashed under ``restart``
        (`_crashed`); True once the supervisor is stopped."""
        deadline = time.monotonic() + self.settings.check_every_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if self._stop.wait(min(left, CRASH_POLL_S)):
                return True
            if self.settings.on_dead == "restart" and self._crashed():
                return False

    def _crashed(self) -> bool:
        """Whether Triton's process has exited, or caught a crash signal (2.51 may then hang
        alive: `restart.CrashCounter`), and is not being restarted already."""
        with self._lock:
            if self.state.restarting or self.state.draining:
                return False
        process = self.server.process
        return process is not None and (process.poll() is not None or self.crash_seen())

    def _check_health(self) -> bool:
        """One deep check and its verdict; False once the server is given up (``exit``)."""
        settings = self.settings
        with self._lock:
            if self.state.draining or self.state.restarting:
                return True
        leak = self._leak_restart_reason()
        if leak is not None:
            return self._restart_for_leaks(leak)
        process = self.server.process
        code = None if process is None else process.poll()
        if code is not None:
            if settings.on_dead == "exit":
                return True  # the launcher exits with Triton's own status (`server_cli.main`)
            return self._dead(f"tritonserver exited with {code}", silent=0.0)
        if process is None and settings.on_dead == "restart":
            # The last restart's start failed (`_restart` stopped what it began): try again.
            return self._dead("tritonserver not running (the last start failed)", silent=0.0)
        if settings.on_dead == "restart" and self.crash_seen():
            # It caught a crash signal and may hang alive (or take seconds to exit): no deep
            # check can pass, and nothing is left to finish. Killed at once.
            return self._dead("tritonserver caught a crash signal", silent=0.0, kill=True)
        started = time.monotonic()
        # The counters are read beside the probes, not after them: a stopped server costs
        # one timeout in all.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="counters") as pool:
            reading = pool.submit(self._read_successes)
            probes = deep_check(
                self.server.grpc_url,
                self.models,
                settings.check_timeout_s,
                self.server.priority_key,
            )
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

    def _live_at_start(self) -> dict[str, dict[str, Any]]:
        """The live configs a restart starts its models with (`_restore_live` then finds
        them served and loads nothing): all of them on a server that does not verify; none
        on one that does, where each is checked against the files as it is loaded back."""
        if self.verifier is not None:
            return {}
        return {model: without_reload_mark(live) for model, live in self._live.items()}

    def _restore_live(self) -> None:
        """Load back on a restarted server the live configs that differ from its files'
        (a canary's versions and routing), so a restart does not end a rollout."""
        url, key = self.server.http_url, self.server.admin_key
        pending = set(getattr(self.server, "instances_pending", ()))
        for model, live in self._live.items():
            config = without_reload_mark(live)  # a stub's recovery is no deploy
            try:
                served = without_reload_mark(model_config(url, model))
                if model in pending:  # on its first instance: the others come after
                    config = {**config, "instance_group": served.get("instance_group")}
                if served == config:
                    continue
                verified = self._verified_config(model, config)
                if verified != config:  # a version the restart refused stays out
                    self._event("live_config_restore_refused", model=model)
                    continue
                load_model(url, model, config, admin_key=key)
                self._event("live_config_restored", model=model)
            except ModelControlError as exc:
                self._event("live_config_restore_failed", model=model, error=str(exc))

    def _dead(self, reason: str, silent: float, *, kill: bool = False) -> bool:
        """Apply the policy to a dead server; False when the launcher gives it up: under
        ``exit`` at once, under ``restart`` only after `max_failed_starts` restarts in a row
        whose server never became ready (`_restart`; ``kill``: a crashed server, stopped
        with SIGKILL)."""
        self._event("server_dead", silent_s=round(silent, 1), reason=reason)
        if self.settings.on_dead == "restart":
            self._restart(kill=kill)
            return not self.dead.is_set()
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

    def _restart(self, *, kill: bool = False) -> None:
        """Stop the server (``kill``: SIGKILL at once) and start it again, then load back the
        live configs. A start that fails leaves the server stopped and not ready (the next
        check tries again, after `failed_start_wait_s`); after `max_failed_starts` in a row
        the launcher gives up: a server that cannot start is for the process manager's
        back-off and a person. A start that reaches ready clears that count, so crashes
        caused by traffic, however many, never stop the service."""
        with self._lock:
            self.state.restarting = True
            self.state.ready = False
        failed: Exception | None = None
        try:
            # Stop, start; waits out ports the old one still holds.
            # On one instance a model: ready in about half the CPU; the stub watch adds the
            # others once it serves (`StubHealing._add_pending_instances`). After a start
            # that failed, every instance: a client killing stubs as it starts (a wrapped
            # shape) fails a start on one instance a model, not one on all of them.
            quick = getattr(self.server, "start_first_instances", None)
            start = None
            if quick is not None and self._failed_starts == 0:
                # Started with the live configs: loaded back once ready instead, each
                # started new stubs before the server said ready again (2-3 s).
                start = partial(quick, live=self._live_at_start())
            start_again(self.server, graceful=not kill, start=start)
            self._restore_live()  # its reloads end stubs too: still inside `restarting`
        except Exception as exc:
            failed = exc
            with contextlib.suppress(Exception):
                self.server.stop()  # what the failed start left (`start` stops on most)
        finally:
            self._stubs = self._current_stubs()
            with self._lock:
                self.state.restarting = False
        if failed is not None:
            self._start_failed(failed)
            return
        self._failed_starts = 0
        with self._lock:
            self.state.server_restarts += 1
            self.state.last_ok = time.monotonic()
            self.state.recovering.clear()  # the old server's reloads: gone with it
            self.state.unhealed.clear()
        self._reset_healing()
        with self._lock:
            self.state.ready = True
        self._event("server_restarted")

    def _restart_for_leaks(self, reason: str) -> bool:
        """Restart a server that holds too many dead or stale stubs (`_leak_restart_reason`):
        not ready first, for ``drain_grace_s``, so a load balancer moves away before the stop."""
        self._event("server_restart_for_leaks", reason=reason)
        with self._lock:
            self.state.ready = False
            self.state.leak_restarts += 1
        self._stop.wait(self.settings.drain_grace_s)
        self._restart()
        return not self.dead.is_set()

    def _start_failed(self, exc: Exception) -> None:
        self._failed_starts += 1
        limit = self.settings.max_failed_starts
        if self._failed_starts < limit:
            wait = self.settings.failed_start_wait_s
            self._event(
                "restart_failed",
                error=str(exc)[-2000:],
                failed_starts=self._failed_starts,
                retry_in_s=wait,
            )
            self._stop.wait(wait)
            return
        self._event("restart_limit", failed_starts=self._failed_starts, error=str(exc)[-2000:])
        with self._lock:
            self.state.dead_reason = (
                f"restart failed {self._failed_starts} times in a row (given up): {exc}"
            )
        self.dead.set()

    # -- HTTP -----------------------------------------------------------------------------
    def _serve_http(self) -> None:
        self._http = serve_health(
            self,
            self.settings.health_host,
            self.settings.health_port,
            self.gate,
            registry=self.registry,
            extra_routes=self.routes,
        )
