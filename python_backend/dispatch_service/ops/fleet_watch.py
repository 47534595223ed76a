"""Each launcher's watch over the fleet's state store: converge to the signed document.

The launcher (``--state-store DIR`` or ``DISPATCH_STATE_STORE``) reads the store's document
(`fleet_state`) every ``poll_s`` (0.25 s) and, when its bytes changed, verifies it with the
launcher's trusted keys and applies it through its own server's repository API
(`fleet_apply.switch_state`: the versions it names loaded, then its routing written to the
file every entry point reads, `routing.live`).
From then on the replica reports the new revision; the versions the document no longer
names, which no request reaches any more, are unloaded after that (`retire_versions`). The
first document is applied before the launcher reports ready, so a replica that starts or
restarts after a change serves it from its first answer.

A document that cannot be applied -- unreadable, unsigned, signed by an unknown key, changed
after signing, breaking a rule, older than the revision served, naming a version whose files
do not verify -- is refused: the replica keeps the last good revision, says so in `detail`
(``/healthz`` field ``fleet_state``) and on ``/metrics``, and never tries the same bytes
again. A server that refuses a load or cannot be reached is tried again after `RETRY_WAITS_S`,
then left until the document changes. A restarted server (``--on-dead restart``) gets the
served revision again: a new Triton starts from the files.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dispatch_service.core.signing import TrustedKeys
from dispatch_service.ops.fleet_apply import (
    ApplyRefusedError,
    Switch,
    retire_versions,
    switch_state,
)
from dispatch_service.ops.fleet_state import (
    STATE_STORE_ENV,
    FleetState,
    ReplicaReport,
    SignedState,
    StateError,
    StateStore,
    claimed_revision,
    verify_state,
)
from dispatch_service.ops.model_control import ModelControlError
from dispatch_service.ops.supervisor import Supervisor
from dispatch_service.ops.verified_load import LoadVerifier
from dispatch_service.routing.live import read_entry_points

__all__ = [
    "REGISTER_EVERY_S",
    "RETRIED_REFUSALS",
    "RETRY_WAITS_S",
    "FleetWatcher",
    "add_arguments",
    "watcher_from_args",
]

logger = logging.getLogger(__name__)

# A server that refused a load or did not answer: the same document is tried again after
# these waits, then left alone until the document changes or the server restarts.
RETRY_WAITS_S: Final = (2.0, 5.0, 15.0)
REGISTER_EVERY_S: Final = 2.0
# Refusals whose cause lies outside the document (a server that failed every try, a
# version's files that did not verify): the same bytes are tried again (`_refuse`).
RETRIED_REFUSALS: Final = frozenset({"apply_failed", "version_refused"})
# From a routing change to the unload of the versions it left: longer than any `execute` that
# read the routing before the change takes (a router call's own timeout is 2 s at most by
# default; those calls fall back to the stable version if the unload still catches one).
RETIRE_GRACE_S: Final = 1.0


@dataclass
class _Refusal:
    document: str
    digest: str  # sha256 of the refused file's bytes
    reason: str
    code: str
    revision: int | None
    at: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class _WatchState:
    applied: SignedState | None = None
    status: str = "no_document"
    refused: _Refusal | None = None
    applies: int = 0
    refusals: int = 0
    last_change: float = 0.0


class FleetWatcher:
    """Polls one store and applies its document to one server; see the module docstring."""

    def __init__(
        self,
        store: StateStore,
        http_url: str,
        admin_key: str | None,
        trusted: TrustedKeys | None,
        *,
        routing_file: Path,
        verifier: LoadVerifier | None = None,
        poll_s: float = 0.25,
        profile: str = "cpu",
        report: Callable[[str], None] = logger.warning,
    ) -> None:
        self.store = store
        self.http_url = http_url
        self.admin_key = admin_key
        self.trusted = trusted
        self.routing_file = routing_file
        self.verifier = verifier
        self.poll_s = poll_s
        self.profile = profile  # the configs the server selects (a model loaded anew)
        self.report = report
        self.state = _WatchState()
        self.replica = ""  # set by `attach`: its id in the store's replicas folder
        self.health_url = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: str | None = None  # digest of the bytes last looked at
        self._retry_at: float | None = None
        self._retries = 0
        self._restarts: Callable[[], int] = lambda: 0
        self._paused: Callable[[], bool] = lambda: False
        self._restarts_seen = 0
        self._reapply = False  # the server restarted: apply the served revision again
        self._registered_at = 0.0
        self._register_failed = False

    # -- one pass -------------------------------------------------------------------------
    def poll(self) -> None:
        """Look at the store once; apply what changed (or what is due again)."""
        if self._paused():
            return
        restarts = self._restarts()
        if restarts != self._restarts_seen:  # a new Triton starts from the files
            self._restarts_seen = restarts
            self._reapply = self.state.applied is not None
            self._retry_at, self._retries = None, 0
            refused = self.state.refused
            if refused is not None and refused.code in RETRIED_REFUSALS:
                self._seen = None  # its cause may have been the old server: try it again
        if self._reapply and not self._apply_again():
            return
        try:
            data = self.store.read()
        except StateError as exc:  # not a regular file, or too large: refused unread
            self._refuse_unread(exc)
            return
        except OSError as exc:
            data = None
            self._event("fleet_state_unreadable", error=str(exc))
        digest = "" if data is None else hashlib.sha256(data).hexdigest()
        due = self._retry_at is not None and time.monotonic() >= self._retry_at
        if data is None:
            if self._seen != "":
                self._seen = ""
                with self._lock:
                    if self.state.applied is None:
                        self.state.status = "no_document"
            return
        if digest == self._seen and not due:
            return
        self._seen = digest
        self._consider(data, digest)

    def _refuse_unread(self, error: StateError) -> None:
        """A document refused before a byte was read; reported once per file seen."""
        try:
            status = os.stat(self.store.document)
            seen = f"unread:{status.st_dev}:{status.st_ino}:{status.st_size}:{status.st_mtime_ns}"
        except OSError:
            seen = f"unread:{error}"
        if seen == self._seen:
            return
        self._seen = seen
        self._refuse(seen, None, str(error), error.code)

    def _apply_again(self) -> bool:
        """Apply the served revision to a restarted server (whatever the store holds now:
        a refused document there does not undo the last good one); False while it fails."""
        applied = self.state.applied
        if applied is None:
            self._reapply = False
            return True
        if self._retry_at is not None and time.monotonic() < self._retry_at:
            return False
        try:
            switch = self._switch(applied.state)
        except (ApplyRefusedError, ModelControlError) as exc:
            self._retry_at = time.monotonic() + RETRY_WAITS_S[-1]
            self._event(
                "fleet_state_reapply_failed", revision=applied.state.revision, error=str(exc)
            )
            return False
        self._reapply, self._retry_at = False, None
        self._event("fleet_state_reapplied", revision=applied.state.revision)
        self._retire(switch, applied.state.revision)
        return True

    def _consider(self, data: bytes, digest: str) -> None:
        if self.trusted is None:
            self._refuse(
                digest,
                None,
                "the launcher has no trusted keys (--trusted-keys) to verify the document",
                "unverifiable",
            )
            return
        try:
            signed = verify_state(data, self.trusted)
        except StateError as exc:
            self._refuse(digest, claimed_revision(data), str(exc), exc.code)
            return
        applied = self.state.applied
        if applied is not None and signed.digest == applied.digest:
            self._retry_at = None
            with self._lock:
                self.state.status, self.state.refused = "current", None
            return
        if applied is not None and signed.state.revision <= applied.state.revision:
            self._refuse(
                digest,
                signed.state.revision,
                f"revision {signed.state.revision} is not newer than the served revision "
                f"{applied.state.revision}",
                "stale_revision",
            )
            return
        with self._lock:
            self.state.status = "applying"
        started = time.monotonic()
        try:
            switch = self._switch(signed.state)
        except ApplyRefusedError as exc:
            self._refuse(digest, signed.state.revision, str(exc), exc.code)
            return
        except ModelControlError as exc:
            self._failed(digest, signed.state.revision, str(exc))
            return
        self._retry_at, self._retries = None, 0
        with self._lock:
            self.state.applied = signed
            self.state.status = "current"
            self.state.refused = None
            self.state.applies += 1
            self.state.last_change = time.time()
        self._event(
            "fleet_state_applied",
            revision=signed.state.revision,
            digest=signed.short,
            changed=switch.changed,
            note=signed.state.note,
            seconds=round(time.monotonic() - started, 3),
            phases_s=switch.seconds,
        )
        self._register(force=True)
        self._retire(switch, signed.state.revision)

    def _switch(self, state: FleetState) -> Switch:
        return switch_state(
            self.http_url,
            self.admin_key,
            state,
            self.verifier,
            routing_file=self.routing_file,
            profile=self.profile,
        )

    def _retire(self, switch: Switch, revision: int) -> None:
        """Unload what the served revision no longer names, once an `execute` that read the
        routing before the change has had time to end; a failure is reported, not retried
        (the next revision applied unloads it)."""
        if switch.retire is not None and self._stop.wait(RETIRE_GRACE_S):
            return
        try:
            seconds = retire_versions(self.http_url, self.admin_key, switch)
        except ModelControlError as exc:
            self._event("fleet_state_retire_failed", revision=revision, error=str(exc))
            return
        if seconds:
            self._event("fleet_state_retired", revision=revision, seconds=seconds)

    def _refuse(self, digest: str, revision: int | None, reason: str, code: str) -> None:
        """Keep the last good revision and say why. A refusal whose cause lies outside the
        document (`RETRIED_REFUSALS`) is tried again every `RETRY_WAITS_S`[-1] and at once
        after a server restart, reported once while it lasts."""
        retried = code in RETRIED_REFUSALS
        self._retry_at = time.monotonic() + RETRY_WAITS_S[-1] if retried else None
        known = self.state.refused
        if retried and known is not None and (known.digest, known.code) == (digest, code):
            with self._lock:
                self.state.status = "refused"  # tried again, refused again: said once
            return
        refusal = _Refusal(str(self.store.document), digest, reason, code, revision, time.time())
        with self._lock:
            self.state.refused = refusal
            self.state.refusals += 1
            self.state.status = "refused"
        self._event("fleet_state_refused", **refusal.to_dict(), kept=self._served_revision())
        self._register(force=True)

    def _failed(self, digest: str, revision: int, reason: str) -> None:
        """A server call failed: try the same document again after a bounded backoff."""
        if self._retries < len(RETRY_WAITS_S):
            wait = RETRY_WAITS_S[self._retries]
            self._retries += 1
            self._retry_at = time.monotonic() + wait
            with self._lock:
                self.state.status = "retrying"
            self._event(
                "fleet_state_apply_failed", revision=revision, error=reason, retry_in_s=wait
            )
            return
        self._refuse(
            digest,
            revision,
            f"applying failed {len(RETRY_WAITS_S) + 1} times: {reason}",
            "apply_failed",
        )

    def _served_revision(self) -> int | None:
        applied = self.state.applied
        return None if applied is None else applied.state.revision

    def _event(self, event: str, **fields: Any) -> None:
        self.report(json.dumps({"event": event, **fields}, sort_keys=True))

    # -- the replica's report -------------------------------------------------------------
    def detail(self) -> dict[str, Any]:
        """The ``fleet_state`` field of ``/healthz``."""
        entry_points = read_entry_points(self.routing_file)
        with self._lock:
            s = self.state
            applied = s.applied
            return {
                "store": str(self.store.path),
                "replica": self.replica,
                "status": s.status,
                "revision": None if applied is None else applied.state.revision,
                "digest": "" if applied is None else applied.short,
                "note": "" if applied is None else applied.state.note,
                "refused": None if s.refused is None else s.refused.to_dict(),
                "applies": s.applies,
                "refusals": s.refusals,
                "entry_points": entry_points,
            }

    def metrics_text(self) -> str:
        detail = self.detail()
        revision = detail["revision"]
        lines = [
            "# HELP dispatch_launcher_fleet_state_revision The fleet state revision this "
            "replica serves (-1: none applied: the initial routing).",
            "# TYPE dispatch_launcher_fleet_state_revision gauge",
            f"dispatch_launcher_fleet_state_revision {-1 if revision is None else revision}",
            "# HELP dispatch_launcher_fleet_state_refused 1 while the store's document is "
            "refused here (the last good revision keeps serving).",
            "# TYPE dispatch_launcher_fleet_state_refused gauge",
        ]
        refused = detail["refused"]
        if refused is None:
            lines.append("dispatch_launcher_fleet_state_refused 0")
        else:
            rev = "" if refused["revision"] is None else refused["revision"]
            lines.append(
                f'dispatch_launcher_fleet_state_refused{{document="{_label(refused["document"])}",'
                f'reason="{refused["code"]}",revision="{rev}"}} 1'
            )
        lines += [
            "# HELP dispatch_launcher_fleet_state_applies_total Fleet state revisions applied.",
            "# TYPE dispatch_launcher_fleet_state_applies_total counter",
            f"dispatch_launcher_fleet_state_applies_total {detail['applies']}",
            "# HELP dispatch_launcher_fleet_state_refusals_total Fleet state documents refused.",
            "# TYPE dispatch_launcher_fleet_state_refusals_total counter",
            f"dispatch_launcher_fleet_state_refusals_total {detail['refusals']}",
        ]
        return "\n".join(lines) + "\n"

    def _register(self, force: bool = False) -> None:
        """Write this replica's report into the store (where it is writable)."""
        if not self.replica or self._register_failed:
            return
        if not force and time.monotonic() - self._registered_at < REGISTER_EVERY_S:
            return
        detail = self.detail()
        report = ReplicaReport(
            replica=self.replica,
            health_url=self.health_url,
            revision=detail["revision"],
            digest=detail["digest"],
            status=detail["status"],
            seen=time.time(),
            refused=detail["refused"],
        )
        try:
            self.store.register(report)
        except (OSError, StateError) as exc:  # a read-only store (a ConfigMap): status --replica
            self._register_failed = True
            self._event("fleet_replica_not_registered", replica=self.replica, error=str(exc))
        self._registered_at = time.monotonic()

    # -- lifecycle ------------------------------------------------------------------------
    def follow(self, supervisor: Supervisor) -> FleetWatcher:
        """Report through the launcher's health endpoint (``/healthz`` field ``fleet_state``,
        ``/metrics``), register under its address, pause while it restarts or drains the
        server and apply the served revision again once it restarted one; then start."""
        self.health_url = supervisor.health_url
        port = self.health_url.rsplit(":", 1)[-1]
        self.replica = f"{socket.gethostname()}:{port}"
        state = supervisor.state
        self._restarts = lambda: state.server_restarts
        self._restarts_seen = state.server_restarts
        self._paused = lambda: state.restarting or state.draining
        supervisor.metric_sources.append(self.metrics_text)
        supervisor.detail_sources["fleet_state"] = self.detail
        return self.start()

    def start(self) -> FleetWatcher:
        self._register(force=True)
        self._thread = threading.Thread(target=self._run, name="fleet-watch", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
                self._register()
            except Exception as exc:  # the watch never dies: what failed is logged
                self._event("fleet_watch_error", error=f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        """Stop watching; a replica that stops cleanly leaves the store's list."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.replica and not self._register_failed:
            self.store.unregister(self.replica)


def _label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-store",
        type=Path,
        default=os.environ.get(STATE_STORE_ENV) or None,
        help="folder of the fleet's signed state (fleet-state.json): apply it before ready "
        f"and every change after (env {STATE_STORE_ENV}); without --trusted-keys every "
        "document is refused",
    )


def watcher_from_args(
    args: argparse.Namespace,
    http_url: str,
    admin_key: str | None,
    verifier: LoadVerifier | None,
    report: Callable[[str], None],
    *,
    routing_file: Path | None,
) -> FleetWatcher | None:
    """The launcher's watcher (None without ``--state-store``), its first pass done.
    ``routing_file``: the server's live routing (`TritonServer.routing_file`)."""
    if args.state_store is None:
        return None
    if routing_file is None:
        raise ValueError("a fleet replica's server needs a routing file (live_routing)")
    trusted = None if verifier is None else verifier.trusted
    watcher = FleetWatcher(
        StateStore(Path(args.state_store)),
        http_url,
        admin_key,
        trusted,
        routing_file=routing_file,
        verifier=verifier,
        profile=str(getattr(args, "profile", "cpu")),
        report=report,
    )
    watcher.poll()  # before ready: the current revision or its refusal
    return watcher
