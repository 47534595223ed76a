"""fleet_revisions: each lifecycle change as the next signed revision, and the way back.

Every expected routing is written out by hand; the store is a real folder.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dispatch_service.core.signing import TrustedKeys, generate_private_key
from dispatch_service.ops.fleet_revisions import (
    canary_share,
    deployed,
    promoted,
    restore_revision,
    rolled_back,
    shadowed,
    write_revision,
)
from dispatch_service.ops.fleet_state import FleetState, StateError, StateStore
from dispatch_service.routing.settings import CityRoute, RouterSettings

KEY = generate_private_key()
TRUSTED = TrustedKeys.from_public_keys(KEY.public_key())
FILES = FleetState(0, (1,), RouterSettings(stable_version=1), note="the repository's files")


def write(store: StateStore, change: object, note: str = "test") -> FleetState:
    signed = write_revision(store, change, note, KEY, trusted=TRUSTED, initial=lambda: FILES)  # type: ignore[arg-type]
    return signed.state


def test_the_lifecycle_from_canary_to_stable_is_one_revision_per_step(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    canary = write(store, deployed(2, 10), "deploy v2")
    assert (canary.revision, canary.versions, canary.note) == (1, (1, 2), "deploy v2")
    assert canary.routing == RouterSettings(1, 2, 10, scoring_versions=(1, 2))
    wider = write(store, canary_share(50))
    assert wider.revision == 2 and wider.routing == RouterSettings(
        1, 2, 50, scoring_versions=(1, 2)
    )
    shadow = write(store, shadowed(2, 20))
    assert shadow.routing == RouterSettings(1, 2, 50, 20, scoring_versions=(1, 2))
    stable = write(store, promoted(unload=True))
    assert stable.revision == 4 and stable.versions == (2,)
    assert stable.routing == RouterSettings(2, 0, 0, 0, scoring_versions=(2,))
    assert [kept.revision for kept in store.history(TRUSTED)] == [1, 2, 3, 4]


def test_shadow_of_a_version_without_a_canary_routes_no_user_to_it(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    shadow = write(store, shadowed(2, 5))
    assert shadow.routing == RouterSettings(1, 2, 0, 5, scoring_versions=(1, 2))
    with pytest.raises(StateError, match="is the stable version"):
        write(store, shadowed(1, 5))
    write(store, deployed(3, 10))  # version 3 the canary now, shadowing ends with it
    with pytest.raises(StateError, match="version 3 is the canary at 10%"):
        write(store, shadowed(2, 5))


def test_one_city_at_a_time(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    write(store, deployed(2, 10, city="beijing"))
    raised = write(store, canary_share(30, city="beijing"))
    assert raised.routing.city_routes == (
        CityRoute("beijing", canary_version=2, canary_percent=30),
    )
    assert raised.routing.canary_version == 0
    promoted_city = write(store, promoted(city="beijing"))
    assert promoted_city.routing.for_city("beijing").stable_version == 2
    assert promoted_city.routing.for_city("shanghai").stable_version == 1
    assert promoted_city.versions == (1, 2)  # both still routed: neither may be unloaded
    back = write(store, rolled_back(city="beijing", unload=True))
    assert back.versions == (1, 2)  # beijing's stable is 2 now; a rollback keeps it
    with pytest.raises(StateError, match="no canary in beijing"):
        write(store, canary_share(10, city="beijing"))


def test_a_rollback_unloads_only_what_no_route_names(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    write(store, deployed(2, 10))
    write(store, deployed(3, 10, city="beijing"))
    back = write(store, rolled_back(city="beijing", unload=True))
    assert back.versions == (1, 2)  # 2 is still the global canary
    assert write(store, rolled_back(unload=True)).versions == (1,)


def test_nothing_is_written_for_a_bad_change_an_untrusted_key_or_no_note(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    with pytest.raises(StateError, match="canary_percent must lie in"):
        write(store, deployed(2, 101))
    with pytest.raises(StateError, match="no canary to promote"):
        write(store, promoted())
    with pytest.raises(StateError, match="needs a note"):
        write(store, rolled_back(), " ")
    other = generate_private_key()
    with pytest.raises(StateError, match="not among the trusted keys") as refused:
        write_revision(store, rolled_back(), "x", other, trusted=TRUSTED, initial=lambda: FILES)
    assert refused.value.code == "unknown_key"
    assert store.read() is None and store.history(TRUSTED) == []


def test_a_check_refuses_before_anything_is_written(tmp_path: Path) -> None:
    store = StateStore(tmp_path)

    def refuse(base: FleetState, proposed: FleetState) -> None:
        assert (base.revision, proposed.versions) == (0, (1, 2))
        raise StateError("golden check failed")

    with pytest.raises(StateError, match="golden"):
        write_revision(
            store, deployed(2, 10), "x", KEY, trusted=TRUSTED, initial=lambda: FILES, check=refuse
        )
    assert store.read() is None


def test_a_tampered_document_is_not_built_on_but_a_kept_revision_restores(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    good = write(store, deployed(2, 10))
    write(store, canary_share(20))
    store.document.write_bytes(store.document.read_bytes().replace(b"20", b"90"))
    with pytest.raises(StateError, match=r"does not verify .* restore a kept revision"):
        write(store, rolled_back())
    restored = restore_revision(store, 1, KEY, trusted=TRUSTED).state
    assert restored.revision == 3 and restored.note == "restore revision 1"
    assert (restored.versions, restored.routing) == (good.versions, good.routing)
    store.document.unlink()  # lost: the next revision still follows the kept ones
    assert restore_revision(store, 3, KEY, trusted=TRUSTED, note="again").state.revision == 4
    with pytest.raises(StateError, match="not kept"):
        restore_revision(store, 9, KEY, trusted=TRUSTED)


def test_two_writers_at_once_never_build_on_the_same_revision(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    write(store, deployed(2, 0))
    errors: list[BaseException] = []

    def raise_share(percent: int) -> None:
        try:
            write(StateStore(tmp_path), canary_share(percent))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=raise_share, args=(p,)) for p in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert [kept.revision for kept in store.history(TRUSTED)] == list(range(1, 10))
