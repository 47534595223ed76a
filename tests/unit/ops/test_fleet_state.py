"""The fleet's state document: sign, verify, parse, reject; the store's files."""

from __future__ import annotations

import base64
import json
import os
import resource
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
    claimed_revision,
    initial_state,
    read_regular,
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
        ("routing", {"city_routes": "beijing:canary_percent=5"}, "city_routes must be a list"),
        (
            "routing",
            {"city_routes": [{"city": "beijing", "share": 5}]},
            r"unknown field\(s\) share",
        ),
        ("routing", {"city_routes": [{"city": "beijing", "canary_percent": "5"}]}, "whole number"),
        ("routing", {"scoring_versions": [1, 2]}, "the document's versions"),
        ("routing", {"stable_version": None}, "stable_version must be a whole number"),
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


def test_city_routes_are_stored_as_objects() -> None:
    wanted = FleetState(
        1,
        (1, 2),
        RouterSettings(city_routes=(CityRoute("beijing", canary_version=2, canary_percent=5),)),
    )
    routing = wanted.to_dict()["routing"]
    assert routing["city_routes"] == [{"city": "beijing", "canary_version": 2, "canary_percent": 5}]
    assert verify_state(sign_state(wanted, KEY), TRUSTED).state == wanted


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


def test_the_store_keeps_the_last_revisions_and_lists_them_verified(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "fleet")
    for revision in range(1, 26):
        store.write(sign_state(state(revision), KEY), revision)
    kept = store.history(TRUSTED)
    assert [k.revision for k in kept] == list(range(6, 26))  # KEEP_REVISIONS = 20
    assert all(k.signed is not None for k in kept)
    assert store.revision(24, TRUSTED).state.revision == 24
    with pytest.raises(StateError, match="not kept"):
        store.revision(3, TRUSTED)
    copy = store.path / "revisions" / f"{25:010d}.json"
    copy.write_bytes(copy.read_bytes().replace(b"revision", b"revisiom"))
    assert store.history(TRUSTED)[-1].signed is None
    store.document.write_text('{"state": "{\\"revision\\": 90}"}')
    assert claimed_revision(store.document.read_bytes()) == 90
    assert store.next_revision() == 91  # above what a tampered document claims


def _rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.mark.parametrize("kind", ["fifo", "device", "huge", "folder"])
def test_only_a_bounded_regular_file_is_read(tmp_path: Path, kind: str) -> None:
    """A FIFO (would block), /dev/zero (endless), a 1 GiB file (sparse: no disk) and a folder
    in the document's place: refused by name before a byte is read; peak RSS unchanged."""
    store = StateStore(tmp_path / "fleet")
    store.path.mkdir()
    if kind == "fifo":
        os.mkfifo(store.document)
    elif kind == "device":
        store.document.symlink_to("/dev/zero")
    elif kind == "huge":
        with store.document.open("wb") as out:
            out.truncate(1 << 30)
    else:
        store.document.mkdir()
    before = _rss_kib()
    with pytest.raises(StateError) as refused:
        store.read()
    assert _rss_kib() - before < 16 * 1024  # far below the 1 GiB a whole read would take
    expected = {
        "fifo": "a FIFO",
        "device": "a character device",
        "huge": "larger than",
        "folder": "a folder",
    }
    assert expected[kind] in str(refused.value) and str(store.document) in str(refused.value)
    assert refused.value.code == ("too_large" if kind == "huge" else "not_regular")


def test_a_regular_file_at_the_limit_is_read_and_one_byte_more_is_not(tmp_path: Path) -> None:
    path = tmp_path / "doc"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, 100) == b"x" * 100
    with pytest.raises(StateError, match="larger than 99"):
        read_regular(path, 99)
    assert read_regular(tmp_path / "absent", 100) == b""
