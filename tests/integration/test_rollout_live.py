"""Rollouts judged on outcomes, live: replicas following one fleet store and sharing one
outcome store, the live city playing Shanghai against them and reporting what became of
every order, and the rollout controller stepping versions through their shares with no
operator between the steps.

- A deliberately worse version 3 (version 1's model with its ETA and on-time heads turned
  upside down: it prefers the riders version 1 finds slowest; signed like the others) is
  rolled back by the controller at its first step: it never serves more than that step's
  share of the orders, and every replica routes every user to version 1 again.
- Then version 3 is made stable by the operator (as a stale or bad stable version would be),
  and version 1 is rolled out: it goes 20 -> 50 -> 100 % and becomes the stable version.

`make test-rollout` runs it with one replica (a fleet of one, as `make serve` is), then with
two (``ROLLOUT_REPLICAS=2``). The controller runs in this process with short steps
(``min_seconds`` 3, ``min_outcomes`` 100; the default maturity, on the live city's clock); the
decisions it takes are on the outcomes alone.
"""

from __future__ import annotations

import copy
import io
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from launcher_helpers import EXAMPLE, Launcher, free_port, signed_repository, worse_version

from dispatch_client import DispatchClient, window_from_json
from dispatch_service.core.signing import TrustedKeys, load_private_key
from dispatch_service.experiments.rollout import ActionKind, Phase, RolloutPlan
from dispatch_service.offline.live_city import LiveCityConfig, run_live_city
from dispatch_service.ops import admin
from dispatch_service.ops.fleet_state import StateStore, initial_state
from dispatch_service.ops.rollout_controller import RolloutController
from dispatch_service.ops.server import Ports
from dispatch_service.outcomes.sql_store import open_store

from .patience import patience, wait_for

REPLICAS = int(os.environ.get("ROLLOUT_REPLICAS", "1"))
# A run plays the city through two rollouts, each step waiting three simulated hours for
# its decisions to mature: minutes on two cores. `make test-rollout` runs it (one replica,
# then two); `make test` leaves it to the unit tests of the controller on real stores.
pytestmark = pytest.mark.skipif(
    os.environ.get("ROLLOUT_LIVE") != "1", reason="minutes long: make test-rollout"
)
WORSE = 3
STEPS = (20, 50, 100)
# The live city's pace: one window a simulated minute, as fast as it can play (the rollout's
# default maturity, three hours of the platform's clock, passes in seconds).
SPEED = 600.0


@dataclass
class Fleet:
    repository: Path
    trusted: Path
    key_file: Path
    store: StateStore
    outcome_store: Path
    replicas: list[tuple[Launcher, Ports, int, Path]]

    def admin(self, *argv: str) -> str:
        out = io.StringIO()
        fleet = ["--state-store", str(self.store.path), "--trusted-keys", str(self.trusted)]
        write = [*fleet, "--key", str(self.key_file), "--model-repository", str(self.repository)]
        code = admin.main([*argv, *write], out=out)
        assert code == 0, (argv, out.getvalue())
        return out.getvalue()

    def controller(self, holder: str = "test") -> RolloutController:
        return RolloutController(
            state_store=self.store,
            outcomes=open_store(self.outcome_store),
            signer=load_private_key(self.key_file.read_bytes()),
            trusted=TrustedKeys.from_directory(self.trusted),
            holder=holder,
            initial=lambda: initial_state(self.repository),
        )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("rollout")
    repository, trusted, key_file = signed_repository(root)
    worse_version(repository, key_file, WORSE)
    store = StateStore(root / "fleet")
    outcome_store = root / "outcomes.sqlite3"
    replicas = []
    try:
        for n in range(REPLICAS):
            ports, health = Ports.free(), free_port()
            keys = root / f"keys-{n}"
            launcher = Launcher(
                ports, root / f"server-{n}.log", keys,
                "--model-repository", str(repository), "--trusted-keys", str(trusted),
                "--state-store", str(store.path), "--outcome-store", str(outcome_store),
                "--health-port", str(health),
            )  # fmt: skip
            replicas.append((launcher, ports, health, keys))
        for launcher, *_ in replicas:
            assert launcher.read_until("ready:", patience(300)), "\n".join(launcher.lines)
        yield Fleet(repository, trusted, key_file, store, outcome_store, replicas)
    finally:
        for launcher, *_ in replicas:
            launcher.stop()


def _play(fleet: Fleet, orders: int, seed: int, stop: threading.Event) -> None:
    """The live city on every replica (each its share of the orders) until ``stop``."""

    def one(replica: tuple[Launcher, Ports, int, Path], index: int) -> None:
        _, ports, health, keys = replica
        config = LiveCityConfig(
            cities=("shanghai",),
            windows_per_minute=1,
            speed=SPEED,
            orders=orders // len(fleet.replicas),
            minutes=100_000,
            max_seconds=patience(300),
            report_delay_minutes=1.0,
            seed=seed + index,
        )
        with DispatchClient.grpc(f"127.0.0.1:{ports.grpc}", model_name="dispatch_fused") as c:
            while not stop.is_set():
                run_live_city(
                    config,
                    c,
                    outcomes_url=f"http://127.0.0.1:{health}",
                    outcome_key=(keys / "outcome.key").read_text().strip(),
                )
                config = LiveCityConfig(**{**config.__dict__, "seed": config.seed + 100})

    threads = [
        threading.Thread(target=one, args=(replica, i), daemon=True)
        for i, replica in enumerate(fleet.replicas)
    ]
    for thread in threads:
        thread.start()
    stop.wait()
    for thread in threads:
        thread.join(timeout=patience(120))


def _drive(fleet: Fleet, plan: RolloutPlan, seed: int) -> tuple[list[ActionKind], Phase]:
    """Start ``plan``, play the city and let the controller look every half second until the
    rollout ends (bounded)."""
    controller = fleet.controller()
    controller.start(plan)
    stop = threading.Event()
    player = threading.Thread(target=_play, args=(fleet, 100_000, seed, stop), daemon=True)
    player.start()
    actions: list[ActionKind] = []
    deadline = time.monotonic() + patience(400)
    try:
        while time.monotonic() < deadline:
            action = controller.tick()
            if action is not None and action.kind is not ActionKind.HOLD:
                actions.append(action.kind)
            state = controller.book.load()
            assert state is not None
            if state.phase.final:
                print("audit:", *controller.book.audit(), sep="\n")  # shown when a test fails
                return actions, state.phase
            time.sleep(0.5)
        raise AssertionError(f"the rollout did not end: {controller.book.load()}")
    finally:
        stop.set()
        player.join(timeout=patience(180))


def _window_of(users: list[str]) -> object:
    """The example window with one order per user (routing by user, no version tag)."""
    document = json.loads(EXAMPLE.read_text())
    document.pop("model_version_tag", None)
    template = document["orders"]
    document["orders"] = [
        {**copy.deepcopy(template[n % len(template)]), "id": f"order-{n}", "user_id": user}
        for n, user in enumerate(users)
    ]
    return window_from_json(json.dumps(document))


def _routes_everyone_to(fleet: Fleet, version: int) -> None:
    """Every replica's dispatch_fused answers 100 users with ``version``."""
    window = _window_of([f"user-{n}" for n in range(100)])

    def answered_by_version() -> bool:
        for _, ports, _, _ in fleet.replicas:
            with DispatchClient.grpc(f"127.0.0.1:{ports.grpc}", model_name="dispatch_fused") as c:
                result = c.dispatch(window)  # type: ignore[arg-type]
            if {int(order.model_version or 0) for order in result.orders} != {version}:
                return False
        return True

    wait_for(answered_by_version, f"every user on version {version}", 60, every_s=1.0)


def test_a_worse_version_is_rolled_back_then_a_better_one_promoted(fleet: Fleet) -> None:
    store = open_store(fleet.outcome_store)
    plan = RolloutPlan(version=WORSE, steps=STEPS, min_outcomes=100, min_seconds=3.0)
    actions, phase = _drive(fleet, plan, seed=11)
    assert phase is Phase.ROLLED_BACK and actions == [ActionKind.ROLL_BACK]
    routing = fleet.store.current(TrustedKeys.from_directory(fleet.trusted))
    assert routing is not None and routing.state.routing.canary_percent == 0
    rows = store.joined()
    served_by_worse = sum(r.model_version == WORSE for r in rows) / len(rows)
    assert served_by_worse <= STEPS[0] / 100 + 0.05, served_by_worse
    _routes_everyone_to(fleet, 1)

    # the worse version made stable by hand, then version 1 rolled out against it
    fleet.admin(  # past the golden check, which refuses so different a version
        "deploy", "--version", str(WORSE), "--canary-percent", "10",
        "--min-top1-agreement", "0", "--max-eta-diff-minutes", "1000",
    )  # fmt: skip
    fleet.admin("promote")
    _routes_everyone_to(fleet, WORSE)
    plan = RolloutPlan(version=1, steps=STEPS, min_outcomes=100, min_seconds=3.0)
    actions, phase = _drive(fleet, plan, seed=23)
    assert phase is Phase.PROMOTED
    assert actions[0] is ActionKind.ADVANCE and actions[-1] is ActionKind.PROMOTE
    current = fleet.store.current(TrustedKeys.from_directory(fleet.trusted))
    assert current is not None and current.state.routing.stable_version == 1
    _routes_everyone_to(fleet, 1)
    notes = [
        kept.signed.state.note
        for kept in fleet.store.history(TrustedKeys.from_directory(fleet.trusted))
        if kept.signed is not None
    ]
    assert any("rolled back" in note for note in notes)
    assert any("promoted" in note for note in notes)
