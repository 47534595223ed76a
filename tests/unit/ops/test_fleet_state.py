"""The fleet's state document: sign, verify, parse, reject; the store's files."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.signing import TrustedKeys, generate_private_key
from dispatch_service.ops.fleet_state import (
    ENVELOPE_FORMAT,
    FleetState,
    ReplicaReport,
    StateError,
    StateStore,
    deployed,
    initial_state,
    rolled_back,
    sign_state,
    verify_state,
)
from dispatch_service.routing.settings import CityRoute, RouterSettings

KEY = generate_private_key()
TRUSTED = TrustedKeys.from_public_keys(KEY.public_key())


def state(revision: int = 1, canary_version: int = 0, canary_percent: int = 0) -> FleetState:
    return FleetState(revision, (1, 2), RouterSettings(1, canary_version, canary_percent))


def envelope(data: bytes) -> dict[str, object]:
    document: dict[str, object] = json.loads(data)
    return document


def test_a_signed_state_verifies_and_reads_back_the_same() -> None:
    wanted = FleetState(
        4,
        (1, 2),
        RouterSettings(
            canary_version=2,
            canary_percent=10,
            shadow_percent=5,
            city_routes=(CityRoute("beijing", canary_percent=50),),
        ),
        note="deploy",
    )
    signed = verify_state(sign_state(wanted, KEY), TRUSTED)
    assert signed.state == wanted
    assert signed.state.routing.scoring_versions == (1, 2)
    assert len(signed.digest) == 64
    assert envelope(sign_state(wanted, KEY))["format"] == ENVELOPE_FORMAT


def test_cpu_scoring_is_each_nodes_own_not_the_documents() -> None:
    wanted = FleetState(1, (1,), RouterSettings(cpu_scoring=1))
    assert wanted.routing.cpu_scoring == 0
    assert "cpu_scoring" not in wanted.to_dict()["routing"]
    assert wanted.router_settings(cpu_scoring=1).cpu_scoring == 1


def test_a_changed_state_is_refused_as_a_bad_signature() -> None:
    document = envelope(sign_state(state(canary_version=2, canary_percent=10), KEY))
    document["state"] = str(document["state"]).replace('"canary_percent":10', '"canary_percent":90')
    with pytest.raises(StateError, match="bad signature") as caught:
        verify_state(json.dumps(document).encode(), TRUSTED)
    assert caught.value.code == "bad_signature"


def test_an_unknown_key_is_refused() -> None:
    other = generate_private_key()
    with pytest.raises(StateError, match="not trusted") as caught:
        verify_state(sign_state(state(), other), TRUSTED)
    assert caught.value.code == "unknown_key"


@pytest.mark.parametrize(
    ("change", "code"),
    [
        (lambda d: d.pop("signature"), "unsigned"),
        (lambda d: d.update(signature=""), "unsigned"),
        (lambda d: d.update(signature="not base64!"), "malformed"),
        (lambda d: d.update(algorithm="RSA"), "malformed"),
        (lambda d: d.update(extra=1), "malformed"),
    ],
)
def test_a_broken_envelope_is_refused_with_its_reason(change: object, code: str) -> None:
    document = envelope(sign_state(state(), KEY))
    change(document)  # type: ignore[operator]
    with pytest.raises(StateError) as caught:
        verify_state(json.dumps(document).encode(), TRUSTED)
    assert caught.value.code == code


def test_a_bare_state_is_refused_as_unsigned() -> None:
    with pytest.raises(StateError, match="unsigned") as caught:
        verify_state(state().to_text().encode(), TRUSTED)
    assert caught.value.code == "unsigned"


def test_not_json_is_refused() -> None:
    with pytest.raises(StateError, match="not JSON"):
        verify_state(b"\x00garbage", TRUSTED)


def _signed_document(document: dict[str, object]) -> bytes:
    text = json.dumps(document, sort_keys=True)
    return json.dumps(
        {
            "format": ENVELOPE_FORMAT,
            "algorithm": "Ed25519",
            "key_id": next(iter(TRUSTED.keys)),
            "signature": base64.b64encode(KEY.sign(text.encode())).decode(),
            "state": text,
        }
    ).encode()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("revision", "3", "revision must be an integer"),
        ("versions", [0], "versions must be a list of version numbers >= 1"),
        ("versions", [1], r"must include every routed version \(missing \[2\]\)"),
        ("routing", {"canary_percent": 101}, "canary_percent must be within"),
        ("routing", {"cpu_scoring": 1}, "unknown field"),
        ("routing", {"city_routes": "beijing"}, "city_routes"),
        ("unknown", 1, "unknown field"),
        ("format", "other/1", "format must be"),
    ],
)
def test_a_signed_state_that_breaks_a_rule_names_the_field(
    field: str, value: object, message: str
) -> None:
    document = state(canary_version=2, canary_percent=10).to_dict()
    if field == "routing":
        assert isinstance(value, dict)
        document["routing"] = {**document["routing"], **value}
    else:
        document[field] = value
    with pytest.raises(StateError, match=message):
        verify_state(_signed_document(document), TRUSTED)


def test_deploy_and_rollback_make_the_next_revisions() -> None:
    base = FleetState(0, (1,), RouterSettings())
    canary = deployed(base, 2, 10)
    assert canary.revision == 1
    assert canary.versions == (1, 2)
    assert (canary.routing.canary_version, canary.routing.canary_percent) == (2, 10)
    assert "canary at 10%" in canary.note
    back = rolled_back(canary)
    assert back.revision == 2
    assert back.routing.canary_version == 0 and back.versions == (1, 2)
    assert rolled_back(canary, unload=True).versions == (1,)
    with pytest.raises(StateError, match="stable version already"):
        deployed(base, 1, 10)
    with pytest.raises(StateError, match="canary_percent"):
        deployed(base, 2, 101)


def test_a_city_deploy_changes_that_city_only() -> None:
    base = FleetState(3, (1,), RouterSettings())
    canary = deployed(base, 2, 50, city="beijing")
    assert canary.routing.canary_version == 0
    assert canary.routing.for_city("beijing").canary_version == 2
    back = rolled_back(canary, city="beijing", unload=True)
    assert back.routing.for_city("beijing").canary_version == 0
    assert back.versions == (1,)


def test_the_initial_state_is_what_the_files_serve() -> None:
    first = initial_state(MODEL_REPOSITORY)
    assert first.revision == 0
    assert first.routing.stable_version in first.versions


def test_the_store_writes_atomically_and_lists_replicas(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "fleet")
    assert store.read() is None
    assert store.current(TRUSTED) is None
    with store.locked():
        store.write(sign_state(state(2), KEY))
    signed = store.current(TRUSTED)
    assert signed is not None and signed.state.revision == 2
    assert [p.name for p in store.path.iterdir() if p.name.startswith(".fleet")] == []
    report = ReplicaReport("host:9003", "http://127.0.0.1:9003", 2, "ab", "current", 1.0)
    store.register(report)
    assert store.replicas() == [report]
    (store.replicas_dir / "broken.json").write_text("{")
    assert store.replicas() == [report]
    with pytest.raises(StateError, match="replica id"):
        store.register(ReplicaReport("../x", "", None, "", "current", 0.0))
