"""routing.live: the file a fleet replica's launcher writes, read by both entry points.

Each case writes a real file and checks what an instance routes by afterwards, against
settings built by hand.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from dispatch_service.core.settings import SettingsError
from dispatch_service.routing.live import (
    ENTRY_POINTS_DIR,
    LIVE_ROUTING_FIELDS,
    LiveRouting,
    read_entry_points,
    read_routing_file,
    routing_digest,
    write_entry_point,
    write_routing_file,
)
from dispatch_service.routing.settings import CityRoute, RouterSettings

CONFIG = RouterSettings(stable_version=1, cpu_scoring=1, bls_timeout_ms=500)
CANARY = RouterSettings(
    stable_version=1,
    canary_version=2,
    canary_percent=10,
    scoring_versions=(1, 2),
    city_routes=(CityRoute("beijing", canary_percent=50),),
)


def test_the_file_sets_every_routing_field_but_the_nodes_own_cpu_scoring(tmp_path: Path) -> None:
    path = tmp_path / "routing.json"
    write_routing_file(path, CANARY, revision=7)
    settings, revision = read_routing_file(path, CONFIG)
    assert revision == 7
    assert settings == RouterSettings(
        stable_version=1,
        canary_version=2,
        canary_percent=10,
        bls_timeout_ms=2000,  # the file's, not the config's 500
        scoring_versions=(1, 2),
        cpu_scoring=1,  # the config's: the GPU monitor sets it per node
        city_routes=(CityRoute("beijing", canary_percent=50),),
    )
    assert "cpu_scoring" not in LIVE_ROUTING_FIELDS
    assert oct(path.stat().st_mode & 0o777) == oct(0o600)
    assert [p.name for p in tmp_path.iterdir()] == ["routing.json"]  # no temporary left


def test_an_instance_serves_its_config_until_a_file_is_written(tmp_path: Path) -> None:
    path = tmp_path / "routing.json"
    live = LiveRouting(str(path), CONFIG)
    assert live.poll() is None and live.settings == CONFIG
    write_routing_file(path, CANARY, revision=1)
    change = live.poll()
    assert change is not None and not change.error
    assert change.record() == {"event": "live_routing_applied", "revision": 1}
    assert live.settings.canary_percent == 10 and live.settings.cpu_scoring == 1
    assert live.poll() is None  # unchanged file: one stat, nothing read
    write_routing_file(path, RouterSettings(stable_version=2, scoring_versions=(1, 2)), 2)
    change = live.poll()
    assert change is not None and live.settings.stable_version == 2 and live.revision == 2


def test_without_a_path_the_config_is_served() -> None:
    live = LiveRouting("", CONFIG)
    assert live.poll() is None and live.settings == CONFIG


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not JSON"),
        ('{"format": "other", "revision": 1, "routing": {}}', "format must be"),
        ("[]", "must hold exactly format, revision, routing"),
        ("revision", "not JSON"),
    ],
)
def test_a_file_that_cannot_be_read_keeps_the_last_good_routing(
    tmp_path: Path, text: str, reason: str
) -> None:
    path = tmp_path / "routing.json"
    write_routing_file(path, CANARY, revision=1)
    live = LiveRouting(str(path), CONFIG)
    live.poll()
    path.write_text(text, encoding="utf-8")
    change = live.poll()
    assert change is not None and reason in change.error
    assert change.record()["event"] == "live_routing_refused"
    assert live.settings.canary_percent == 10 and live.revision == 1
    assert live.poll() is None  # reported once per content


def _document(path: Path, **routing: object) -> None:
    write_routing_file(path, CANARY, revision=3)
    document = json.loads(path.read_text(encoding="utf-8"))
    document["routing"].update(routing)
    path.write_text(json.dumps(document), encoding="utf-8")


@pytest.mark.parametrize(
    ("routing", "reason"),
    [
        ({"canary_percent": 101}, "canary_percent"),
        ({"canary_percent": "10"}, "routing.canary_percent must be a whole number"),
        ({"city_routes": [{"city": "atlantis", "canary_percent": 5}]}, "atlantis"),
        ({"city_routes": "beijing:canary_percent=5"}, "city_routes must be a list"),
        ({"cpu_scoring": 1}, "unknown field(s) cpu_scoring"),
    ],
)
def test_a_file_breaking_a_rule_is_refused_naming_it(
    tmp_path: Path, routing: dict[str, object], reason: str
) -> None:
    path = tmp_path / "routing.json"
    _document(path, **routing)

    def registered(settings: RouterSettings) -> None:
        settings.check_cities(["beijing", "shanghai"])

    live = LiveRouting(str(path), CONFIG, registered)
    change = live.poll()
    assert change is not None and reason in change.error
    assert live.settings == CONFIG
    assert live.error == change.error and live.routing == ""


def test_a_missing_field_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "routing.json"
    write_routing_file(path, CANARY, revision=3)
    document = json.loads(path.read_text(encoding="utf-8"))
    del document["routing"]["shadow_percent"]
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(SettingsError, match=r"missing field\(s\) shadow_percent"):
        read_routing_file(path, CONFIG)


def test_a_fifo_in_the_files_place_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "routing.json"
    os.mkfifo(path)
    live = LiveRouting(str(path), CONFIG)
    change = live.poll()
    assert change is not None and "not a regular file" in change.error
    assert live.settings == CONFIG


def test_each_process_reports_the_routing_it_reads_and_dead_ones_are_dropped(
    tmp_path: Path,
) -> None:
    """`write_entry_point` / `read_entry_points`: what status sees of each entry point."""
    path = tmp_path / "routing.json"
    live = LiveRouting(str(path), CONFIG)
    write_entry_point(live, "dispatch_router", "dispatch_router_0")
    reports = read_entry_points(path)
    assert reports == {
        "dispatch_router": [
            {
                "model": "dispatch_router",
                "instance": "dispatch_router_0",
                "pid": os.getpid(),
                "revision": None,
                "routing": "",
                "error": "",
            }
        ]
    }
    write_routing_file(path, CANARY, revision=4)
    live.poll()
    write_entry_point(live, "dispatch_router", "dispatch_router_0")
    (report,) = read_entry_points(path)["dispatch_router"]
    assert report["revision"] == 4 and report["routing"] == routing_digest(CANARY)
    gone = tmp_path / ENTRY_POINTS_DIR / "dispatch_fused.999999999.json"
    gone.write_text(json.dumps({"model": "dispatch_fused", "pid": 999999999}))
    assert "dispatch_fused" not in read_entry_points(path) and not gone.exists()


def test_the_routing_digest_names_the_routing_not_the_nodes_cpu_scoring() -> None:
    assert routing_digest(CANARY) == routing_digest(replace(CANARY, cpu_scoring=1))
    assert routing_digest(CANARY) != routing_digest(replace(CANARY, canary_percent=11))
