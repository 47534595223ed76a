"""The supervisor's watch over its server's Python-backend stubs: a stub that died is
healed by reloading its model, a model not healed keeps the server not ready and is tried
again, what deaths leave behind (dead and stale stubs) is released by a clean restart of the
server once there is too much of it, and on a verified server a stub running code that does
not verify is reported.

Triton 2.51 never restarts a stub that dies (every request to that instance then fails after
about 1 s while `/v2/health/ready` stays 200). `StubHealing` is a part of `Supervisor`
(`supervisor`), which runs `_watch_stubs` in a thread of its own and shares its state and
lock with it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dispatch_service.core.signing import verify_version
from dispatch_service.ops.health import deep_check
from dispatch_service.ops.host import proc_stat
from dispatch_service.ops.model_control import (
    ModelControlError,
    load_model,
    model_config,
    repository_index,
    unload_model,
    with_reload_mark,
    without_reload_mark,
)
from dispatch_service.ops.stubs import (
    StubKey,
    instance_count,
    stub_deaths,
    stub_model_files,
    stub_versions,
    zombie_stubs,
)
from dispatch_service.ops.supervisor_state import (
    SupervisedServer,
    SupervisorSettings,
    SupervisorState,
)
from dispatch_service.ops.verified_load import LoadVerifier, refusal_fields
from dispatch_service.routing.settings import SCORING_MODEL_NAME

__all__ = [
    "HEAL_RETRY_WAITS_S",
    "LEAK_QUIET_S",
    "RELOAD_RETRY_WAITS_S",
    "RELOAD_TIMEOUT_S",
    "UNVERIFIED_CODE",
    "StubHealing",
]

# A dead stub's reload that fails (a stub too slow to start on a busy machine, the repository
# API briefly refusing) is tried again after these waits; after the last, the deep check's
# verdict decides (dead after `dead_after_s`, past RECOVERY_GRACE_S).
RELOAD_RETRY_WAITS_S = (1.0, 3.0)

# A model still short of instances after those (a reload refused, failing, or a new stub dead
# again) stays not ready and is recovered again after these waits, the last repeated: bounded
# backoff, never given up while the server lives (the deep check still judges the server).
HEAL_RETRY_WAITS_S = (1.0, 2.0, 4.0, 8.0)

UNVERIFIED_CODE = "running code that does not verify"

# A server holding dead or stale stubs for `stub_leak_max_age_s` is restarted only once no
# stub has died for this long: not in the middle of what is killing them.
LEAK_QUIET_S = 10.0

# A reload's load request waits this long at most: 2.51 never finishes a load one of whose
# new stubs died while it started, and the watcher must not wait on it for minutes (the
# deep check declares the server dead after RECOVERY_GRACE_S meanwhile).
RELOAD_TIMEOUT_S = 60.0

# A restart's left-out instances (`_add_pending_instances`) that failed to load are tried
# again after this.
ADD_INSTANCES_RETRY_S = 5.0


class StubHealing:
    """Stub deaths found and healed; mixed into `Supervisor`, which sets the attributes
    annotated here and calls `_init_healing` before its threads start."""

    server: SupervisedServer
    settings: SupervisorSettings
    state: SupervisorState
    report: Callable[[str], None]
    verifier: LoadVerifier | None
    models: tuple[str, ...]
    _lock: threading.Lock
    _stop: threading.Event
    stub_died: Callable[[], None]

    def _init_healing(self) -> None:
        self._stubs: dict[int, StubKey] = {}
        self._stale: set[int] = set()  # old instances 2.51 left running after a reload
        self._unverified: dict[int, str] = {}  # stub pid -> model, running unverified code
        self._heal_due: dict[str, float] = {}  # model -> when to recover it again
        self._heal_tries: Counter[str] = Counter()
        self._leak_since: float | None = None  # when the server first held a dead stub
        self._last_death = float("-inf")
        self._instances_due = float("-inf")  # when to add a restart's left-out instances

    def _reset_healing(self) -> None:
        """A new server: the old one's heals, stale and unverified stubs went with it."""
        self._heal_due.clear()
        self._heal_tries.clear()
        self._stale.clear()
        self._unverified.clear()
        self._leak_since = None

    def _event(self, event: str, **fields: Any) -> None:
        self.report(json.dumps({"event": event, **fields}, sort_keys=True))

    def _current_stubs(self) -> dict[int, StubKey]:
        process = self.server.process
        return {} if process is None else stub_versions(process.pid)

    def _stubs_alive(self) -> bool:
        """Whether Triton and every stub that serves, as of the last look, still run: read
        at each readiness question, so a server or stub that died since the last check
        makes the server not ready at once (a dead stub is a zombie: Triton never reaps
        it). A crash at a burst's tail answered /readyz 200 for up to a second after it."""
        process = self.server.process
        if process is None:
            return True  # no server: its own verdicts say so
        if process.poll() is not None:
            return False
        stale = set(self._stale)
        for pid in list(self._stubs):
            if pid in stale:
                continue
            stat = proc_stat(Path("/proc") / str(pid))
            if stat is None or stat.state == "Z" or stat.parent != process.pid:
                return False
        return True

    def _leak_restart_reason(self) -> str | None:
        """Why the server must be restarted to release what stub deaths left, or None.
        2.51 keeps every dead stub as a zombie, never ends the replaced instances' stubs
        (stale: they serve nothing and keep their memory; 4 wrapped-shape requests took
        dispatch_fused from 4 stubs and 587 MiB to 16 and 2,327 MiB), nor an unload of
        their model (it stays UNLOADING), and keeps ~1.6 MB of its own memory per reload
        after a death, until it exits. Ending the stale stubs ourselves risks the abort
        2.51 makes when a stub dies holding a shared-memory lock. So at `stub_leak_limit`
        dead and stale stubs, or after `stub_leak_max_age_s` with none dying for
        LEAK_QUIET_S, a clean restart releases them all."""
        process = self.server.process
        if process is None or process.poll() is not None:
            return None
        leaked = len(zombie_stubs(process.pid)) + len(self._stale)
        with self._lock:
            self.state.leaked_stubs = leaked
        if not leaked:
            self._leak_since = None
            return None
        now = time.monotonic()
        self._leak_since = self._leak_since or now
        limit, max_age = self.settings.stub_leak_limit, self.settings.stub_leak_max_age_s
        if leaked >= limit:
            return f"{leaked} dead or stale stubs held by tritonserver (limit {limit})"
        age = now - self._leak_since
        if age >= max_age and now - self._last_death >= LEAK_QUIET_S:
            return (
                f"dead or stale stubs held by tritonserver for {age:.0f} s (limit {max_age:.0f} s)"
            )
        return None

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
        self._add_pending_instances()
        now = self._current_stubs()
        lost = {pid: key for pid, key in self._stubs.items() if pid not in now}
        started = set(now) - set(self._stubs)
        # A lost stub that is dead (a zombie: Triton never reaps one) stays watched until it
        # is judged below, so readiness reads it as dead meanwhile: dropped at once, /readyz
        # answered 200 while Triton was asked what it serves, before its model was marked
        # recovering, and a window sent then failed on the dead instance.
        dead = set(zombie_stubs(process.pid)) & set(lost) if lost else set()
        self._stubs = {**now, **{pid: lost[pid] for pid in dead}}
        self._check_code(started, now)
        deaths = self._deaths(lost, now) if lost else {}
        if deaths is None:
            # Triton does not say what it serves (a crashing or overloaded server): judge
            # these losses at the next look; the deep check judges the server meanwhile.
            self._stubs = {**lost, **now}
            return
        self._stale &= set(now)
        retired = sorted(pid for pid in lost if not any(pid in d for d in deaths.values()))
        for pid in retired:
            self._stubs.pop(pid, None)
        if retired:
            models = sorted({lost[pid][0] for pid in retired})
            self._event("stub_retired", models=models, pids=retired)
        if deaths:
            self.stub_died()
        for model, pids in sorted(deaths.items()):
            self._recover(model, pids)
        due = sorted(m for m, t in self._heal_due.items() if t <= time.monotonic())
        for model in due:
            if model not in deaths:
                self._recover(model, [])

    def _add_pending_instances(self) -> None:
        """Load the instances a restart's start left out (a `server.TritonServer`'s
        ``instances_pending``, by its ``add_instances``: one model a look) once the server
        is ready again: here, between two looks at the stubs, so a heal and these loads
        never overlap. A load that fails is tried again after `ADD_INSTANCES_RETRY_S`."""
        pending = getattr(self.server, "instances_pending", ())
        add_instances: Callable[[float], list[str]] | None
        add_instances = getattr(self.server, "add_instances", None)
        if not pending or add_instances is None or time.monotonic() < self._instances_due:
            return
        with self._lock:
            if not self.state.ready:
                return
        lines = add_instances(RELOAD_TIMEOUT_S)
        for line in lines:
            self.report(line)
        if any('"instances_not_added"' in line for line in lines):
            self._instances_due = time.monotonic() + ADD_INSTANCES_RETRY_S

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
        # Resolved: after a restart Triton reads the repository through links
        # (`first_instances.FirstInstanceRepository`).
        folder = model_py.parent.resolve()
        repository = self.verifier.served_repository.resolve()
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
            fields = refusal_fields(self.verifier.served_repository, verdict)
        self._unverified[pid] = model
        self._event("unverified_code_running", pid=pid, **fields)

    def _deaths(
        self, lost: dict[int, StubKey], now: dict[int, StubKey]
    ) -> dict[str, list[int]] | None:
        """`stub_deaths` with what Triton says now; None when it cannot say. A server dying
        of a crash loses its stubs while its process still runs: counted as deaths, they
        were reloaded into the restarted server on the same port (15 stub restarts counted
        after one short-deadline crash on a loaded host)."""
        url, key = self.server.http_url, self.server.admin_key
        timeout = self.settings.check_timeout_s
        try:
            ready = {
                (str(entry["name"]), str(entry["version"]))
                for entry in repository_index(url, key, timeout)
                if entry.get("state") == "READY" and "version" in entry
            }
        except ModelControlError:
            return None
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
        if pids:
            self._last_death = time.monotonic()
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
        probes = deep_check(
            self.server.grpc_url,
            self.models,
            self.settings.check_timeout_s,
            self.server.priority_key,
        )
        with self._lock:
            self.state.last_probes = probes
            self.state.probes.update(p.model for p in probes)
            if all(p.ok for p in probes):
                self.state.recovering.pop(model, None)
                self.state.last_ok = time.monotonic()
        if all(p.ok for p in probes):
            self._event("recovered", model=model)
