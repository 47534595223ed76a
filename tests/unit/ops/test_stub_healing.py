"""Stub deaths found and healed (dispatch_service.ops.stub_healing, a part of the
supervisor), against stand-in stubs and a stand-in repository API; the ``supervisor``
fixture is conftest.py's."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from supervisor_stand_ins import CountingServer, FakeServer, StandInRepository, ok_probes

from dispatch_service.core.repository_layout import ENCODER_MODEL, SCORING_MODEL, model_layout
from dispatch_service.core.settings import RELOAD_MARK_PARAMETER
from dispatch_service.core.signing import TrustedKeys, generate_private_key, sign_version
from dispatch_service.ops.model_control import ModelControlError
from dispatch_service.ops.stubs import zombie_stubs
from dispatch_service.ops.supervisor import Supervisor
from dispatch_service.ops.supervisor_state import SupervisorSettings
from dispatch_service.ops.verified_load import LoadVerifier


def test_the_stubs_of_a_crashed_server_are_not_counted_as_stub_deaths(
    supervisor: Supervisor,
) -> None:
    """Triton gone (a SIGSEGV while reloading, seen in CI) takes every stub with it: that is
    for the deep check to declare, not seven model reloads against a dead port."""
    events: list[str] = []
    supervisor.report = events.append
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    supervisor.server.process = ended  # type: ignore[misc]
    supervisor._stubs = {4242: ("dispatch_model", "1"), 4343: ("feature_encoder", "1")}
    supervisor._check_stubs()
    assert supervisor.state.restarts == Counter()
    assert supervisor._stubs == {}
    assert events == []


def test_stubs_are_left_alone_while_the_restart_policy_replaces_the_server(
    supervisor: Supervisor,
) -> None:
    """A new server's stubs come and go while it starts: none of that is a stub death. Nor
    is a stub lost while Triton cannot say what it serves (a server dying of a crash: its
    process still runs, its stubs are gone): that loss is judged at the next look."""
    events: list[str] = []
    supervisor.report = events.append
    repo = StandInRepository(_stub_repository_files())
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as running:
        try:
            supervisor.server.process = running  # type: ignore[misc]
            supervisor.state.restarting = True
            supervisor._stubs = {4242: ("feature_encoder", "1")}
            supervisor._check_stubs()
            assert events == [] and supervisor.state.restarts == Counter()
            supervisor.state.restarting = False  # outside a restart, Triton not answering
            supervisor._check_stubs()
            assert events == [] and supervisor.state.restarts == Counter()
            assert supervisor._stubs == {4242: ("feature_encoder", "1")}  # kept for the next
            # The next look, Triton answering that the version serves: a death.
            repo.index = [{"name": "feature_encoder", "version": "1", "state": "READY"}]
            supervisor.server.http_url = repo.url  # type: ignore[misc]
            supervisor._check_stubs()
            died = [json.loads(e) for e in events if '"stub_died"' in e]
            assert died[0]["pids"] == [4242] and supervisor.state.restarts["feature_encoder"]
        finally:
            running.kill()
            repo.close()


def _stub_repository_files() -> dict[str, dict[str, object]]:
    return {
        "feature_encoder": {"parameters": {"max_orders": {"string_value": "1024"}}},
        "dispatch_model": {"version_policy": {"specific": {"versions": [1, 2]}}},
    }


def _recovering_watcher(
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, dict[str, object]],
    report: Callable[[str], None],
) -> tuple[StandInRepository, Supervisor]:
    """A supervisor over a fake repository of ``files`` whose deep checks all pass: what a
    stub's recovery (`Supervisor._recover`) talks to."""
    repo = StandInRepository(files)
    server = CountingServer()
    server.http_url = repo.url  # type: ignore[misc]
    watcher = Supervisor(server, SupervisorSettings(health_port=0), report=report)
    monkeypatch.setattr(
        "dispatch_service.ops.stub_healing.deep_check", lambda *a: ok_probes("dispatch")
    )
    # The stand-in stubs are numbers, not processes: readiness by live stubs is tested
    # apart (test_a_stub_dead_since_the_last_look_makes_the_server_not_ready_at_once).
    monkeypatch.setattr(watcher, "_stubs_alive", lambda: True)
    return repo, watcher


def test_a_dead_stub_is_replaced_without_unloading_its_model_but_the_scorings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Unloading a model takes it away, and an ensemble running it (`dispatch` unknown for
    ~4 s, 45 % of requests failed when a feature_encoder stub died): it is loaded again with a
    new reload mark, which builds fresh instances while the model stays loaded. The scoring
    model, which the router answers for with its fallback, is unloaded, then loaded with its
    own config (faster)."""
    files = _stub_repository_files()
    repo, watcher = _recovering_watcher(monkeypatch, files, lambda line: None)
    try:
        watcher._recover("feature_encoder", [41])
        marked = repo.live["feature_encoder"]["parameters"]
        assert marked["max_orders"] == {"string_value": "1024"}  # type: ignore[index]
        first = marked[RELOAD_MARK_PARAMETER]  # type: ignore[index]
        watcher._recover("feature_encoder", [42])  # each reload differs from the last
        assert repo.live["feature_encoder"]["parameters"][RELOAD_MARK_PARAMETER] != first  # type: ignore[index]
        watcher._recover("dispatch_model", [43])
        assert repo.loads == [
            ("feature_encoder", "k"),
            ("feature_encoder", "k"),
            ("unload dispatch_model", "k"),
            ("dispatch_model", "k"),
        ]
        assert repo.live["dispatch_model"] == files["dispatch_model"]
        assert watcher.ready() and watcher.state.restarts["feature_encoder"] == 2
    finally:
        repo.close()


@pytest.mark.parametrize("model", ["feature_encoder", "dispatch_model"])
def test_a_failed_reload_is_tried_again_until_it_succeeds_or_the_waits_run_out(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """A dead stub's reload can fail once (a stub too slow to start on a busy machine); the
    model must not stay broken until the deep check declares the whole server dead."""
    events: list[dict[str, Any]] = []
    monkeypatch.setattr("dispatch_service.ops.stub_healing.RELOAD_RETRY_WAITS_S", (0.01, 0.01))
    repo, watcher = _recovering_watcher(
        monkeypatch, _stub_repository_files(), lambda line: events.append(json.loads(line))
    )
    unload = [(f"unload {model}", "k")] if model == "dispatch_model" else []
    try:
        repo.refuse_loads = 2
        watcher._recover(model, [41])
        # unloaded once (the scoring model), refused twice, loaded on the third attempt
        assert repo.loads == [*unload, *[(f"refused {model}", "k")] * 2, (model, "k")]
        reloads = [e for e in events if e["event"].startswith("model_reload")]
        assert [(e["event"], e["attempt"]) for e in reloads] == [
            ("model_reload_failed", 1),
            ("model_reload_failed", 2),
            ("model_reloaded", 3),
        ]
        assert reloads[0]["retry_in_s"] == 0.01 and "stub timeout" in reloads[0]["error"]
        assert watcher.ready()

        repo.loads, events[:] = [], []
        repo.refuse_loads = 5  # more failures than attempts: three tries, then the verdict
        watcher._recover(model, [42])
        assert repo.loads == [*unload, *[(f"refused {model}", "k")] * 3]
        last = [e for e in events if e["event"] == "model_reload_failed"][-1]
        assert last["attempt"] == 3 and last["retry_in_s"] is None
    finally:
        repo.close()


class _Stubs:
    """The stubs a supervisor sees (`Supervisor._current_stubs`), set by the test."""

    def __init__(self, stubs: dict[int, tuple[str, str]]) -> None:
        self.now = dict(stubs)

    def __call__(self) -> dict[int, tuple[str, str]]:
        return dict(self.now)


def _ready(*keys: tuple[str, str]) -> list[dict[str, str]]:
    return [{"name": m, "version": v, "state": "READY"} for m, v in keys]


ENCODER = ("feature_encoder", "1")


@pytest.fixture
def running() -> Iterator[subprocess.Popen[bytes]]:
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as process:
        try:
            yield process
        finally:
            process.kill()


def test_every_death_is_healed_however_close_and_stale_stubs_are_not_counted(
    monkeypatch: pytest.MonkeyPatch, running: subprocess.Popen[bytes]
) -> None:
    """Two instances; one dies, the reload brings two new ones and 2.51 leaves the old
    survivor running. The next death of a new instance is a death again, and healed."""
    files = {"feature_encoder": {"instance_group": [{"count": 2, "kind": "KIND_CPU"}]}}
    events: list[dict[str, Any]] = []
    repo, watcher = _recovering_watcher(monkeypatch, files, lambda e: events.append(json.loads(e)))
    repo.index = _ready(ENCODER)
    watcher.server.process = running  # type: ignore[misc]
    stubs = _Stubs({11: ENCODER, 12: ENCODER})
    monkeypatch.setattr(watcher, "_current_stubs", stubs)
    try:
        watcher._stubs = stubs()
        del stubs.now[11]  # killed
        stubs_after_reload = {12: ENCODER, 21: ENCODER, 22: ENCODER}  # 12: the stale survivor

        def load_brings_new_instances(*args: object, **kwargs: object) -> None:
            stubs.now = dict(stubs_after_reload)

        monkeypatch.setattr(
            "dispatch_service.ops.stub_healing.load_model",
            lambda *a, **k: (
                load_brings_new_instances(),
                repo.loads.append(("feature_encoder", "k")),
            ),
        )
        watcher._check_stubs()
        assert watcher.ready() and watcher.state.restarts["feature_encoder"] == 1
        assert watcher._stale == {12}
        # 3 s later (any time): a new instance dies.
        del stubs.now[21]
        stubs_after_reload = {12: ENCODER, 22: ENCODER, 31: ENCODER, 32: ENCODER}
        watcher._check_stubs()
        assert watcher.state.restarts["feature_encoder"] == 2 and watcher.ready()
        assert not any(e["event"] == "stub_retired" for e in events)
    finally:
        repo.close()


def test_a_death_during_another_models_recovery_is_found_at_the_next_look(
    monkeypatch: pytest.MonkeyPatch, running: subprocess.Popen[bytes]
) -> None:
    files = {"feature_encoder": {}, "topk_resolver": {}}
    repo, watcher = _recovering_watcher(monkeypatch, files, lambda line: None)
    resolver = ("topk_resolver", "1")
    repo.index = _ready(ENCODER, resolver)
    watcher.server.process = running  # type: ignore[misc]
    stubs = _Stubs({11: ENCODER, 12: resolver})
    monkeypatch.setattr(watcher, "_current_stubs", stubs)
    loads: list[str] = []

    def load(url: str, model: str, *args: object, **kwargs: object) -> None:
        loads.append(model)
        if model == "feature_encoder":  # meanwhile the resolver's stub dies
            stubs.now = {21: ENCODER}
        else:
            stubs.now[22] = resolver

    monkeypatch.setattr("dispatch_service.ops.stub_healing.load_model", load)
    try:
        watcher._stubs = stubs()
        del stubs.now[11]
        watcher._check_stubs()
        assert loads == ["feature_encoder"]
        watcher._check_stubs()  # the resolver's stub, lost while the encoder reloaded
        assert loads == ["feature_encoder", "topk_resolver"]
        assert watcher.state.restarts == Counter({"feature_encoder": 1, "topk_resolver": 1})
        assert watcher.ready()
    finally:
        repo.close()


def test_a_model_not_healed_keeps_the_server_not_ready_and_is_tried_again(
    monkeypatch: pytest.MonkeyPatch, running: subprocess.Popen[bytes]
) -> None:
    """Every reload attempt fails: the model stays not ready (never 'ready' with a dead
    instance) and is recovered again after a bounded wait, until it heals."""
    monkeypatch.setattr("dispatch_service.ops.stub_healing.RELOAD_RETRY_WAITS_S", ())
    monkeypatch.setattr("dispatch_service.ops.stub_healing.HEAL_RETRY_WAITS_S", (0.0,))
    events: list[dict[str, Any]] = []
    repo, watcher = _recovering_watcher(
        monkeypatch, {"feature_encoder": {}}, lambda e: events.append(json.loads(e))
    )
    repo.index = _ready(ENCODER)
    watcher.server.process = running  # type: ignore[misc]
    stubs = _Stubs({11: ENCODER})
    monkeypatch.setattr(watcher, "_current_stubs", stubs)
    refusals = [ModelControlError("HTTP 400: stub timeout", 400)] * 2

    def load(*args: object, **kwargs: object) -> None:
        if refusals:
            raise refusals.pop()
        stubs.now = {21: ENCODER}  # the new instance

    monkeypatch.setattr("dispatch_service.ops.stub_healing.load_model", load)
    try:
        watcher._stubs = stubs()
        stubs.now = {}
        watcher._check_stubs()  # the death: one attempt, refused
        assert not watcher.ready()
        assert watcher.snapshot()["unhealed"] == {"feature_encoder": "reload failed"}
        text = watcher.metrics_text()
        assert 'dispatch_launcher_unhealed{model="feature_encoder"} 1' in text
        watcher._check_stubs()  # tried again: refused again
        assert not watcher.ready()
        watcher._check_stubs()  # the next load succeeds and brings the instance
        assert watcher.ready() and watcher.snapshot()["unhealed"] == {}
        kinds = [e["event"] for e in events]
        assert kinds.count("model_not_healed") == 2 and kinds.count("model_recovery_retried") == 2
        assert watcher.state.restarts["feature_encoder"] == 1  # one death, three reloads
    finally:
        repo.close()


def _signed_repository(root: Path) -> tuple[Path, TrustedKeys]:
    key = generate_private_key()
    for model, versions in ((ENCODER_MODEL, (1,)), (SCORING_MODEL, (1, 2))):
        for version in versions:
            layout = model_layout(root, model)
            layout.version(version).mkdir(parents=True)
            layout.python_model(version).write_text(f"# {model} {version}\n")
            sign_version(layout.version(version), key)
    return root, TrustedKeys.from_public_keys(key.public_key())


def test_a_reload_never_loads_files_changed_since_they_were_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stub dies after its version's files changed on disk: the supervisor verifies before
    it reloads. The changed model is not loaded (it stays not ready, tried again later in
    case the files come back) and the refusal is logged with the digest of what was found."""
    model = "feature_encoder"
    repository, trusted = _signed_repository(tmp_path / "repo")
    events: list[dict[str, Any]] = []
    files = _stub_repository_files()
    repo, watcher = _recovering_watcher(monkeypatch, files, lambda e: events.append(json.loads(e)))
    watcher.verifier = LoadVerifier(repository, trusted)
    try:
        model_layout(repository, model).python_model(1).write_text(
            "import os  # not what was signed\n"
        )
        watcher._recover(model, [41])
        assert repo.loads == []
        assert not watcher.ready() and model in watcher.snapshot()["unhealed"]
        assert model in watcher._heal_due
        (refusal,) = [e for e in events if e["event"] == "model_load_refused"]
        changed = model_layout(repository, model).python_model(1).read_bytes()
        assert refusal["version"] == 1 and refusal["check"] == "digest_mismatch"
        assert refusal["file"] == "model.py"
        assert refusal["file_sha256"] == hashlib.sha256(changed).hexdigest()
        assert len(refusal["folder_sha256"]) == 64
    finally:
        repo.close()


def test_a_reload_leaves_out_a_canary_changed_since_it_was_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repository, trusted = _signed_repository(tmp_path / "repo")
    events: list[dict[str, Any]] = []
    repo, watcher = _recovering_watcher(
        monkeypatch, _stub_repository_files(), lambda e: events.append(json.loads(e))
    )
    watcher.verifier = LoadVerifier(repository, trusted)
    try:
        (model_layout(repository, SCORING_MODEL).version(2) / "extra.py").write_text(
            "print('hi')\n"
        )
        watcher._recover("dispatch_model", [41])
        assert repo.loads == [("unload dispatch_model", "k"), ("dispatch_model", "k")]
        assert repo.live["dispatch_model"]["version_policy"] == {"specific": {"versions": [1]}}
        (refusal,) = [e for e in events if e["event"] == "model_load_refused"]
        assert refusal["version"] == 2 and refusal["check"] == "unlisted_file"
        assert refusal["file"] == "extra.py"
    finally:
        repo.close()


def test_a_stub_running_code_that_does_not_verify_keeps_the_server_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running: subprocess.Popen[bytes]
) -> None:
    """Triton's repository API (behind the admin key) can load a model from uploaded files
    (a temporary folder outside the repository) or from files changed on disk, without the
    launcher: the new stub is reported with its digests and the server is not ready while
    it runs."""
    repository, trusted = _signed_repository(tmp_path / "repo")
    events: list[dict[str, Any]] = []
    watcher = Supervisor(
        FakeServer(),
        SupervisorSettings(health_port=0),
        report=lambda e: events.append(json.loads(e)),
        verifier=LoadVerifier(repository, trusted),
    )
    watcher.server.process = running  # type: ignore[misc]
    monkeypatch.setattr(watcher, "_stubs_alive", lambda: True)  # stand-in stubs
    uploaded = model_layout(tmp_path, "folderXYZ").python_model(1)
    uploaded.parent.mkdir(parents=True)
    uploaded.write_text("import os\n")
    signed = model_layout(repository, ENCODER_MODEL).python_model(1)
    files = {21: uploaded, 22: signed}
    stubs = _Stubs({11: ENCODER})
    monkeypatch.setattr(watcher, "_current_stubs", stubs)
    monkeypatch.setattr(
        "dispatch_service.ops.stub_healing.stub_model_files", lambda parent: dict(files)
    )
    watcher._stubs = stubs()
    stubs.now = {11: ENCODER, 21: ("folderXYZ", "1"), 22: ENCODER}
    monkeypatch.setattr(watcher, "_deaths", lambda lost, now: {})
    watcher._check_stubs()
    (found,) = [e for e in events if e["event"] == "unverified_code_running"]
    assert found["pid"] == 21 and "outside the model repository" in found["reason"]
    assert found["file_sha256"] == hashlib.sha256(b"import os\n").hexdigest()
    assert not watcher.ready()
    assert watcher.snapshot()["unhealed"] == {"folderXYZ": "running code that does not verify"}
    stubs.now = {11: ENCODER, 22: ENCODER}  # unloaded: the server is ready again
    watcher._check_stubs()
    assert watcher.ready()
    # A stub started from repository files changed since they were signed.
    signed.write_text("import os  # changed\n")
    stubs.now = {11: ENCODER, 22: ENCODER, 23: ENCODER}
    files[23] = signed
    watcher._check_stubs()
    assert events[-1]["event"] == "unverified_code_running" and events[-1]["pid"] == 23
    assert events[-1]["check"] == "digest_mismatch" and not watcher.ready()


def test_two_stubs_found_dead_at_one_look_count_as_two_deaths_healed_by_one_reload(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo, watcher = _recovering_watcher(monkeypatch, _stub_repository_files(), lambda e: None)
    try:
        watcher._recover("feature_encoder", [41, 42])
        assert repo.loads == [("feature_encoder", "k")]
        assert watcher.state.restarts["feature_encoder"] == 2
        assert 'dispatch_launcher_stub_restarts_total{model="feature_encoder"} 2' in (
            watcher.metrics_text()
        )
    finally:
        repo.close()


class _StubParent:
    """A process standing in for tritonserver: two children named like Python-backend stubs
    (a link named after the stub to `sleep`), never reaped, as 2.51 never reaps a dead one."""

    def __init__(self, folder: Path) -> None:
        stub = folder / "triton_python_backend_stub"
        stub.symlink_to("/bin/sleep")
        script = (
            "import subprocess, sys, time\n"
            f"kids = [subprocess.Popen([{str(stub)!r}, '60']) for _ in range(2)]\n"
            "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
            "time.sleep(60)\n"
        )
        self.process = subprocess.Popen(
            [sys.executable, "-c", script], stdout=subprocess.PIPE, start_new_session=True
        )
        assert self.process.stdout is not None
        self.children = [int(pid) for pid in self.process.stdout.readline().split()]

    def kill_child(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        for _ in range(500):  # bounded: until it is a zombie
            if zombie_stubs(self.process.pid).count(pid):
                return
            time.sleep(0.01)
        raise AssertionError(f"{pid} did not become a zombie")

    def close(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        assert self.process.stdout is not None
        self.process.stdout.close()


@pytest.fixture
def stub_parent(tmp_path: Path) -> Iterator[_StubParent]:
    parent = _StubParent(tmp_path)
    try:
        yield parent
    finally:
        parent.close()


def test_a_stub_dead_since_the_last_look_makes_the_server_not_ready_at_once(
    stub_parent: _StubParent,
) -> None:
    """/readyz answered 200 for 0.07-0.33 s with a stub missing: between two polls. Readiness
    looks at the serving stubs each time it is asked."""
    server = CountingServer()
    server.process = stub_parent.process  # type: ignore[assignment]
    watcher = Supervisor(server, SupervisorSettings(health_port=0), report=lambda line: None)
    first, second = stub_parent.children
    watcher._stubs = {first: ("dispatch_fused", "1"), second: ("dispatch_fused", "1")}
    assert watcher.ready()
    stub_parent.kill_child(first)  # no poll of the stubs since
    assert not watcher.ready() and not watcher.snapshot()["ready"]
    watcher._stale = {first}  # a replaced instance's stub, ended on purpose: serves nothing
    assert watcher.ready()


def test_a_stub_found_dead_keeps_the_server_not_ready_while_its_death_is_judged(
    stub_parent: _StubParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At load 20 /readyz answered 200 0.11 s after a stub was killed, and a window sent then
    failed on the dead instance: the look that found it dropped it from the watched stubs
    before asking Triton what it serves, and its model was marked recovering only after."""
    server = CountingServer()
    server.process = stub_parent.process  # type: ignore[assignment]
    watcher = Supervisor(server, SupervisorSettings(health_port=0), report=lambda line: None)
    first, second = stub_parent.children
    watcher._stubs = {first: ("dispatch_fused", "1"), second: ("dispatch_fused", "1")}
    stub_parent.kill_child(first)
    ready_while_judged: list[bool] = []

    def judged(lost: dict[int, Any], now: dict[int, Any]) -> dict[str, list[int]]:
        ready_while_judged.append(watcher.ready())
        return {"dispatch_fused": sorted(lost)}

    recovered: list[tuple[str, list[int]]] = []
    monkeypatch.setattr(watcher, "_deaths", judged)
    monkeypatch.setattr(watcher, "_recover", lambda model, pids: recovered.append((model, pids)))
    watcher._check_stubs()
    assert recovered == [("dispatch_fused", [first])]
    assert ready_while_judged == [False]


def test_a_server_holding_dead_stubs_is_restarted_at_the_limit_or_after_their_age(
    stub_parent: _StubParent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2.51 never reaps a dead stub, never ends the replaced instances' stubs, nor frees what
    a reload after a death costs it: 1,000 wrapped-shape requests would leave thousands of
    them. A clean restart releases them."""
    monkeypatch.setattr(
        "dispatch_service.ops.supervisor.deep_check", lambda *a: ok_probes("dispatch")
    )
    server = CountingServer()
    server.process = stub_parent.process  # type: ignore[assignment]
    events: list[dict[str, Any]] = []
    settings = SupervisorSettings(
        health_port=0, stub_leak_limit=2, stub_leak_max_age_s=3600.0, drain_grace_s=0.0
    )
    watcher = Supervisor(server, settings, report=lambda e: events.append(json.loads(e)))
    first, second = stub_parent.children
    assert watcher._leak_restart_reason() is None
    stub_parent.kill_child(first)
    assert watcher._leak_restart_reason() is None  # one, just now
    assert watcher.snapshot()["leaked_stubs"] == 1
    watcher._last_death = time.monotonic()
    watcher.settings = replace(settings, stub_leak_max_age_s=0.0)
    assert watcher._leak_restart_reason() is None  # old enough, but a stub died just now
    watcher._last_death -= 60.0
    assert "for 0 s" in str(watcher._leak_restart_reason())
    watcher.settings = settings
    watcher._stale = {second}  # a replaced instance's stub, left running by 2.51: counted
    reason = str(watcher._leak_restart_reason())
    assert "2 dead or stale stubs held by tritonserver (limit 2)" in reason
    assert watcher._check_health()
    assert server.calls == ["stop", "start"]
    snapshot = watcher.snapshot()
    assert snapshot["leak_restarts"] == 1 and snapshot["server_restarts"] == 1
    assert [e["event"] for e in events][:1] == ["server_restart_for_leaks"]


def test_a_server_that_died_since_the_last_check_is_not_ready_at_once(tmp_path: Path) -> None:
    """A crash at a short-deadline burst's tail answered /readyz 200 until the next check."""
    server = CountingServer()
    watcher = Supervisor(server, SupervisorSettings(health_port=0), report=lambda line: None)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as triton:
        server.process = triton  # type: ignore[assignment]
        assert watcher.ready()
        triton.send_signal(signal.SIGSEGV)
        triton.wait(timeout=30)
        assert not watcher.ready() and not watcher.snapshot()["ready"]
