"""`dispatch-admin rollback|status --state-store`: what is written, what is refused, exit codes.

No server: the store is a folder, the replicas are reports in it (and a health endpoint that
answers nothing). `deploy --state-store` runs the golden check: the fleet integration test
covers it.
"""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.signing import (
    TrustedKeys,
    generate_private_key,
    load_private_key,
    private_key_pem,
    public_key_pem,
)
from dispatch_service.ops import admin
from dispatch_service.ops.fleet_state import (
    FleetState,
    ReplicaReport,
    StateStore,
    sign_state,
)
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


def test_status_lists_every_replica_and_exits_1_while_one_is_not_current(
    tmp_path: Path, keys: tuple[Path, Path]
) -> None:
    store = tmp_path / "store"
    assert rollback(store, keys)[0] == 0
    code, document = status(store, keys)
    assert code == 0 and document["replicas"] == [] and document["converged"] is True
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
    assert code == 0


def test_one_server_or_the_fleet_must_be_named() -> None:
    code, _ = run("status")
    assert code == 2
