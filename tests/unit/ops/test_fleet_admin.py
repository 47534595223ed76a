"""`dispatch-admin`'s routing commands: what is written, what is refused, exit codes.

No Triton: the store is a folder, the replicas are reports in it and, where a replica must
answer, a health endpoint serving a `/healthz` written here (what a launcher says of its
entry points). The lifecycle against live replicas: tests/integration/test_fleet.py.
"""

from __future__ import annotations

import http.server
import io
import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.core.signing import (
    TrustedKeys,
    generate_private_key,
    load_private_key,
    private_key_pem,
    public_key_pem,
    sign_version,
)
from dispatch_service.ops import admin
from dispatch_service.ops.fleet_state import (
    FleetState,
    ReplicaReport,
    StateStore,
    sign_state,
)
from dispatch_service.routing.live import routing_digest
from dispatch_service.routing.settings import RouterSettings


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    key = generate_private_key()
    key_file = tmp_path / "ops.key"
    key_file.write_bytes(private_key_pem(key))
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "ops.pub").write_bytes(public_key_pem(key.public_key()))
    return key_file, trusted


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return admin.main(list(argv), out=out), out.getvalue()


def rollback(store: Path, keys: tuple[Path, Path], *extra: str) -> tuple[int, str]:
    return run(
        "rollback", "--state-store", str(store), "--key", str(keys[0]),
        "--trusted-keys", str(keys[1]), "--model-repository", str(MODEL_REPOSITORY), *extra,
    )  # fmt: skip


def status(store: Path, keys: tuple[Path, Path], *extra: str) -> tuple[int, dict[str, object]]:
    code, text = run("status", "--state-store", str(store), "--trusted-keys", str(keys[1]), *extra)
    return code, json.loads(text) if text else {}


def stored(store: Path, keys: tuple[Path, Path]) -> FleetState:
    signed = StateStore(store).current(TrustedKeys.from_directory(keys[1]))
    assert signed is not None
    return signed.state


def stored_versions(store: Path, keys: tuple[Path, Path], revision: int) -> tuple[int, ...]:
    trusted = TrustedKeys.from_directory(keys[1])
    return StateStore(store).revision(revision, trusted).state.versions


def test_rollback_writes_the_next_signed_revision(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    store = tmp_path / "store"
    key = load_private_key(keys[0].read_bytes())
    canary = FleetState(4, (1, 2), RouterSettings(1, 2, 10, shadow_percent=5))
    StateStore(store).write(sign_state(canary, key))
    code, text = rollback(store, keys, "--unload-canary")
    assert code == 0, text
    assert f"wrote revision 5 to {store / 'fleet-state.json'}" in text
    state = stored(store, keys)
    assert (state.revision, state.versions) == (5, (1,))
    assert (state.routing.canary_version, state.routing.shadow_percent) == (0, 0)


def test_without_a_document_the_repository_files_are_the_base(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    code, text = rollback(tmp_path / "store", keys)
    assert code == 0, text
    assert stored(tmp_path / "store", keys).revision == 1


def test_status_without_a_document_reports_the_initial_routing(
    tmp_path: Path, keys: tuple[Path, Path], launcher: _Launcher
) -> None:
    """No revision yet: every entry point routes by the initial routing (version 1 for every
    user, the canary at 0 %), and status says so; a replica whose entry points all read it
    is current."""
    launcher.fleet_state = {
        "revision": None,
        "status": "no_document",
        "entry_points": {"dispatch_router": [{"pid": 1, "revision": None, "routing": ""}]},
    }
    code, document = status(tmp_path / "store", keys, "--replica", launcher.url)
    assert document["document"] == {
        "path": str(tmp_path / "store" / "fleet-state.json"),
        "revision": None,
        "note": "no revision yet: the initial routing",
        "routed": "stable version 1",
    }
    replicas = document["replicas"]
    assert isinstance(replicas, list)
    assert code == 0 and replicas[0]["state"] == "current"


def test_a_key_the_replicas_do_not_trust_is_refused(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    other = tmp_path / "other.key"
    other.write_bytes(private_key_pem(generate_private_key()))
    code, _ = rollback(tmp_path / "store", (other, keys[1]))
    assert code == 2
    assert not (tmp_path / "store" / "fleet-state.json").exists()


def test_a_tampered_document_is_never_built_on(tmp_path: Path, keys: tuple[Path, Path]) -> None:
    store = tmp_path / "store"
    assert rollback(store, keys)[0] == 0
    path = store / "fleet-state.json"
    envelope = json.loads(path.read_bytes())
    envelope["state"] = envelope["state"].replace('"revision":1', '"revision":7')
    path.write_text(json.dumps(envelope))
    tampered = path.read_bytes()
    assert rollback(store, keys)[0] == 2
    assert path.read_bytes() == tampered
    code, document = status(store, keys)
    assert code == 2
    assert "bad signature" in str(document["document"])
    # The runbook's fix: re-sign the known good revision as the next one (its versions'
    # folders verified first: a signed copy of them).
    repository = tmp_path / "repository"
    for version in stored_versions(store, keys, 1):
        folder = model_layout(repository, SCORING_MODEL).version(version)
        shutil.copytree(model_layout(MODEL_REPOSITORY, SCORING_MODEL).version(version), folder)
        sign_version(folder, load_private_key(keys[0].read_bytes()))
    code, text = run(
        "restore", "--state-store", str(store), "--key", str(keys[0]),
        "--trusted-keys", str(keys[1]), "--revision", "1",
        "--model-repository", str(repository),
    )  # fmt: skip
    assert code == 0, text
    restored = stored(store, keys)
    assert restored.revision == 8 and restored.note == "restore revision 1"  # above the 7
    code, history = run("history", "--state-store", str(store), "--trusted-keys", str(keys[1]))
    kept = json.loads(history)["revisions"]
    assert code == 0 and [r["revision"] for r in kept] == [1, 8]
    assert [r["stored"] for r in kept] == [False, True]


def test_status_lists_every_replica_and_exits_1_while_one_is_not_current(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    store = tmp_path / "store"
    assert rollback(store, keys)[0] == 0
    code, document = status(store, keys)
    assert code == 1 and document["replicas"] == [] and document["converged"] is False
    # A registered replica that answers nothing: unreachable while its report is fresh,
    # gone (not counted) once silent.
    report = ReplicaReport("host:1", "http://127.0.0.1:1", 1, "", "current", time.time())
    StateStore(store).register(report)
    code, document = status(store, keys, "--replica", "127.0.0.1:2")
    replicas = document["replicas"]
    assert isinstance(replicas, list)
    states = {r["health_url"]: r["state"] for r in replicas}
    assert states == {"http://127.0.0.1:1": "unreachable", "http://127.0.0.1:2": "unreachable"}
    assert code == 1
    StateStore(store).register(ReplicaReport("host:1", "http://127.0.0.1:1", 1, "", "x", 0.0))
    code, document = status(store, keys)
    replicas = document["replicas"]
    assert isinstance(replicas, list)
    assert [r["state"] for r in replicas] == ["gone"]
    assert code == 1  # no replica routes by the document


class _Launcher:
    """A health endpoint answering `/healthz` with the ``fleet_state`` it is given: what a
    launcher says of its revision and of each entry-point process (no Triton here)."""

    def __init__(self) -> None:
        self.fleet_state: dict[str, object] = {}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps({"fleet_state": owner.fleet_state}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def launcher() -> Iterator[_Launcher]:
    served = _Launcher()
    yield served
    served.server.shutdown()
    served.server.server_close()


def test_status_compares_each_entry_point_with_the_document(
    tmp_path: Path, keys: tuple[Path, Path], launcher: _Launcher
) -> None:
    store = tmp_path / "store"
    assert rollback(store, keys)[0] == 0
    state = stored(store, keys)
    digest = routing_digest(state.routing)

    def entry(pid: int, revision: int | None, routing: str, error: str = "") -> dict[str, object]:
        return {"pid": pid, "revision": revision, "routing": routing, "error": error}

    launcher.fleet_state = {
        "revision": 1,
        "status": "current",
        "entry_points": {
            "dispatch_router": [entry(10, 1, digest)],
            "dispatch_fused": [entry(11, 1, digest), entry(12, 1, digest)],
        },
    }
    code, document = status(store, keys, "--replica", launcher.url)
    replicas = document["replicas"]
    assert isinstance(replicas, list)
    assert code == 0 and replicas[0]["state"] == "current"
    # One process of dispatch_fused still routes by the initial routing: the replica differs.
    launcher.fleet_state["entry_points"] = {
        "dispatch_router": [entry(10, 1, digest)],
        "dispatch_fused": [entry(11, 1, digest), entry(12, None, "")],
    }
    code, document = status(store, keys, "--replica", launcher.url)
    replicas = document["replicas"]
    assert isinstance(replicas, list)
    assert code == 1 and replicas[0]["state"] == "entry_points_differ"
    assert replicas[0]["entry_point_problems"] == [
        "dispatch_fused pid 12 routes by revision None (routing the initial routing)"
    ]
    launcher.fleet_state["entry_points"] = {"dispatch_router": [entry(10, 1, digest, "bad")]}
    code, document = status(store, keys, "--replica", launcher.url)
    assert code == 1
    launcher.fleet_state = {"revision": 0, "status": "current", "entry_points": {}}
    code, document = status(store, keys, "--replica", launcher.url)
    replicas = document["replicas"]
    assert isinstance(replicas, list)
    assert code == 1 and replicas[0]["state"] == "behind"
