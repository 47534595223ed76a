"""The progressive rollout controller: one for the fleet, holding a lease, writing each step
as a signed fleet revision (`fleet_revisions`), judging each step on the outcomes in the
outcome store (`experiments.rollout.decide`).

Its own records live beside the fleet document, in ``<state store>/rollout/``:

- ``state.json``: the rollout (`RolloutState`), rewritten after every look, so a controller
  that restarts resumes at the same step with the same running intervals;
- ``lease.json``: which controller runs the loop (holder, expiry); `tick` acts only while
  it holds an unexpired lease, so two started at once never both step; renewed at every
  tick and given up when the controller exits (`rollout run`);
- ``published.json``: the last revision published where the replicas read it (Kubernetes'
  ConfigMap, `configmap_publish`), when the controller publishes;
- ``audit.jsonl``: one line per action that changed something (start, advance, promote,
  roll back, pause, resume, abort) with its reason, the fleet revision it wrote and the
  evidence at that moment (every metric's arms, interval and verdict).

All are written under an advisory lock of ``rollout/.lock`` and atomically replaced. A
change to the rollout (the operator's start, pause, resume and abort; the controller's step,
promotion or roll-back) is made under a second lock, ``rollout/.act``: the operator never
needs the lease, and a controller that judged a step writes it only if the rollout is still
what it judged (an abort in between wins).

Evidence: the outcomes of the decisions recorded since the step began (the server's clock)
and made at least the plan's maturity before the latest event the platform has reported (its
own clock: so that slow deliveries are in as well as fast ones; `mature_rows`), in the
plan's city (or every city), the treatment
arm scored by the rollout's version and the control arm by the stable version; per order
(`order_columns`): unassigned, delivery minutes from the order's creation, late (after the
promise), |predicted ETA - realised minutes from the decision|.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dispatch_contract.outcomes import OutcomeStatus
from dispatch_service.core.signing import TrustedKeys
from dispatch_service.experiments.analysis import METRIC_NAMES, ArmOutcomes
from dispatch_service.experiments.rollout import (
    Action,
    ActionKind,
    Phase,
    RolloutPlan,
    RolloutState,
    decide,
)
from dispatch_service.ops.configmap_publish import PublishError
from dispatch_service.ops.fleet_revisions import (
    Change,
    canary_share,
    deployed,
    promoted,
    rolled_back,
    write_revision,
)
from dispatch_service.ops.fleet_state import FleetState, StateError, StateStore
from dispatch_service.outcomes.store import JoinedRow, OutcomeStore

__all__ = [
    "DEFAULT_LEASE_S",
    "RolloutBook",
    "RolloutCollector",
    "RolloutController",
    "RolloutError",
    "arms",
    "mature_rows",
    "order_columns",
]

DEFAULT_LEASE_S: Final = 30.0
_BOOK: Final = "rollout"


class RolloutError(RuntimeError):
    """A rollout request refused (nothing written), or a controller without the lease."""


def _atomic_write(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def _where(state: RolloutState | None) -> tuple[Any, ...] | None:
    """What a step was judged at: the plan, phase, step and when the step began."""
    if state is None:
        return None
    return (state.plan, state.phase, state.step, state.step_started_at)


@contextlib.contextmanager
def _flocked(path: Path) -> Iterator[None]:
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class RolloutBook:
    """The controller's state, lease and audit trail in the fleet store's folder."""

    def __init__(self, store: StateStore, *, create: bool = True) -> None:
        """``create``: make the folder (a writer); a reader (`RolloutCollector`) finds no
        rollout where there is none, and never writes into a read-only store."""
        self.folder = Path(store.path) / _BOOK
        if create:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """One file write at a time (held for a write, never across another lock)."""
        with _flocked(self.folder / ".lock"):
            yield

    @contextlib.contextmanager
    def acting(self) -> Iterator[None]:
        """One change of the rollout at a time: read, decide and write under it (held across
        `locked` writes and the fleet revision; never nested)."""
        with _flocked(self.folder / ".act"):
            yield

    def claim(self, holder: str, *, now: float, lease_s: float) -> bool:
        """Take or renew the lease; False while another holder's lease runs."""
        path = self.folder / "lease.json"
        with self.locked():
            try:
                lease = json.loads(path.read_text())
            except (OSError, ValueError):
                lease = None
            if (
                isinstance(lease, dict)
                and lease.get("holder") != holder
                and float(lease.get("expires_at", 0)) > now
            ):
                return False
            _atomic_write(path, json.dumps({"holder": holder, "expires_at": now + lease_s}))
            return True

    def release(self, holder: str) -> None:
        path = self.folder / "lease.json"
        with self.locked(), contextlib.suppress(OSError, ValueError):
            if json.loads(path.read_text()).get("holder") == holder:
                path.unlink()

    def load(self) -> RolloutState | None:
        try:
            return RolloutState.from_dict(json.loads((self.folder / "state.json").read_text()))
        except FileNotFoundError:
            return None

    def save(self, state: RolloutState) -> None:
        with self.locked():
            _atomic_write(self.folder / "state.json", json.dumps(state.to_dict(), indent=1))

    def record(self, entry: dict[str, Any]) -> None:
        with self.locked(), (self.folder / "audit.jsonl").open("a") as out:
            out.write(json.dumps(entry, sort_keys=True) + "\n")

    def published(self) -> int | None:
        """The last revision published (`RolloutController.publish`)."""
        try:
            return int(json.loads((self.folder / "published.json").read_text())["revision"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def set_published(self, revision: int) -> None:
        with self.locked():
            _atomic_write(self.folder / "published.json", json.dumps({"revision": revision}))

    def lease(self) -> dict[str, Any] | None:
        try:
            lease = json.loads((self.folder / "lease.json").read_text())
        except (OSError, ValueError):
            return None
        return lease if isinstance(lease, dict) else None

    def audit(self) -> list[dict[str, Any]]:
        try:
            lines = (self.folder / "audit.jsonl").read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]


def mature_rows(rows: Sequence[JoinedRow], *, since: float, maturity_s: float) -> list[JoinedRow]:
    """The rows recorded at or after ``since`` (the server's clock) that are old enough for
    every outcome of their time to be in: decided at least ``maturity_s`` before the latest
    event the platform has reported (a pickup or a delivery: the platform's own clock, which
    is the decision times' clock too). Judging younger ones would count only the deliveries
    that were quick enough to be reported already."""
    events = [t for row in rows for t in (row.picked_up_at, row.delivered_at) if t is not None]
    if not events:
        return []
    mature = max(events) - maturity_s
    return [row for row in rows if row.recorded_at >= since and row.decided_at <= mature]


def arms(
    rows: Sequence[JoinedRow], *, city: str | None, treatment_version: int, control_version: int
) -> tuple[ArmOutcomes, ArmOutcomes]:
    """Treatment and control from ``rows``: the orders each version scored itself (fallback
    answers left out), in ``city`` or every city."""
    chosen = [r for r in rows if (city is None or r.city == city) and r.fallback_level <= 0]
    return (
        ArmOutcomes().add_columns(
            order_columns([r for r in chosen if r.model_version == treatment_version])
        ),
        ArmOutcomes().add_columns(
            order_columns([r for r in chosen if r.model_version == control_version])
        ),
    )


def order_columns(rows: Sequence[JoinedRow]) -> dict[str, np.ndarray[Any, Any]]:
    """Per order, the metrics `experiments.analysis` compares (NaN: does not apply)."""
    n = len(rows)
    columns = {name: np.full(n, np.nan) for name in METRIC_NAMES}
    for i, row in enumerate(rows):
        columns["unassigned"][i] = 1.0 if row.assigned_rider is None else 0.0
        if row.status is not OutcomeStatus.DELIVERED or row.delivered_at is None:
            continue
        minutes = (row.delivered_at - row.created_at) / 60.0
        columns["delivery_minutes"][i] = minutes
        columns["late"][i] = 1.0 if minutes > row.promised_minutes else 0.0
        if row.eta_minutes is not None:
            realised = (row.delivered_at - row.decided_at) / 60.0
            columns["eta_abs_error"][i] = abs(row.eta_minutes - realised)
    return columns


@dataclass
class RolloutController:
    """Starts, steps and stops a rollout; `tick` is one look (call it every few seconds)."""

    state_store: StateStore
    outcomes: OutcomeStore
    signer: Ed25519PrivateKey | None  # None: a controller that only reads, pauses, resumes
    trusted: TrustedKeys
    holder: str
    clock: Callable[[], float] = time.time
    lease_s: float = DEFAULT_LEASE_S
    known_version: Callable[[int], str | None] = lambda version: None
    # the state a first revision builds on when the store holds none (revision 0)
    initial: Callable[[], FleetState] | None = None
    # makes the stored document visible to the replicas where they do not read this folder
    # (Kubernetes: `configmap_publish`); called at each look while the stored revision is
    # not the last one published, so a failed publish is tried again
    publish: Callable[[StateStore], None] | None = None

    def __post_init__(self) -> None:
        self.book = RolloutBook(self.state_store)

    # -- requests from the operator ------------------------------------------------------

    def start(self, plan: RolloutPlan) -> RolloutState:
        """Write the first step's revision and the rollout's state; refused (nothing
        written) while another rollout runs or when the version cannot be served."""
        with self.book.acting():
            return self._start(plan, now=self.clock())

    def _start(self, plan: RolloutPlan, *, now: float) -> RolloutState:
        current = self.book.load()
        if current is not None and not current.phase.final:
            raise RolloutError(
                f"a rollout of version {current.plan.version} is {current.phase}: "
                "abort it first (dispatch-admin rollout abort)"
            )
        refusal = self.known_version(plan.version)
        if refusal is not None:
            raise RolloutError(f"version {plan.version}: {refusal}")
        where = f" in {plan.city}" if plan.city else ""
        revision = self._write(
            deployed(plan.version, plan.steps[0], plan.city),
            f"rollout of version {plan.version}{where}: step 1 at {plan.steps[0]}%",
        )
        state = RolloutState(plan, step_started_at=now)
        self.book.save(state)
        self._record(
            "start", f"step 1 at {plan.steps[0]}%", revision=revision, state=state, now=now
        )
        return state

    def pause(self) -> RolloutState:
        return self._set_phase(Phase.PAUSED, {Phase.RUNNING}, "pause")

    def resume(self) -> RolloutState:
        return self._set_phase(Phase.RUNNING, {Phase.PAUSED}, "resume")

    def abort(self, *, roll_back: bool = True) -> RolloutState:
        """Stop the rollout; by default every order back on the stable version."""
        with self.book.acting():
            return self._abort(roll_back=roll_back, now=self.clock())

    def _abort(self, *, roll_back: bool, now: float) -> RolloutState:
        state = self._running_or_paused()
        revision = None
        if roll_back:
            revision = self._write(
                rolled_back(state.plan.city), f"rollout of version {state.plan.version} aborted"
            )
        state = replace(state, phase=Phase.ABORTED)
        self.book.save(state)
        self._record("abort", "aborted by the operator", revision=revision, state=state, now=now)
        return state

    # -- the loop -------------------------------------------------------------------------

    def tick(self) -> Action | None:
        """One look: None without the lease, without a running rollout, or when the
        rollout changed while it was judged (the next look judges it again); else the
        action taken."""
        now = self.clock()
        if not self.book.claim(self.holder, now=now, lease_s=self.lease_s):
            return None
        self.publish_stored()
        state = self.book.load()
        if state is None or state.phase.final:
            return None
        treatment, control = self.evidence(state)  # slow on a large store: outside `acting`
        action, after = decide(state, now=now, treatment=treatment, control=control)
        with self.book.acting():
            if _where(self.book.load()) != _where(state):
                return None
            return self._act(action, after, now=now)

    def _act(self, action: Action, after: RolloutState, *, now: float) -> Action:
        revision = None
        plan = after.plan
        if action.kind is ActionKind.ADVANCE:
            assert action.percent is not None
            revision = self._write(
                canary_share(action.percent, plan.city),
                f"rollout of version {plan.version}: step {after.step + 1} at {action.percent}%"
                f" ({action.reason})",
            )
        elif action.kind is ActionKind.PROMOTE:
            revision = self._write(
                promoted(plan.city), f"rollout of version {plan.version} promoted: {action.reason}"
            )
        elif action.kind is ActionKind.ROLL_BACK:
            revision = self._write(
                rolled_back(plan.city),
                f"rollout of version {plan.version} rolled back: {action.reason}",
            )
        self.book.save(after)
        if revision is not None:
            self.publish_stored()
        if action.kind is not ActionKind.HOLD:
            self._record(
                str(action.kind),
                action.reason,
                revision=revision,
                state=after,
                now=now,
                evidence=list(action.evidence),
            )
        return action

    def run(self, *, interval_s: float, until: Callable[[], bool]) -> None:
        """Tick every ``interval_s`` until ``until()`` (or the rollout ends)."""
        while not until():
            self.tick()
            state = self.book.load()
            if state is not None and state.phase.final:
                return
            time.sleep(interval_s)

    def evidence(self, state: RolloutState) -> tuple[ArmOutcomes, ArmOutcomes]:
        """The step's arms from the outcome store: the decisions recorded since the step
        began whose outcomes must all be in (`mature_rows`)."""
        rows = mature_rows(
            self.outcomes.joined(since=state.step_started_at),
            since=state.step_started_at,
            maturity_s=state.plan.maturity_s,
        )
        return arms(
            rows,
            city=state.plan.city,
            treatment_version=state.plan.version,
            control_version=self._stable_version(state),
        )

    def publish_stored(self) -> None:
        """Publish the stored document if its revision is not the last one published; a
        failure is printed and tried again at the next look (the revision stays stored)."""
        if self.publish is None:
            return
        current = self.state_store.current(self.trusted)
        if current is None or current.state.revision == self.book.published():
            return
        try:
            self.publish(self.state_store)
        except PublishError as exc:
            print(f"publishing revision {current.state.revision} failed: {exc}", file=sys.stderr)
            return
        self.book.set_published(current.state.revision)

    # -- helpers ----------------------------------------------------------------------------

    def _stable_version(self, state: RolloutState) -> int:
        current = self.state_store.current(self.trusted)
        if current is None:
            raise RolloutError(f"no fleet document in {self.state_store.path}")
        return int(current.state.routing.for_city(state.plan.city).stable_version)

    def _running_or_paused(self) -> RolloutState:
        state = self.book.load()
        if state is None or state.phase.final:
            raise RolloutError("no rollout is running or paused")
        return state

    def _set_phase(self, phase: Phase, allowed: set[Phase], name: str) -> RolloutState:
        with self.book.acting():
            return self._set_phase_acting(phase, allowed, name, now=self.clock())

    def _set_phase_acting(
        self, phase: Phase, allowed: set[Phase], name: str, *, now: float
    ) -> RolloutState:
        state = self._running_or_paused()
        if state.phase not in allowed:
            raise RolloutError(f"the rollout is {state.phase}: cannot {name}")
        state = replace(state, phase=phase)
        self.book.save(state)
        self._record(name, f"{name} by the operator", revision=None, state=state, now=now)
        return state

    def _write(self, change: Change, note: str) -> int:
        if self.signer is None:
            raise RolloutError("writing a fleet revision needs the signing key")
        try:
            signed = write_revision(
                self.state_store, change, note, self.signer, trusted=self.trusted,
                initial=self.initial,
            )  # fmt: skip
        except StateError as exc:
            raise RolloutError(f"fleet revision refused: {exc}") from None
        return int(signed.state.revision)

    def _record(
        self,
        kind: str,
        reason: str,
        *,
        revision: int | None,
        state: RolloutState,
        now: float,
        evidence: list[dict[str, Any]] | None = None,
    ) -> None:
        self.book.record(
            {
                "at": now,
                "action": kind,
                "reason": reason,
                "revision": revision,
                "version": state.plan.version,
                "city": state.plan.city,
                "step": state.step + 1,
                "percent": state.percent,
                "phase": str(state.phase),
                "evidence": state.current_experiment().report() if evidence is None else evidence,
            }
        )


class RolloutCollector(Collector):
    """The rollout as every launcher of the fleet sees it in the shared store, read at each
    scrape: its phase, step, share and version, whether a controller holds the lease, and
    the actions taken so far (the audit trail, counted by kind)."""

    def __init__(self, book: RolloutBook, clock: Callable[[], float] = time.time) -> None:
        self.book, self.clock = book, clock

    def collect(self) -> Iterator[Metric]:
        try:
            state = self.book.load()
            audit = self.book.audit()
        except (OSError, ValueError, KeyError) as exc:
            del exc  # a half-written or foreign file: no series rather than a failed scrape
            return
        phase = GaugeMetricFamily(
            "dispatch_rollout_phase",
            "1 for the phase the fleet's rollout is in (none when there never was one).",
            labels=["phase"],
        )
        for each in Phase:
            phase.add_metric([str(each)], 1 if state is not None and state.phase is each else 0)
        yield phase
        if state is not None:
            gauges = (
                (
                    "dispatch_rollout_percent",
                    "The canary share of the rollout's step.",
                    state.percent,
                ),
                ("dispatch_rollout_step", "The rollout's step (1: the first).", state.step + 1),
                ("dispatch_rollout_version", "The version being rolled out.", state.plan.version),
            )
            for series, text, value in gauges:
                yield GaugeMetricFamily(series, text, value=value)
        lease = self.book.lease()
        active = lease is not None and float(lease.get("expires_at", 0)) > self.clock()
        yield GaugeMetricFamily(
            "dispatch_rollout_controller_active",
            "1 while a rollout controller holds an unexpired lease.",
            value=1 if active else 0,
        )
        actions = CounterMetricFamily(
            "dispatch_rollout_actions",
            "Rollout actions taken (the audit trail), by kind.",
            labels=["action"],
        )
        counts = Counter(str(entry.get("action")) for entry in audit)
        for kind in ("start", *map(str, ActionKind), "pause", "resume", "abort"):
            if kind != str(ActionKind.HOLD):
                actions.add_metric([kind], counts.get(kind, 0))
        yield actions
