"""The rollout controller against a real fleet store (a folder, signed revisions) and a real
outcome store (SQLite): each step a revision, a breach rolled back, a restart resumed, one
controller acting, bad requests refused with nothing written.

Outcomes are drawn with known differences between the versions; the expected routing after
each action is written out by hand."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatch_contract.outcomes import OutcomeStatus
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.core.signing import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    TrustedKeys,
    generate_private_key,
    private_key_pem,
)
from dispatch_service.experiments.rollout import ActionKind, Phase, RolloutPlan
from dispatch_service.ops import admin
from dispatch_service.ops.fleet_revisions import rolled_back, write_revision
from dispatch_service.ops.fleet_state import FleetState, StateStore
from dispatch_service.ops.rollout_controller import (
    RolloutBook,
    RolloutCollector,
    RolloutController,
    RolloutError,
    order_columns,
)
from dispatch_service.outcomes.records import DecisionRecord, Outcome
from dispatch_service.outcomes.sql_store import open_store
from dispatch_service.outcomes.store import OutcomeStore
from dispatch_service.routing.settings import RouterSettings

KEY = generate_private_key()
TRUSTED = TrustedKeys.from_public_keys(KEY.public_key())
PLAN = RolloutPlan(
    version=2, steps=(5, 50, 100), min_outcomes=300, min_seconds=60.0, maturity_s=30.0
)


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def fleet(tmp_path: Path) -> StateStore:
    store = StateStore(tmp_path / "fleet")
    store.path.mkdir(parents=True, exist_ok=True)
    first = FleetState(0, (1, 2), RouterSettings(stable_version=1), note="files")
    write_revision(store, rolled_back(), "start", KEY, trusted=TRUSTED, initial=lambda: first)
    return store


def controller(
    store: StateStore, outcomes: OutcomeStore, clock: Clock, holder: str = "a", **extra: object
) -> RolloutController:
    return RolloutController(
        store,
        outcomes,
        KEY,
        TRUSTED,
        holder,
        clock=clock,
        **extra,  # type: ignore[arg-type]
    )


def add_orders(
    outcomes: OutcomeStore,
    rng: np.random.Generator,
    *,
    version: int,
    n: int,
    at: float,
    late_share: float = 0.1,
    tag: str = "",
    decided: float | None = None,
) -> None:
    """``n`` delivered orders recorded at ``at`` (the server's clock) and decided at
    ``decided`` (the platform's clock; by default days before, as a live city's): 30
    minutes to deliver, promise 40 minutes, ``late_share`` of them delivered after the
    promise (at 50 minutes)."""
    records, reports = [], []
    recorded, at = at, at - 5 * 86_400 if decided is None else decided
    for i in range(n):
        late = rng.random() < late_share
        minutes = 50.0 if late else 30.0 + rng.normal(0, 3)
        request = f"r{version}{tag}-{at:.0f}-{i}"
        records.append(
            DecisionRecord(
                request_id=request, order_id="o", decided_at=at, entry_point="dispatch_fused",
                city="shanghai", routing_bucket=i % 100, model_version=version,
                fallback_level=0, assigned_rider="k", topk_riders=("k",), eta_minutes=30.0,
                ontime_probability=0.9, cost=5.0, created_at=at, promised_minutes=40.0,
                weights=(0.45, 0.35, 0.2),
            )
        )  # fmt: skip
        reports.append(
            Outcome(request, "o", OutcomeStatus.DELIVERED, at + 600, at + minutes * 60, None, "k")
        )
    outcomes.write_decisions(records, recorded_at=recorded)
    outcomes.write_outcomes(reports, received_at=recorded + 1)


def routing(store: StateStore) -> RouterSettings:
    current = store.current(TRUSTED)
    assert current is not None
    return current.state.routing


@pytest.fixture
def outcomes(tmp_path: Path) -> OutcomeStore:
    store = open_store(tmp_path / "outcomes.sqlite3")
    yield store  # type: ignore[misc]
    store.close()


def test_order_columns_by_hand(outcomes: OutcomeStore) -> None:
    add_orders(outcomes, np.random.default_rng(0), version=1, n=3, at=0.0, late_share=1.0)
    columns = order_columns(outcomes.joined())
    assert columns["delivery_minutes"].tolist() == [50.0, 50.0, 50.0]
    assert columns["late"].tolist() == [1.0, 1.0, 1.0]  # 50 minutes against a 40-minute promise
    assert columns["eta_abs_error"].tolist() == [20.0, 20.0, 20.0]  # 30 predicted, 50 taken
    assert columns["unassigned"].tolist() == [0.0, 0.0, 0.0]


def test_an_equal_version_is_stepped_up_and_promoted(
    tmp_path: Path, outcomes: OutcomeStore
) -> None:
    store, clock, rng = fleet(tmp_path), Clock(), np.random.default_rng(1)
    ctl = controller(store, outcomes, clock)
    ctl.start(PLAN)
    assert routing(store).canary_version == 2 and routing(store).canary_percent == 5
    kinds = []
    for _ in range(12):
        add_orders(outcomes, rng, version=2, n=1000, at=clock.now + 1)
        add_orders(outcomes, rng, version=1, n=1000, at=clock.now + 1)
        clock.now += 120
        action = ctl.tick()
        assert action is not None
        kinds.append(action.kind)
        if action.kind is ActionKind.PROMOTE:
            break
    # the last step waits for delivery minutes to be shown within their margin
    assert kinds[0] is ActionKind.ADVANCE and kinds[-1] is ActionKind.PROMOTE
    assert set(kinds[1:-1]) <= {ActionKind.HOLD}
    assert routing(store).stable_version == 2 and routing(store).canary_version == 0
    audit = ctl.book.audit()
    assert [entry["action"] for entry in audit] == ["start", "advance", "promote"]
    revisions = [entry["revision"] for entry in audit]
    assert revisions == sorted(revisions) and len(set(revisions)) == 3
    assert audit[1]["evidence"][0]["treatment"]["orders"] >= 300
    assert ctl.tick() is None  # over: nothing more to do


def test_a_worse_version_is_rolled_back_at_once(tmp_path: Path, outcomes: OutcomeStore) -> None:
    store, clock, rng = fleet(tmp_path), Clock(), np.random.default_rng(2)
    ctl = controller(store, outcomes, clock)
    ctl.start(PLAN)
    add_orders(outcomes, rng, version=2, n=1500, at=clock.now + 1, late_share=0.3)
    add_orders(outcomes, rng, version=1, n=1500, at=clock.now + 1)
    clock.now += 31  # the decisions mature, the step's minimum time not yet passed
    action = ctl.tick()
    assert action is not None and action.kind is ActionKind.ROLL_BACK
    assert "late worse by" in action.reason
    assert routing(store).canary_version == 0 and routing(store).stable_version == 1
    state = ctl.book.load()
    assert state is not None and state.phase is Phase.ROLLED_BACK
    assert ctl.book.audit()[-1]["action"] == "roll back"


def test_a_restarted_controller_resumes_at_the_same_step(
    tmp_path: Path, outcomes: OutcomeStore
) -> None:
    store, clock, rng = fleet(tmp_path), Clock(), np.random.default_rng(3)
    first = controller(store, outcomes, clock, holder="pod-1", lease_s=30.0)
    first.start(PLAN)
    add_orders(outcomes, rng, version=2, n=400, at=clock.now + 1)
    add_orders(outcomes, rng, version=1, n=400, at=clock.now + 1)
    clock.now += 120
    assert first.tick().kind is ActionKind.ADVANCE  # type: ignore[union-attr]
    # pod-1 dies; pod-2 waits out the lease, then carries on from step 2 at 50 %
    second = controller(store, outcomes, clock, holder="pod-2", lease_s=30.0)
    clock.now += 10
    assert second.tick() is None
    clock.now += 30
    action = second.tick()
    assert action is not None and action.kind is ActionKind.HOLD
    state = second.book.load()
    assert state is not None and (state.step, state.percent) == (1, 50)


def test_two_controllers_one_acts(tmp_path: Path, outcomes: OutcomeStore) -> None:
    store, clock = fleet(tmp_path), Clock()
    one = controller(store, outcomes, clock, holder="one")
    two = controller(store, outcomes, clock, holder="two")
    one.start(PLAN)
    with pytest.raises(RolloutError, match="is running: abort it first"):
        two.start(PLAN)
    assert one.tick() is not None and two.tick() is None
    assert one.book.lease()["holder"] == "one"  # type: ignore[index]


def test_the_operator_steers_while_a_controller_holds_the_lease(
    tmp_path: Path, outcomes: OutcomeStore
) -> None:
    store, clock = fleet(tmp_path), Clock()
    loop = controller(store, outcomes, clock, holder="loop")
    operator = controller(store, outcomes, clock, holder="operator")
    operator.start(PLAN)
    assert loop.tick() is not None  # the loop holds the lease from here on
    assert operator.pause().phase is Phase.PAUSED
    assert loop.tick().kind is ActionKind.HOLD  # type: ignore[union-attr]
    assert loop.book.load().phase is Phase.PAUSED  # type: ignore[union-attr]
    assert operator.resume().phase is Phase.RUNNING
    assert operator.abort().phase is Phase.ABORTED
    assert loop.tick() is None and routing(store).canary_version == 0
    assert loop.book.lease()["holder"] == "loop"  # type: ignore[index]


def test_an_abort_while_a_step_is_judged_wins(tmp_path: Path, outcomes: OutcomeStore) -> None:
    """The operator aborts after the controller read the rollout and before it wrote: the
    controller writes nothing (before, its look saved the running state over the abort)."""
    store, clock = fleet(tmp_path), Clock()
    loop = controller(store, outcomes, clock, holder="loop")
    operator = controller(store, outcomes, clock, holder="operator")
    operator.start(PLAN)
    judged = loop.evidence

    def abort_meanwhile(state: Any) -> Any:
        arms = judged(state)
        operator.abort()
        return arms

    loop.evidence = abort_meanwhile  # type: ignore[method-assign]
    assert loop.tick() is None
    state = loop.book.load()
    assert state is not None and state.phase is Phase.ABORTED
    assert routing(store).canary_version == 0
    assert [e["action"] for e in loop.book.audit()] == ["start", "abort"]


def test_a_controller_that_exits_gives_up_its_lease(
    tmp_path: Path, repo: Path, trusted_dir: Path, signer: Any
) -> None:
    key = key_file(tmp_path, signer)
    store = StateStore(tmp_path / "store")
    store.path.mkdir(parents=True)
    first = FleetState(0, (1, 2), RouterSettings(stable_version=1), note="files")
    trusted = TrustedKeys.from_public_keys(signer.public_key())
    write_revision(store, rolled_back(), "start", signer, trusted=trusted, initial=lambda: first)
    assert start_rollout(tmp_path, repo, trusted_dir, key, "--version", "2") == 0
    common = [
        "--state-store", str(tmp_path / "store"), "--trusted-keys", str(trusted_dir),
        "--key", str(key), "--model-repository", str(repo),
        "--outcome-store", str(tmp_path / "o.sqlite3"),
    ]  # fmt: skip
    book = RolloutBook(store, create=False)
    assert admin.main(["rollout", "run", "--once", "--holder", "loop", *common]) == 0
    assert book.lease() is None
    assert admin.main(["rollout", "abort", *common]) == 0


def test_refused_requests_write_nothing(tmp_path: Path, outcomes: OutcomeStore) -> None:
    store, clock = fleet(tmp_path), Clock()
    before = store.next_revision()
    unknown = controller(
        store, outcomes, clock, known_version=lambda v: "not in the model repository"
    )
    with pytest.raises(RolloutError, match="version 2: not in the model repository"):
        unknown.start(PLAN)
    stranger = generate_private_key()
    untrusted = RolloutController(store, outcomes, stranger, TRUSTED, "a", clock=clock)
    with pytest.raises(RolloutError, match="not among the trusted keys"):
        untrusted.start(PLAN)
    assert store.next_revision() == before
    assert unknown.book.load() is None


def test_pause_resume_abort(tmp_path: Path, outcomes: OutcomeStore) -> None:
    store, clock = fleet(tmp_path), Clock()
    ctl = controller(store, outcomes, clock)
    ctl.start(PLAN)
    assert ctl.pause().phase is Phase.PAUSED
    with pytest.raises(RolloutError, match="cannot pause"):
        ctl.pause()
    assert ctl.resume().phase is Phase.RUNNING
    assert ctl.abort().phase is Phase.ABORTED
    assert routing(store).canary_version == 0
    with pytest.raises(RolloutError, match="no rollout is running"):
        ctl.abort()
    assert [e["action"] for e in ctl.book.audit()] == ["start", "pause", "resume", "abort"]


def test_every_launcher_exports_the_rollout_it_sees(tmp_path: Path, outcomes: OutcomeStore) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    store, clock = fleet(tmp_path), Clock()
    ctl = controller(store, outcomes, clock, lease_s=30.0)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RolloutCollector(RolloutBook(store), clock=clock))

    def series() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        text = generate_latest(registry).decode()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    before = series()
    assert before[("dispatch_rollout_phase", (("phase", "running"),))] == 0
    assert ("dispatch_rollout_percent", ()) not in before
    ctl.start(PLAN)
    ctl.tick()  # the controller's loop holds the lease
    ctl.pause()
    now = series()
    assert now[("dispatch_rollout_phase", (("phase", "paused"),))] == 1
    assert now[("dispatch_rollout_percent", ())] == 5
    assert now[("dispatch_rollout_version", ())] == 2
    assert now[("dispatch_rollout_controller_active", ())] == 1
    assert now[("dispatch_rollout_actions_total", (("action", "start"),))] == 1
    assert now[("dispatch_rollout_actions_total", (("action", "pause"),))] == 1
    assert now[("dispatch_rollout_actions_total", (("action", "roll back"),))] == 0
    clock.now += 31  # the lease ran out: no controller acting
    assert series()[("dispatch_rollout_controller_active", ())] == 0


def test_decisions_too_young_for_their_outcomes_are_not_judged(
    tmp_path: Path, outcomes: OutcomeStore
) -> None:
    """A step's fast deliveries are reported before its slow ones: judged early, a version
    that makes deliveries slower would look no worse. A decision counts once the platform
    has reported events the plan's maturity (three hours by default) past it."""
    store, clock, rng = fleet(tmp_path), Clock(), np.random.default_rng(6)
    ctl = controller(store, outcomes, clock)
    plan = RolloutPlan(version=2, steps=(5, 50, 100), min_outcomes=300, min_seconds=60.0)
    assert plan.maturity_s == 3 * 3600
    ctl.start(plan)
    platform = 1_700_000_000.0
    add_orders(outcomes, rng, version=2, n=1500, at=clock.now + 1, late_share=0.3, decided=platform)
    add_orders(outcomes, rng, version=1, n=1500, at=clock.now + 1, decided=platform)
    clock.now += 120  # the latest event reported: 50 minutes after these decisions
    state = ctl.book.load()
    assert state is not None
    treatment, control = ctl.evidence(state)
    assert treatment.orders == control.orders == 0
    assert ctl.tick().kind is ActionKind.HOLD  # type: ignore[union-attr]
    # four hours on, on the platform's clock: the first decisions are judged
    add_orders(outcomes, rng, version=1, n=10, at=clock.now, decided=platform + 4 * 3600, tag="x")
    clock.now += 1
    treatment, control = ctl.evidence(state)
    assert (treatment.orders, control.orders) == (1500, 1500)
    assert ctl.tick().kind is ActionKind.ROLL_BACK  # type: ignore[union-attr]


def start_rollout(tmp_path: Path, repo: Path, trusted_dir: Path, key: Path, *argv: str) -> int:
    """`dispatch-admin rollout start` on a fresh store beside ``tmp_path``."""
    return admin.main(
        [
            "rollout", "start", "--state-store", str(tmp_path / "store"),
            "--trusted-keys", str(trusted_dir), "--key", str(key), "--model-repository", str(repo),
            "--outcome-store", str(tmp_path / "o.sqlite3"), *argv,
        ]
    )  # fmt: skip


def key_file(tmp_path: Path, key: Any) -> Path:
    path = tmp_path / "ops.key"
    path.write_bytes(private_key_pem(key))
    return path


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--version", "2", "--steps", "0,100"], 2, "whole percents in 1..100"),
        (["--version", "2", "--steps", "5,200"], 2, "whole percents in 1..100"),
        (["--version", "2", "--steps", "50,5,100"], 2, "must increase"),
        (["--version", "2", "--steps", "five"], 2, "comma-separated numbers"),
        (["--version", "2", "--margin", "late"], 2, "METRIC=NUMBER"),
        (["--version", "2", "--guardrails", "happiness"], 2, "metric 'happiness'"),
        (["--version", "9"], 1, "version 9: no folder"),
        (["--version", "2", "--city", "atlantis"], 2, "no registered city has that id"),
    ],
)
def test_the_cli_refuses_a_bad_rollout_and_writes_nothing(
    tmp_path: Path,
    repo: Path,
    trusted_dir: Path,
    signer: Any,
    argv: list[str],
    code: int,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    key = key_file(tmp_path, signer)
    assert start_rollout(tmp_path, repo, trusted_dir, key, *argv) == code
    assert message in capsys.readouterr().err
    store = StateStore(tmp_path / "store")
    assert store.read() is None and not (store.path / "rollout" / "state.json").exists()


def test_the_cli_refuses_a_signer_the_replicas_do_not_trust(
    tmp_path: Path, repo: Path, trusted_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = key_file(tmp_path, generate_private_key())
    assert start_rollout(tmp_path, repo, trusted_dir, key, "--version", "2") == 1
    assert "not among the trusted keys" in capsys.readouterr().err
    assert StateStore(tmp_path / "store").read() is None


def test_the_cli_refuses_an_unsigned_version(
    tmp_path: Path,
    repo: Path,
    trusted_dir: Path,
    signer: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    scoring = model_layout(repo, SCORING_MODEL)
    shutil.copytree(
        scoring.version(2),
        scoring.version(7),
        ignore=shutil.ignore_patterns(MANIFEST_NAME, SIGNATURE_NAME),
    )
    key = key_file(tmp_path, signer)
    assert start_rollout(tmp_path, repo, trusted_dir, key, "--version", "7") == 1
    assert "version 7: refused" in capsys.readouterr().err
    assert StateStore(tmp_path / "store").read() is None
