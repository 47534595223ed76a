"""A fleet on one machine: launchers on free ports sharing one state store.

Two launchers (`python -m dispatch_service.ops.server --state-store DIR`) start, each over its
own copy of one signed repository (the release, which `dispatch-admin` reads), as each pod
has its own image; `dispatch-admin deploy --state-store` writes a canary at 10 %,
every replica applies it and a canary user gets the canary version on each of them; one
replica is killed, the canary share changes, and a replica added after that serves the new
revision before it says ready; a tampered document changes no replica (each reports the
refusal, `dispatch-admin` exits 2) until the runbook's fix, `restore --revision N`; a rollback
under steady load drops no request. Then every lifecycle command (deploy, canary, shadow,
promote, rollback, per city, restore): after each, `status` exits 0 and every entry point of
every replica answers 100 users with the versions the revision gives them; an entry point
made to route otherwise makes `status` exit 1; the scoring model unloaded on a replica
(orders at level 2) is loaded again by the runbook's fix, a `rollback`. Last, a version whose
file changed on one replica's copy: that replica keeps its revision while the other applies
the new one (DispatchFleetDiverged, read by a real Prometheus) until the file is restored.
"""

from __future__ import annotations

import copy
import io
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from launcher_helpers import EXAMPLE, Launcher, free_port, signed_repository, worse_version
from patience import wait_for
from prometheus_helpers import Prometheus, alert_expr, running_prometheus

from dispatch_client import DispatchClient, window_from_json
from dispatch_client.retry import NO_RETRY
from dispatch_service.core.repository_layout import ONNX_FILE, SCORING_MODEL, model_layout
from dispatch_service.ops import admin
from dispatch_service.ops.fleet_state import FleetState, StateStore
from dispatch_service.ops.model_control import ready_versions, unload_model
from dispatch_service.ops.server import Ports
from dispatch_service.routing.live import ROUTING_FILE_ENV, write_routing_file
from dispatch_service.routing.policy import user_buckets
from dispatch_service.routing.settings import RouterSettings

START_TIMEOUT_S = 300  # a loaded 2-core machine takes minutes to load every model
CONVERGE_TIMEOUT_S = 60  # generous: the assertions are on the outcome, not the time
STABLE, CANARY = 1, 2
USERS = [f"user-{n}" for n in range(400)]
ENTRY_POINTS = ("dispatch", "dispatch_fused", "dispatch_priority")


@dataclass
class Replica:
    launcher: Launcher
    ports: Ports
    health_port: int
    key_dir: Path
    repository: Path  # its own copy of the release (its "image")
    lines: list[str] = field(default_factory=list)

    @property
    def admin_key(self) -> str:
        """For its launcher's control endpoint (`health_url`), as an operator sends it."""
        return (self.key_dir / "admin.key").read_text().strip()

    @property
    def priority_key(self) -> str:
        return (self.key_dir / "priority.key").read_text().strip()

    def routing_file(self) -> Path:
        """The live routing file its launcher writes (named in Triton's environment)."""
        (server,) = self.launcher.children("tritonserver")
        environ = Path(f"/proc/{server}/environ").read_bytes().split(b"\0")
        (entry,) = (e for e in environ if e.startswith(ROUTING_FILE_ENV.encode() + b"="))
        return Path(entry.split(b"=", 1)[1].decode())

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}"

    def healthz(self) -> dict[str, Any]:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.health_url}/healthz", timeout=5) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            body = exc.read()
        document: dict[str, Any] = json.loads(body)
        return document

    def fleet(self) -> dict[str, Any]:
        detail: dict[str, Any] = self.healthz()["fleet_state"]
        return detail

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"{self.health_url}/metrics", timeout=5) as response:
            return str(response.read().decode())


@dataclass
class Fleet:
    root: Path
    repository: Path  # the release: what dispatch-admin verifies, what each replica copies
    trusted: Path
    key: Path
    store: Path
    replicas: list[Replica] = field(default_factory=list)

    def admin(self, *argv: str) -> tuple[int, str]:
        out = io.StringIO()
        return admin.main(list(argv), out=out), out.getvalue()

    def write(self, command: str, *extra: str) -> tuple[int, str]:
        return self.admin(
            command, "--state-store", str(self.store), "--trusted-keys", str(self.trusted),
            "--key", str(self.key), "--model-repository", str(self.repository), *extra,
        )  # fmt: skip

    def status(self) -> tuple[int, dict[str, Any]]:
        code, text = self.admin(
            "status", "--state-store", str(self.store), "--trusted-keys", str(self.trusted)
        )
        return code, json.loads(text)

    def start(self, count: int) -> list[Replica]:
        """``count`` launchers started together; returned once each said ready."""
        started = []
        for _ in range(count):
            ports, health = Ports.free(), free_port()
            n = len(self.replicas)
            repository = shutil.copytree(self.repository, self.root / f"repo-{n}")
            launcher = Launcher(
                ports, self.root / f"replica-{n}.log", self.root / f"keys-{n}",
                "--model-repository", str(repository), "--trusted-keys", str(self.trusted),
                "--state-store", str(self.store), "--health-port", str(health),
            )  # fmt: skip
            replica = Replica(launcher, ports, health, self.root / f"keys-{n}", repository)
            self.replicas.append(replica)
            started.append(replica)
        for replica in started:
            ready = replica.launcher.read_until("ready:", START_TIMEOUT_S)
            if not ready:
                process = replica.launcher.process
                process.kill()
                errors = process.stderr.read() if process.stderr else ""
                log = (self.root / f"replica-{self.replicas.index(replica)}.log").read_text()
                lines = "\n".join(replica.launcher.lines)
                raise AssertionError(f"{lines}\n{errors[-3000:]}\n{log[-3000:]}")
            replica.lines = replica.launcher.lines
            _drain(replica.launcher)
        return started

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.launcher.process.poll() is None]


def _drain(launcher: Launcher) -> None:
    """Read the launcher's output from now on, so its pipes never fill and block it."""

    def read(stream: Any, into: list[str]) -> None:
        for line in stream:
            into.append(line.rstrip("\n"))

    for stream in (launcher.process.stdout, launcher.process.stderr):
        threading.Thread(target=read, args=(stream, launcher.lines), daemon=True).start()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    repository, trusted, key = signed_repository(root)
    fleet = Fleet(root, repository, trusted, key, root / "store")
    try:
        fleet.start(2)
        yield fleet
    finally:
        for replica in fleet.replicas:
            replica.launcher.stop()


def until(what: str, check: Any, timeout_s: float = CONVERGE_TIMEOUT_S) -> float:
    """Poll ``check`` until true; the seconds it took (the test asserts the outcome)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if check():
            return time.monotonic() - start
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def window_for(users: list[str]) -> Any:
    document = json.loads(EXAMPLE.read_text())
    document.pop("model_version_tag", None)  # route by user, whatever the example forces
    orders = document["orders"]
    document["orders"] = []
    for n, user in enumerate(users):
        order = copy.deepcopy(orders[n % len(orders)])
        order["id"] = f"order-{n}"
        order["user_id"] = user
        document["orders"].append(order)
    return window_from_json(json.dumps(document))


def versions_by_user(replica: Replica, model: str, users: list[str]) -> dict[str, int]:
    with DispatchClient.grpc(
        replica.grpc_url, model_name=model, retry=NO_RETRY, priority_key=replica.priority_key
    ) as client:
        result = client.dispatch(window_for(users))
    return {
        user: int(order.model_version or 0)
        for user, order in zip(users, result.orders, strict=True)
    }


def sample_users(percent: int) -> tuple[list[str], list[str]]:
    """Three users in the canary's buckets at ``percent`` and three outside."""
    buckets = user_buckets(USERS)
    inside = [u for u, b in zip(USERS, buckets, strict=True) if b < percent][:3]
    outside = [u for u, b in zip(USERS, buckets, strict=True) if b >= percent][:3]
    return inside, outside


def serving(fleet: Fleet, revision: int) -> bool:
    return all(r.fleet()["revision"] == revision for r in fleet.live())


def test_a_deploy_reaches_every_replica_and_a_user_gets_one_version_everywhere(
    fleet: Fleet,
) -> None:
    assert all(r.fleet()["status"] == "no_document" for r in fleet.live())
    code, text = fleet.write("deploy", "--version", str(CANARY), "--canary-percent", "10")
    written = time.monotonic()
    assert code == 0, text
    assert f"wrote revision 1 to {fleet.store}" in text
    until("every replica serves revision 1", lambda: serving(fleet, 1))
    print(f"deploy: every replica on revision 1 {time.monotonic() - written:.1f} s after the write")
    canary_users, stable_users = sample_users(10)
    for replica in fleet.live():
        for model in ("dispatch", "dispatch_fused"):
            got = versions_by_user(replica, model, canary_users + stable_users)
            assert {got[u] for u in canary_users} == {CANARY}, (replica.health_url, model)
            assert {got[u] for u in stable_users} == {STABLE}, (replica.health_url, model)
    # Every entry-point process reads the file at its next window or within 0.25 s idle.
    try:
        seconds = until("status: every entry point on 1", lambda: fleet.status()[0] == 0)
    except AssertionError:
        raise AssertionError(fleet.status()[1]["replicas"]) from None
    print(f"deploy: status converged {seconds:.1f} s after the replicas reported revision 1")
    code, status = fleet.status()
    assert [r["state"] for r in status["replicas"]] == ["current", "current"]
    assert status["document"]["revision"] == 1
    for replica in fleet.live():
        assert "dispatch_launcher_fleet_state_revision 1" in replica.metrics()


def test_a_killed_replica_leaves_and_a_new_one_joins_in_the_current_revision(
    fleet: Fleet,
) -> None:
    killed = fleet.live()[-1]
    killed.launcher.process.kill()
    killed.launcher.process.wait(timeout=30)
    code, text = fleet.write("deploy", "--version", str(CANARY), "--canary-percent", "30")
    assert code == 0, text
    until("the survivor serves revision 2", lambda: serving(fleet, 2))
    (added,) = fleet.start(1)
    # Applied before ready: the event precedes the "ready:" line, and the first health
    # answer already names the revision.
    ready_at = next(n for n, line in enumerate(added.lines) if line.startswith("ready:"))
    applied = [n for n, line in enumerate(added.lines) if '"fleet_state_applied"' in line]
    assert applied and applied[0] < ready_at, "\n".join(added.lines)
    assert added.fleet()["revision"] == 2
    canary_users, stable_users = sample_users(30)
    for replica in fleet.live():
        got = versions_by_user(replica, "dispatch", canary_users + stable_users)
        assert {got[u] for u in canary_users} == {CANARY}
        assert {got[u] for u in stable_users} == {STABLE}
    # The killed one stops being counted once silent (its report in the store goes stale).
    until("status converges", lambda: fleet.status()[0] == 0)
    code, status = fleet.status()
    states = sorted(r["state"] for r in status["replicas"])
    assert states == ["current", "current", "gone"], status


@pytest.mark.runbook_fix("DispatchFleetStateRefused")
def test_a_tampered_document_changes_no_replica_and_each_says_why(fleet: Fleet) -> None:
    store = StateStore(fleet.store)
    good = store.read()
    assert good is not None
    envelope = json.loads(good)
    envelope["state"] = envelope["state"].replace('"canary_percent":30', '"canary_percent":100')
    store.write(json.dumps(envelope).encode())
    try:
        until(
            "every replica refuses",
            lambda: all(r.fleet()["status"] == "refused" for r in fleet.live()),
        )
        for replica in fleet.live():
            detail = replica.fleet()
            assert detail["revision"] == 2  # the last good one keeps serving
            assert detail["refused"]["document"] == str(store.document)
            assert detail["refused"]["code"] == "bad_signature"
            assert "bad signature" in detail["refused"]["reason"]
            assert 'reason="bad_signature"' in replica.metrics()
            _, outside = sample_users(30)
            got = versions_by_user(replica, "dispatch", outside)
            assert set(got.values()) == {STABLE}  # not the tampered 100 %
        code, status = fleet.status()
        assert code == 2 and "bad signature" in status["document"]["refused"]
        code, _ = fleet.write("rollback")
        assert code == 2  # nothing is built on a document that does not verify
        refusals = [r.fleet()["refusals"] for r in fleet.live()]
        time.sleep(2.0)  # several polls: the same bytes are not tried again
        assert [r.fleet()["refusals"] for r in fleet.live()] == refusals
        # The runbook's fix for DispatchFleetStateRefused, as written: history, restore.
        code, text = fleet.admin(
            "history", "--state-store", str(fleet.store), "--trusted-keys", str(fleet.trusted)
        )
        assert code == 2  # the stored document does not verify; the kept ones are listed
        assert [r["revision"] for r in json.loads(text)["revisions"]] == [1, 2]
        code, text = fleet.write("restore", "--revision", "2", "--wait-s", "60")
        assert code == 0, text
        assert "wrote revision 3" in text
    except BaseException:
        store.write(good)
        raise
    for replica in fleet.live():
        detail = replica.fleet()
        assert (detail["status"], detail["revision"], detail["refused"]) == ("current", 3, None)
        assert "dispatch_launcher_fleet_state_refused 0" in replica.metrics()
    assert fleet.status()[0] == 0


class Load:
    """Windows sent to every live replica, one thread each, every error kept."""

    def __init__(self, replicas: list[Replica]) -> None:
        self.replicas = replicas
        self.sent = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(r,), daemon=True) for r in replicas
        ]

    def _run(self, replica: Replica) -> None:
        window = window_for(USERS[:8])
        with DispatchClient.grpc(replica.grpc_url, retry=NO_RETRY) as client:
            while not self._stop.is_set():
                try:
                    client.dispatch(window)
                except Exception as exc:
                    self.errors.append(f"{replica.grpc_url}: {exc}")
                self.sent += 1
                time.sleep(0.02)

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def test_a_rollback_under_load_drops_no_request(fleet: Fleet) -> None:
    with Load(fleet.live()) as load:
        time.sleep(1.0)
        code, text = fleet.write("rollback", "--unload-canary")
        written = time.monotonic()
        assert code == 0, text
        until("every replica serves revision 4", lambda: serving(fleet, 4))
        seconds = time.monotonic() - written
        time.sleep(1.0)
    print(f"rollback: every replica on revision 4 {seconds:.1f} s; {load.sent} requests")
    assert load.errors == []
    assert load.sent > 0
    canary_users, _ = sample_users(30)
    for replica in fleet.live():
        assert set(versions_by_user(replica, "dispatch", canary_users).values()) == {STABLE}


def expected(routing: RouterSettings, users: list[str]) -> dict[str, int]:
    """By hand: a user whose bucket lies below the canary's share gets the canary version
    (the example window has no city: the global routing)."""
    buckets = user_buckets(users)
    return {
        u: routing.canary_version if b < routing.canary_percent else routing.stable_version
        for u, b in zip(users, buckets, strict=True)
    }


def assert_fleet_routes(fleet: Fleet, routing: RouterSettings) -> None:
    """status exits 0 (each replica and entry point on the stored revision), and every entry
    point of every replica answers 100 users with the versions ``routing`` gives them."""
    code, status = fleet.status()
    assert code == 0, status
    for replica in status["replicas"]:
        if replica["state"] != "gone":
            assert replica["state"] == "current" and replica["entry_point_problems"] == []
    users = USERS[:100]
    wanted = expected(routing, users)
    for replica in fleet.live():
        for model in ENTRY_POINTS:
            assert versions_by_user(replica, model, users) == wanted, (replica.grpc_url, model)


def stored_routing(fleet: Fleet) -> RouterSettings:
    signed = StateStore(fleet.store).current(admin_trusted(fleet))
    assert signed is not None
    return signed.state.routing


def stored_revision(fleet: Fleet) -> int:
    signed = StateStore(fleet.store).current(admin_trusted(fleet))
    assert signed is not None
    return signed.state.revision


def admin_trusted(fleet: Fleet) -> Any:
    from dispatch_service.core.signing import TrustedKeys

    return TrustedKeys.from_directory(fleet.trusted)


def test_every_lifecycle_command_routes_every_entry_point_as_status_says(fleet: Fleet) -> None:
    steps: list[tuple[tuple[str, ...], RouterSettings]] = [
        (("deploy", "--version", "2", "--canary-percent", "20"), RouterSettings(1, 2, 20)),
        (("canary", "--percent", "50"), RouterSettings(1, 2, 50)),
        (("shadow", "--version", "2", "--percent", "30"), RouterSettings(1, 2, 50, 30)),
        (("promote",), RouterSettings(2, 0, 0)),
        (("deploy", "--version", "1", "--canary-percent", "40"), RouterSettings(2, 1, 40)),
        (("rollback",), RouterSettings(2, 0, 0)),
        (("canary", "--percent", "10", "--city", "beijing"), None),  # no canary: refused
        (("deploy", "--version", "1", "--canary-percent", "100", "--city", "beijing"), None),
    ]
    for argv, routing in steps:
        code, text = fleet.write(*argv, "--note", "lifecycle test", "--wait-s", "60")
        if routing is None and argv[0] == "canary":
            assert code == 1, text  # beijing has no canary: nothing written
            continue
        assert code == 0, (argv, text)
        stored = stored_routing(fleet)
        if routing is not None:
            assert (stored.stable_version, stored.canary_version) == (
                routing.stable_version,
                routing.canary_version,
            ), argv
            assert (stored.canary_percent, stored.shadow_percent) == (
                routing.canary_percent,
                routing.shadow_percent,
            ), argv
        # The example window has no city: a beijing route leaves its answers alone.
        assert_fleet_routes(fleet, stored)
    assert stored_routing(fleet).for_city("beijing").canary_percent == 100
    code, text = fleet.write("promote", "--city", "beijing", "--wait-s", "60")
    assert code == 0, text
    promoted = stored_routing(fleet)
    assert promoted.for_city("beijing").stable_version == 1 and promoted.stable_version == 2
    assert_fleet_routes(fleet, promoted)
    code, text = fleet.admin(
        "history", "--state-store", str(fleet.store), "--trusted-keys", str(fleet.trusted)
    )
    (first,) = (
        r
        for r in json.loads(text)["revisions"]
        if r["note"].startswith("deploy version 2 as canary at 20%")
    )
    code, text = fleet.write("restore", "--revision", str(first["revision"]), "--wait-s", "60")
    assert code == 0, text
    assert_fleet_routes(fleet, RouterSettings(1, 2, 20))


def test_status_exits_1_while_an_entry_point_routes_otherwise(fleet: Fleet) -> None:
    replica = fleet.live()[0]
    signed = StateStore(fleet.store).current(admin_trusted(fleet))
    assert signed is not None
    other = FleetState(signed.state.revision, (1, 2), RouterSettings(1, 2, 90))
    write_routing_file(replica.routing_file(), other.routing, other.revision)

    def differs() -> bool:
        """Every entry point's processes re-read the file on their own (the idle ones every
        0.25 s): wait until the router's report shows the change too."""
        code, status = fleet.status()
        (entry,) = (r for r in status["replicas"] if r["health_url"] == replica.health_url)
        return (
            code == 1
            and entry["state"] == "entry_points_differ"
            and any("dispatch_router" in p for p in entry["entry_point_problems"])
        )

    until("status says the entry points differ, the router's among them", differs)
    _, status = fleet.status()
    (entry,) = (r for r in status["replicas"] if r["health_url"] == replica.health_url)
    assert entry["revision"] == signed.state.revision  # the launcher's own revision holds
    # The next revision puts every entry point back on the document's routing.
    code, text = fleet.write("rollback", "--wait-s", "60")
    assert code == 0, text
    assert_fleet_routes(fleet, stored_routing(fleet))


@pytest.mark.runbook_fix("DispatchRuleBasedDispatch")
def test_rule_based_dispatch_clears_with_a_rollback(fleet: Fleet) -> None:
    """DispatchRuleBasedDispatch's condition (no version answers: level 2) on one replica,
    then its runbook fix as written: `dispatch-admin rollback`."""
    replica = fleet.live()[0]
    unload_model(replica.health_url, "dispatch_model", replica.admin_key, 120)
    assert ready_versions(replica.health_url, "dispatch_model", replica.admin_key) == ()
    with DispatchClient.grpc(replica.grpc_url, retry=NO_RETRY) as client:
        levels = {int(o.fallback_level) for o in client.dispatch(window_for(USERS[:8])).orders}
    assert levels == {2}
    code, text = fleet.write("rollback", "--wait-s", "60")
    assert code == 0, text
    detail = replica.fleet()
    assert detail["status"] == "current" and detail["refused"] is None
    assert ready_versions(replica.health_url, "dispatch_model", replica.admin_key) != ()
    with DispatchClient.grpc(replica.grpc_url, retry=NO_RETRY) as client:
        levels = {int(o.fallback_level) for o in client.dispatch(window_for(USERS[:8])).orders}
    assert levels == {0}
    assert_fleet_routes(fleet, stored_routing(fleet))


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    (line,) = (row for row in status.splitlines() if row.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@pytest.mark.parametrize("kind", ["huge", "fifo", "device"])
def test_a_document_that_is_no_bounded_regular_file_is_refused_unread(
    fleet: Fleet, kind: str
) -> None:
    """A 1 GiB file (sparse), a FIFO and /dev/zero in the document's place: each replica
    refuses it with its reason, its launcher's memory does not grow, and its watch goes on
    (the good document back is served again)."""
    store = StateStore(fleet.store)
    if store.read() is None:  # run alone: a first revision to keep serving
        assert fleet.write("rollback", "--wait-s", "60")[0] == 0
    good = store.read()
    assert good is not None
    rss = {r.health_url: _rss_mib(r.launcher.process.pid) for r in fleet.live()}
    store.document.unlink()
    if kind == "huge":
        with store.document.open("wb") as out:
            out.truncate(1 << 30)
    elif kind == "fifo":
        os.mkfifo(store.document)
    else:
        store.document.symlink_to("/dev/zero")
    code = "too_large" if kind == "huge" else "not_regular"
    try:
        until(
            f"every replica refuses the {kind}",
            lambda: all((r.fleet()["refused"] or {}).get("code") == code for r in fleet.live()),
        )
        for replica in fleet.live():
            refused = replica.fleet()["refused"]
            assert str(store.document) in refused["reason"] and "not read" in refused["reason"]
            grown = _rss_mib(replica.launcher.process.pid) - rss[replica.health_url]
            assert grown < 64, f"{replica.health_url}: launcher RSS grew {grown:.0f} MiB"
        status_code, _ = fleet.status()
        assert status_code == 2
    finally:
        store.document.unlink()
        store.write(good)
    until(
        "every replica is current again",
        lambda: all(r.fleet()["status"] == "current" for r in fleet.live()),
    )


def diverged(prometheus: Prometheus, replicas: int) -> bool | None:
    """Whether DispatchFleetDiverged's own expression holds now (its `for` left out); None
    until every replica's revision is scraped (a missing series would read as agreement)."""
    if prometheus.value("count(dispatch_launcher_fleet_state_revision)") != replicas:
        return None
    return bool(prometheus.query(alert_expr("DispatchFleetDiverged")))


@pytest.mark.runbook_fix("DispatchFleetDiverged")
def test_a_replica_refusing_a_changed_version_diverges_until_the_file_is_restored(
    fleet: Fleet, tmp_path: Path
) -> None:
    """DispatchFleetDiverged's condition: a new signed version reaches every replica's image,
    but on one replica a file of it changed since signing, so that replica refuses the
    revision that needs it and keeps serving its own while the other applies it. The
    runbook's check (`status` names the replica behind, its event the cause) and its fix as
    written: the file restored from the release; the replica's retry (every 15 s) applies
    the revision."""
    # No canary at a share (shadowing another version needs none); every replica on it.
    code, text = fleet.write("rollback", "--wait-s", "60")
    assert code == 0, text
    behind, ahead = replicas = fleet.live()
    targets = {f"replica-{n}": f"{r.health_url}/metrics" for n, r in enumerate(replicas)}
    with running_prometheus(tmp_path, targets) as prometheus:
        wait_for(lambda: diverged(prometheus, 2) is False, "one revision scraped", 45, 0.25)
        kept = stored_revision(fleet)
        # Version 3 signed in the release and copied into each image; one copy changed.
        version = 3
        worse_version(fleet.repository, fleet.key, version)
        release = model_layout(fleet.repository, SCORING_MODEL).version(version)
        for replica in replicas:
            shutil.copytree(
                release, model_layout(replica.repository, SCORING_MODEL).version(version)
            )
        changed = model_layout(behind.repository, SCORING_MODEL).version(version) / ONNX_FILE
        changed.write_bytes(changed.read_bytes() + b"changed after signing")
        code, text = fleet.write("shadow", "--version", str(version), "--percent", "10")
        assert code == 0, text
        revision = stored_revision(fleet)
        until("the intact replica applies it", lambda: ahead.fleet()["revision"] == revision)
        until(
            "the changed replica refuses it",
            lambda: (behind.fleet()["refused"] or {}).get("revision") == revision,
        )
        refused = behind.fleet()
        assert refused["revision"] == kept and refused["refused"]["code"] == "version_refused"
        wait_for(lambda: diverged(prometheus, 2), "DispatchFleetDiverged's condition", 30, 0.25)
        # The runbook's check: status names the replica behind, its event the cause. The
        # intact replica's instances pick the revision's routing up on their next poll (on a
        # loaded host status can catch it in between: "entry_points_differ"), so poll.
        expected = {behind.health_url: "refusing", ahead.health_url: "current"}
        seen: dict[str, Any] = {}

        def status_names_the_replica_behind() -> bool:
            code, status = fleet.status()
            seen.update(code=code, status=status)
            replicas = status["replicas"]
            states = {r["health_url"]: r["state"] for r in replicas if r["state"] != "gone"}
            return code == 1 and states == expected

        try:
            until("status: one replica refusing, one current", status_names_the_replica_behind)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {seen}") from None
        events = [
            event
            for event in map(json.loads, [line for line in behind.lines if line.startswith("{")])
            if event.get("event") == "fleet_state_refused" and event.get("revision") == revision
        ]
        assert events, "\n".join(behind.lines[-20:])
        cause = f"{SCORING_MODEL} version {version} refused: digest mismatch on file {ONNX_FILE}"
        assert events[0]["reason"].startswith(cause), events[0]
        assert events[0]["kept"] == kept
        # The fix: the file as the release has it. The replica's next retry applies it.
        shutil.copyfile(release / ONNX_FILE, changed)
        until(
            "the restored replica applies the revision on its retry",
            lambda: behind.fleet()["revision"] == revision,
            90,
        )
        wait_for(lambda: diverged(prometheus, 2) is False, "DispatchFleetDiverged clear", 30, 0.25)
    assert behind.fleet()["refused"] is None
    until("status: every replica current", lambda: fleet.status()[0] == 0)
