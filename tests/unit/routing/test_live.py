"""routing.live: the file a fleet replica's launcher writes, read by both entry points.

Each case writes a real file and checks what an instance routes by afterwards, against
settings built by hand.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dispatch_service.core.settings import SettingsError
from dispatch_service.routing.live import (
    LIVE_ROUTING_FIELDS,
    LiveRouting,
    read_routing_file,
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
        ('{"format": "other", "revision": 1, "parameters": {}}', "format must be"),
        ("[]", "format must be"),
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


def _document(path: Path, **parameters: str) -> None:
    write_routing_file(path, CANARY, revision=3)
    document = json.loads(path.read_text(encoding="utf-8"))
    document["parameters"].update(parameters)
    path.write_text(json.dumps(document), encoding="utf-8")


@pytest.mark.parametrize(
    ("parameters", "reason"),
    [
        ({"canary_percent": "101"}, "canary_percent"),
        ({"canary_percent": "ten"}, "canary_percent"),
        ({"city_routes": "atlantis:canary_percent=5"}, "atlantis"),
        ({"cpu_scoring": "1"}, "parameters must set exactly"),
    ],
)
def test_a_file_breaking_a_rule_is_refused_naming_it(
    tmp_path: Path, parameters: dict[str, str], reason: str
) -> None:
    path = tmp_path / "routing.json"
    _document(path, **parameters)

    def registered(settings: RouterSettings) -> None:
        settings.check_cities(["beijing", "shanghai"])

    live = LiveRouting(str(path), CONFIG, registered)
    change = live.poll()
    assert change is not None and reason in change.error
    assert live.settings == CONFIG


def test_a_missing_parameter_and_a_non_string_value_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "routing.json"
    write_routing_file(path, CANARY, revision=3)
    document = json.loads(path.read_text(encoding="utf-8"))
    del document["parameters"]["shadow_percent"]
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(SettingsError, match="parameters must set exactly"):
        read_routing_file(path, CONFIG)
    document["parameters"]["shadow_percent"] = 5
    path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(SettingsError, match="must be strings"):
        read_routing_file(path, CONFIG)


def test_a_removed_file_keeps_the_routing_in_force(tmp_path: Path) -> None:
    path = tmp_path / "routing.json"
    write_routing_file(path, CANARY, revision=1)
    live = LiveRouting(str(path), CONFIG)
    live.poll()
    os.unlink(path)
    assert live.poll() is None and live.settings.canary_version == 2
