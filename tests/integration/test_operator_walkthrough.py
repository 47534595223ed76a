"""The operator's path of docs/model-lifecycle.md, walked in order against a live server.

Every step runs the documented command as a subprocess, the way an operator types it --
`dispatch-admin keygen` (HOME pointed at tmp_path, so its default ``~/keys``), ``make
sign-all``, `dispatch-admin verify`, the launcher that ``make serve`` runs (with trusted keys
and an admin key, on free ports, over a signed COPY of the repository: the committed one is
never touched, following its own fleet store as `make serve` does: a fleet of one), the
routing commands `deploy`, `status`, `canary`, `shadow`, `promote`, `rollback`, `history`,
`restore`, a second launcher on the same ports -- and checks its output, then the server's own
state, read apart from `dispatch-admin`: the versions Triton reports READY and which version
each of 100 users' orders is scored by on every entry point.

The tests are steps of one walk and run in file order on one server.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dispatch_client import DispatchClient, window_from_json
from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.core.signing import MANIFEST_NAME, SIGNATURE_NAME
from dispatch_service.ops.model_control import ready_versions
from dispatch_service.ops.server import Ports
from dispatch_service.routing.policy import user_buckets

ADMIN_KEY = "walkthrough-admin-key"
PRIORITY_KEY = "walkthrough-priority-key"
LANE_KEY = ("--priority-key", PRIORITY_KEY)
MODEL = "dispatch_model"
STABLE, CANARY = 1, 2
USERS = [f"user-{n}" for n in range(100)]
ENTRY_POINTS = ("dispatch", "dispatch_fused", "dispatch_priority")
BIN = Path(sys.prefix) / "bin"
EXAMPLE = REPO_ROOT / "client" / "examples" / "window_two_orders.json"
START_TIMEOUT_S = 300  # a loaded 2-core machine takes minutes to load every model
COMMAND_TIMEOUT_S = 300  # a deploy runs its golden check in process


@dataclass
class Launcher:
    """The launcher `make serve` runs, as a child process whose output is collected."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str]) -> Launcher:
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO_ROOT,
        )
        launcher = cls(process)
        launcher.reader = threading.Thread(target=launcher._collect, daemon=True)
        launcher.reader.start()
        return launcher

    def _collect(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, prefix: str, timeout_s: float) -> str | None:
        """The first output line starting with ``prefix``; None when the process ended."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = next((line for line in self.lines if line.startswith(prefix)), None)
            if found is not None:
                return found
            if self.process.poll() is not None:
                time.sleep(0.2)  # let the reader thread take the last lines
                return next((line for line in self.lines if line.startswith(prefix)), None)
            time.sleep(0.2)
        raise AssertionError(f"no {prefix!r} line in {timeout_s} s: {self.lines[-20:]}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # Ctrl-C, as the launcher says
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.reader is not None:
            self.reader.join(timeout=10)  # the pipe ends with the process
        if self.process.stdout is not None:
            self.process.stdout.close()
        return int(self.process.returncode)


@dataclass
class Walk:
    root: Path
    env: dict[str, str]
    repository: Path
    trusted: Path
    ports: Ports
    home: Path  # HOME for keygen, whose default folder is ~/keys
    outputs: dict[str, subprocess.CompletedProcess[str]] = field(default_factory=dict)
    launcher: Launcher | None = None

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports.http}"

    @property
    def control_url(self) -> str:
        """The launcher's control endpoint: its health port (by default metrics + 1)."""
        return f"http://127.0.0.1:{self.ports.metrics + 1}"

    def run(
        self, *argv: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
            env=env or self.env,
            cwd=REPO_ROOT,
        )

    @property
    def store(self) -> Path:
        return self.root / "fleet"

    def admin(self, *argv: str) -> subprocess.CompletedProcess[str]:
        store = ("--state-store", str(self.store), "--trusted-keys", str(self.trusted))
        return self.run(str(BIN / "dispatch-admin"), *argv, *store)

    def change(self, *argv: str) -> str:
        """A routing command as the docs write it, waiting for the replica to follow."""
        signing = ("--key", str(self.home / "keys" / "ops.key"), "--wait-s", "60")
        repository = ("--model-repository", str(self.repository))
        done = self.admin(*argv, *signing, *repository)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def status(self) -> dict[str, Any]:
        done = self.admin("status")
        assert done.returncode == 0, done.stdout + done.stderr
        document: dict[str, Any] = json.loads(done.stdout)  # one JSON document, nothing else
        return document

    def client(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return self.run(str(BIN / "dispatch-client"), "--url", self.http_url, *argv)


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    root = tmp_path_factory.mktemp("walkthrough")
    home = root / "home"
    home.mkdir()
    repository = root / "model_repository"
    shutil.copytree(
        MODEL_REPOSITORY,
        repository,
        ignore=shutil.ignore_patterns("__pycache__", MANIFEST_NAME, SIGNATURE_NAME),
    )
    env = dict(os.environ)
    for name in ("DISPATCH_SIGNING_KEY", "DISPATCH_ADMIN_KEY", "DISPATCH_TRUSTED_KEYS"):
        env.pop(name, None)
    walk = Walk(root, env, repository, root / "trusted_keys", Ports.free(), home)
    yield walk
    if walk.launcher is not None:
        walk.launcher.stop()


@pytest.fixture(scope="module")
def signed(walk: Walk) -> Walk:
    """keygen, make sign-all, the public key into the trusted folder, verify."""
    home = {**walk.env, "HOME": str(walk.home)}
    walk.outputs["keygen"] = walk.run(str(BIN / "dispatch-admin"), "keygen", env=home)
    key = walk.home / "keys" / "ops.key"
    walk.outputs["sign-all"] = walk.run(
        "make", "--no-print-directory", "sign-all", f"KEY={key}", f"REPO={walk.repository}"
    )
    walk.trusted.mkdir()
    shutil.copy(key.with_suffix(".pub"), walk.trusted / "ops.pub")
    walk.outputs["verify"] = walk.run(
        str(BIN / "dispatch-admin"), "verify", str(walk.repository),
        "--trusted-keys", str(walk.trusted),
    )  # fmt: skip
    return walk


@pytest.fixture(scope="module")
def served(signed: Walk) -> Walk:
    """The verified start: the launcher with trusted keys and an admin key."""
    extra = ("--trusted-keys", str(signed.trusted), "--admin-key", ADMIN_KEY, *LANE_KEY)
    signed.launcher = Launcher.start(serve_argv(signed, "server.log", *extra), signed.env)
    return signed


@pytest.fixture(autouse=True)
def first_server_alive(request: pytest.FixtureRequest) -> None:
    """Each step on the served walk starts with its server up; if Triton died in an earlier
    step, say how (its log from the crash on) instead of failing on the consequences."""
    if "served" not in request.fixturenames:
        return
    walk: Walk = request.getfixturevalue("served")
    if walk.launcher is None or walk.launcher.process.poll() is None:
        return
    log = (walk.root / "server.log").read_text(errors="replace").splitlines()
    crash = next((i for i, line in enumerate(log) if line.startswith("Signal (")), None)
    shown = log[crash : crash + 60] if crash is not None else log[-60:]
    pytest.fail(
        f"the launcher exited with {walk.launcher.process.returncode} in an earlier step; "
        "its last lines:\n" + "\n".join(walk.launcher.lines[-15:])
        + "\ntritonserver's log:\n" + "\n".join(shown)
    )  # fmt: skip


def serve_argv(walk: Walk, log: str, *extra: str) -> list[str]:
    """The command `make serve` runs, on the walk's ports and repository copy."""
    ports = walk.ports
    return [
        str(BIN / "python"), "-m", "dispatch_service.ops.server",
        "--model-repository", str(walk.repository),
        "--http-port", str(ports.http), "--grpc-port", str(ports.grpc),
        "--metrics-port", str(ports.metrics), "--log", str(walk.root / log),
        "--state-store", str(walk.store), *extra,
    ]  # fmt: skip


def versions_by_user(walk: Walk, model: str) -> dict[str, int]:
    """The version each of `USERS` is scored by on ``model``: one window of 100 orders."""
    document = json.loads(EXAMPLE.read_text())
    document.pop("model_version_tag", None)  # route by user, whatever the example forces
    order = document["orders"][0]
    document["orders"] = [{**order, "id": f"order-{n}", "user_id": u} for n, u in enumerate(USERS)]
    with DispatchClient.grpc(
        f"127.0.0.1:{walk.ports.grpc}", model_name=model, priority_key=PRIORITY_KEY
    ) as client:
        result = client.dispatch(window_from_json(json.dumps(document)))
    return {u: int(o.model_version or 0) for u, o in zip(USERS, result.orders, strict=True)}


def expected_versions(stable: int, canary: int, percent: int) -> dict[str, int]:
    """By hand: a user whose bucket is below the share gets the canary."""
    buckets = user_buckets(USERS)
    return {u: canary if b < percent else stable for u, b in zip(USERS, buckets, strict=True)}


def assert_routes(walk: Walk, stable: int, canary: int, percent: int, ready: list[int]) -> None:
    """status says the replica and each entry point route by the stored revision, and every
    entry point answers each user with the version that revision gives them."""
    status = walk.status()
    assert status["converged"] is True
    (replica,) = status["replicas"]
    assert replica["state"] == "current" and replica["entry_point_problems"] == []
    assert replica["revision"] == status["document"]["revision"]
    assert sorted(replica["entry_points"]) == sorted((*ENTRY_POINTS[1:], "dispatch_router"))
    wanted = expected_versions(stable, canary, percent)
    for model in ENTRY_POINTS:
        assert versions_by_user(walk, model) == wanted, model
    ready_now = lambda: list(ready_versions(walk.control_url, MODEL, ADMIN_KEY, 30.0))  # noqa: E731
    deadline = time.monotonic() + 30  # versions no longer named are unloaded 1 s after
    while ready_now() != ready and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ready_now() == ready


# ---- the walk --------------------------------------------------------------------------


def test_keygen_sign_all_and_verify(signed: Walk) -> None:
    keygen = signed.outputs["keygen"]
    assert keygen.returncode == 0, keygen.stderr
    assert keygen.stdout.startswith("key id ")
    assert f"private key {signed.home}/keys/ops.key (mode 0600" in keygen.stdout
    assert (signed.home / "keys" / "ops.key").stat().st_mode & 0o777 == 0o600

    sign_all = signed.outputs["sign-all"]
    assert sign_all.returncode == 0, sign_all.stderr
    assert "signed dispatch_router version 1: 1 file\n" in sign_all.stdout
    assert f"signed 7 version folders of 6 models in {signed.repository}" in sign_all.stdout

    verify = signed.outputs["verify"]
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "REFUSED" not in verify.stdout
    for entry_point in ("dispatch", "dispatch_fused"):
        assert f"{entry_point}: loads" in verify.stdout.splitlines()


def test_the_verified_start_says_ready_and_both_entry_points_answer(served: Walk) -> None:
    assert served.launcher is not None
    ready = served.launcher.wait_for("ready:", START_TIMEOUT_S)
    assert ready is not None, served.launcher.lines
    assert f"HTTP http://{served.http_url}" in ready
    assert any('"event": "signatures_verified"' in line for line in served.launcher.lines)
    assert not any("model_version_refused" in line for line in served.launcher.lines)
    for model in ("dispatch", "dispatch_fused"):
        done = served.client("--model", model, str(EXAMPLE))
        assert done.returncode == 0, done.stderr
        assert [o["order_id"] for o in json.loads(done.stdout)["orders"]] == [
            "order-1001",
            "order-1002",
        ]
    # No document yet: the repository's routing, every user on the stable version.
    status = served.status()
    assert status["document"]["revision"] is None
    assert [r["state"] for r in status["replicas"]] == ["current"]
    for model in ENTRY_POINTS:
        assert set(versions_by_user(served, model).values()) == {STABLE}, model


def test_deploy_routes_the_canary_and_status_says_so(served: Walk) -> None:
    out = served.change(
        "deploy", "--version", str(CANARY), "--canary-percent", "50", "--note", "first canary"
    )
    lines = out.splitlines()
    assert re.match(rf"{MODEL} version {STABLE}: ok: \d+ files verified \(key ", lines[0])
    assert re.match(rf"{MODEL} version {CANARY}: ok: \d+ files verified \(key ", lines[1])
    assert f"wrote revision 1 to {served.store}/fleet-state.json: deploy version {CANARY} " in out
    assert lines[-1] == "revision 1 routed by 1 of 1 replicas"
    assert_routes(served, STABLE, CANARY, 50, ready=[STABLE, CANARY])
    routed = f"stable version {STABLE}, canary version {CANARY} for 50%"
    assert served.status()["document"]["routed"] == routed


def test_the_canary_share_and_shadow_change_by_revision(served: Walk) -> None:
    served.change("canary", "--percent", "20")
    assert_routes(served, STABLE, CANARY, 20, ready=[STABLE, CANARY])
    served.change("shadow", "--version", str(CANARY), "--percent", "50")
    assert_routes(served, STABLE, CANARY, 20, ready=[STABLE, CANARY])
    assert "50% shadow-scored by 2" in served.status()["document"]["routed"]


def test_rollback_with_unload_in_one_step(served: Walk) -> None:
    out = served.change("rollback", "--unload-canary")
    assert "wrote revision 4" in out and "rollback with unload" in out
    assert_routes(served, STABLE, 0, 0, ready=[STABLE])


def test_deploy_again_then_promote(served: Walk) -> None:
    served.change("deploy", "--version", str(CANARY), "--canary-percent", "25")
    assert_routes(served, STABLE, CANARY, 25, ready=[STABLE, CANARY])
    served.change("promote", "--unload")
    assert_routes(served, CANARY, 0, 0, ready=[CANARY])


def test_history_and_restore_bring_back_a_known_good_revision(served: Walk) -> None:
    done = served.admin("history")
    assert done.returncode == 0, done.stderr
    kept = json.loads(done.stdout)["revisions"]
    assert [r["revision"] for r in kept] == [1, 2, 3, 4, 5, 6]
    assert kept[0]["note"] == f"deploy version {CANARY} as canary at 50%: first canary"
    served.change("restore", "--revision", "4")
    assert_routes(served, STABLE, 0, 0, ready=[STABLE])


def test_a_second_serve_on_the_same_ports_refuses_and_the_first_keeps_serving(
    served: Walk,
) -> None:
    # The operator runs the same command again: same ports, same log file.
    log = served.root / "server.log"
    before = log.stat().st_size
    extra = ("--trusted-keys", str(served.trusted), "--admin-key", ADMIN_KEY, *LANE_KEY)
    second = Launcher.start(serve_argv(served, "server.log", *extra), served.env)
    second.process.wait(timeout=START_TIMEOUT_S)
    assert second.stop() == 1
    assert not any(line.startswith("ready:") for line in second.lines)
    ports = served.ports
    refusal = next((line for line in second.lines if "already in use" in line), None)
    assert refusal is not None, second.lines
    assert refusal.startswith(f"error: port(s) {ports.http}, {ports.grpc}, {ports.metrics} on ")
    assert "nothing was started and no log or shared memory was touched" in refusal
    time.sleep(10)  # the first server died about 8 s after such a second start
    assert served.client(str(EXAMPLE)).returncode == 0
    assert log.stat().st_size >= before > 0  # the first one's log kept, not truncated


def test_ctrl_c_stops_the_server(served: Walk) -> None:
    assert served.launcher is not None
    assert served.launcher.stop() == 0
    # Ctrl-C drains first (bounded by --drain-timeout) and says for how long.
    last = served.launcher.lines[-1]
    assert re.fullmatch(r"tritonserver stopped \(drained \d+\.\d s\)", last), last
    done = served.client(str(EXAMPLE))
    assert done.returncode == 1 and "cannot reach" in done.stderr
