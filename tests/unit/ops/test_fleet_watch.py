"""The launcher's watch over the state store: apply, refuse, keep the last good, never flap.

The server side (`switch_state`, `retire_versions`) is replaced by a recorder: what is checked
here is which documents the watcher applies, refuses or tries again, and what it reports.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from dispatch_service.core.signing import TrustedKeys, generate_private_key
from dispatch_service.ops import fleet_watch
from dispatch_service.ops.fleet_apply import ApplyRefusedError, Switch
from dispatch_service.ops.fleet_state import FleetState, StateStore, sign_state
from dispatch_service.ops.fleet_watch import FleetWatcher
from dispatch_service.ops.model_control import ModelControlError
from dispatch_service.routing.settings import RouterSettings

KEY = generate_private_key()
TRUSTED = TrustedKeys.from_public_keys(KEY.public_key())


class Server:
    """Stands in for `switch_state` and `retire_versions`: records each revision applied
    and each retirement, fails when told."""

    def __init__(self) -> None:
        self.applied: list[int] = []
        self.retired: list[int] = []
        self.fail: Exception | None = None
        self.fail_retire: Exception | None = None
        self.watch: FleetWatcher | None = None  # what it reports is recorded at each retire
        self.reported_at_retire: list[tuple[str, int | None]] = []

    def switch(
        self, url: str, key: str | None, state: FleetState, verifier: Any, **_: Any
    ) -> Switch:
        if self.fail is not None:
            raise self.fail
        self.applied.append(state.revision)
        return Switch(True, state.model, {"revision": state.revision}, {"route": 0.0})

    def retire(self, url: str, key: str | None, switch: Switch) -> float:
        if self.fail_retire is not None:
            raise self.fail_retire
        assert switch.retire is not None
        if self.watch is not None:
            detail = self.watch.detail()
            self.reported_at_retire.append((detail["status"], detail["revision"]))
        self.retired.append(switch.retire["revision"])
        return 0.1


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Server:
    fake = Server()
    monkeypatch.setattr(fleet_watch, "switch_state", fake.switch)
    monkeypatch.setattr(fleet_watch, "retire_versions", fake.retire)
    monkeypatch.setattr(fleet_watch, "RETIRE_GRACE_S", 0.0)
    return fake


def document(revision: int, percent: int = 10) -> bytes:
    state = FleetState(revision, (1, 2), RouterSettings(1, 2, percent))
    return sign_state(state, KEY)


def watcher(tmp_path: Path, trusted: TrustedKeys | None = TRUSTED) -> FleetWatcher:
    return FleetWatcher(
        StateStore(tmp_path),
        "127.0.0.1:1",
        None,
        trusted,
        routing_file=tmp_path / "routing.json",
        report=lambda _: None,
    )


def test_no_document_serves_the_files(tmp_path: Path, server: Server) -> None:
    watch = watcher(tmp_path)
    watch.poll()
    assert watch.detail()["status"] == "no_document"
    assert watch.detail()["revision"] is None
    assert "dispatch_launcher_fleet_state_revision -1" in watch.metrics_text()
    assert server.applied == []


def test_a_new_revision_is_applied_once(tmp_path: Path, server: Server) -> None:
    store, watch = StateStore(tmp_path), watcher(tmp_path)
    store.write(document(1))
    watch.poll()
    watch.poll()
    assert server.applied == [1]
    detail = watch.detail()
    assert (detail["status"], detail["revision"], detail["applies"]) == ("current", 1, 1)
    assert "dispatch_launcher_fleet_state_revision 1" in watch.metrics_text()
    assert "dispatch_launcher_fleet_state_refused 0" in watch.metrics_text()
    store.write(document(2, 20))
    watch.poll()
    assert server.applied == [1, 2]


def test_a_tampered_document_is_refused_once_and_the_last_good_kept(
    tmp_path: Path, server: Server
) -> None:
    store, watch = StateStore(tmp_path), watcher(tmp_path)
    store.write(document(1))
    watch.poll()
    envelope = json.loads(document(2))
    envelope["state"] = envelope["state"].replace('"canary_percent":10', '"canary_percent":99')
    store.write(json.dumps(envelope).encode())
    for _ in range(5):
        watch.poll()
    detail = watch.detail()
    assert server.applied == [1]
    assert (detail["status"], detail["revision"], detail["refusals"]) == ("refused", 1, 1)
    assert detail["refused"]["document"] == str(store.document)
    assert detail["refused"]["code"] == "bad_signature"
    assert detail["refused"]["revision"] == 2
    metrics = watch.metrics_text()
    assert f'document="{store.document}",reason="bad_signature",revision="2"}} 1' in metrics
    store.write(document(1))  # the good bytes back: current again, nothing applied
    watch.poll()
    assert watch.detail()["status"] == "current" and server.applied == [1]


def test_an_older_or_equal_revision_is_refused(tmp_path: Path, server: Server) -> None:
    store, watch = StateStore(tmp_path), watcher(tmp_path)
    store.write(document(3))
    watch.poll()
    store.write(document(2))
    watch.poll()
    assert watch.detail()["refused"]["code"] == "stale_revision"
    store.write(document(3, 50))
    watch.poll()
    assert watch.detail()["refused"]["code"] == "stale_revision"
    assert server.applied == [3]


def test_without_trusted_keys_every_document_is_refused(tmp_path: Path, server: Server) -> None:
    StateStore(tmp_path).write(document(1))
    watch = watcher(tmp_path, trusted=None)
    watch.poll()
    assert watch.detail()["refused"]["code"] == "unverifiable"
    assert server.applied == []


def test_a_version_refused_by_its_signature_is_not_tried_again(
    tmp_path: Path, server: Server
) -> None:
    StateStore(tmp_path).write(document(1))
    server.fail = ApplyRefusedError("dispatch_model version 2 refused: digest mismatch")
    watch = watcher(tmp_path)
    watch.poll()
    server.fail = None
    watch.poll()
    assert server.applied == []
    assert watch.detail()["refused"]["code"] == "version_refused"


def test_a_server_failure_is_retried_after_a_bounded_backoff(
    tmp_path: Path, server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet_watch, "RETRY_WAITS_S", (0.0, 0.0))
    StateStore(tmp_path).write(document(1))
    server.fail = ModelControlError("connection refused")
    watch = watcher(tmp_path)
    watch.poll()
    assert watch.detail()["status"] == "retrying"
    watch.poll()
    watch.poll()  # the retries are spent: refused (the alert's condition), reported once
    assert watch.detail()["refused"]["code"] == "apply_failed"
    refusals = watch.detail()["refusals"]
    watch.poll()
    assert watch.detail()["refusals"] == refusals and server.applied == []
    assert watch.detail()["status"] == "refused"
    server.fail = None  # the cause is gone: the same bytes are tried again, and applied
    watch.poll()
    assert server.applied == [1]
    assert watch.detail()["status"] == "current" and watch.detail()["refused"] is None


def test_a_refused_revision_is_tried_again_at_once_after_a_server_restart(
    tmp_path: Path, server: Server
) -> None:
    StateStore(tmp_path).write(document(1))
    server.fail = ApplyRefusedError("dispatch_model version 2 refused: digest mismatch")
    watch = watcher(tmp_path)
    restarts = [0]
    watch._restarts = lambda: restarts[0]
    watch.poll()
    assert watch.detail()["refused"]["code"] == "version_refused"
    server.fail = None
    watch.poll()  # not due yet (RETRY_WAITS_S[-1])
    assert server.applied == []
    restarts[0] = 1
    watch.poll()
    assert server.applied == [1] and watch.detail()["status"] == "current"


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_a_document_that_is_no_bounded_regular_file_is_refused_and_the_watch_goes_on(
    tmp_path: Path, server: Server, kind: str
) -> None:
    store = StateStore(tmp_path)
    store.write(document(1))
    watch = watcher(tmp_path)
    watch.poll()
    store.document.unlink()
    if kind == "fifo":
        os.mkfifo(store.document)
    elif kind == "device":
        store.document.symlink_to("/dev/zero")
    else:
        with store.document.open("wb") as out:
            out.truncate(1 << 30)
    watch.poll()
    detail = watch.detail()
    assert detail["status"] == "refused" and detail["revision"] == 1
    assert detail["refused"]["code"] == ("too_large" if kind == "huge" else "not_regular")
    watch.poll()
    assert watch.detail()["refusals"] == 1  # reported once
    store.document.unlink()
    store.write(document(2))
    watch.poll()
    assert server.applied == [1, 2] and watch.detail()["status"] == "current"


def test_an_empty_file_counts_as_no_document(tmp_path: Path, server: Server) -> None:
    (tmp_path / "fleet-state.json").write_bytes(b"")
    watch = watcher(tmp_path)
    watch.poll()
    assert watch.detail()["status"] == "no_document"


def test_a_restarted_server_gets_the_served_revision_even_with_a_bad_document(
    tmp_path: Path, server: Server
) -> None:
    store, watch = StateStore(tmp_path), watcher(tmp_path)
    restarts = [0]
    watch._restarts = lambda: restarts[0]
    store.write(document(1))
    watch.poll()
    store.write(b"not a document")
    watch.poll()
    restarts[0] = 1  # the supervisor restarted Triton: it serves its files now
    watch.poll()
    assert server.applied == [1, 1]
    assert watch.detail()["revision"] == 1


def test_the_revision_is_reported_once_routed_before_old_versions_are_unloaded(
    tmp_path: Path, server: Server
) -> None:
    store, watch = StateStore(tmp_path), watcher(tmp_path)
    server.watch = watch
    store.write(document(1))
    watch.poll()
    store.write(document(2, 0))
    watch.poll()
    assert server.retired == [1, 2]
    assert server.reported_at_retire == [("current", 1), ("current", 2)]


def test_a_failed_unload_is_reported_and_the_revision_still_served(
    tmp_path: Path, server: Server
) -> None:
    events: list[str] = []
    store = StateStore(tmp_path)
    watch = FleetWatcher(
        store,
        "127.0.0.1:1",
        None,
        TRUSTED,
        routing_file=tmp_path / "routing.json",
        report=events.append,
    )
    server.fail_retire = ModelControlError("unload refused")
    store.write(document(1))
    watch.poll()
    watch.poll()
    detail = watch.detail()
    assert (detail["status"], detail["revision"], detail["refusals"]) == ("current", 1, 0)
    assert server.applied == [1]
    failed = [json.loads(e) for e in events if "fleet_state_retire_failed" in e]
    assert [(e["revision"], e["error"]) for e in failed] == [(1, "unload refused")]
