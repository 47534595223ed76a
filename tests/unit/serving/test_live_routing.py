"""serving.live_routing: an entry-point process reports the routing it reads, and looks at
the file while idle, so status sees a change without waiting for a request."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

from dispatch_service.routing.live import (
    LiveRouting,
    read_entry_points,
    routing_digest,
    write_routing_file,
)
from dispatch_service.routing.settings import RouterSettings
from dispatch_service.serving.live_routing import IDLE_POLL_S, follow_live_routing

CONFIG = RouterSettings(stable_version=1, scoring_versions=(1, 2))
CANARY = RouterSettings(1, 2, 30, scoring_versions=(1, 2))


class _Logger:
    lines: ClassVar[list[tuple[str, str]]] = []

    @classmethod
    def log_info(cls, line: str) -> None:
        cls.lines.append(("info", line))

    @classmethod
    def log_warn(cls, line: str) -> None:
        cls.lines.append(("warn", line))


class _PbUtils:
    Logger = _Logger


def _report(path: Path) -> dict[str, Any]:
    (report,) = read_entry_points(path)["dispatch_fused"]
    return report


def test_an_idle_process_follows_a_new_file_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "routing.json"
    live = LiveRouting(str(path), CONFIG)
    assert follow_live_routing(_PbUtils, live, model="dispatch_fused", instance="i0") == CONFIG
    assert _report(path)["revision"] is None and _report(path)["routing"] == ""
    write_routing_file(path, CANARY, 5)  # no request comes: the idle watch reads it
    deadline = time.monotonic() + 40 * IDLE_POLL_S
    while _report(path)["revision"] != 5:
        assert time.monotonic() < deadline, _report(path)
        time.sleep(IDLE_POLL_S / 2)
    assert _report(path)["routing"] == routing_digest(CANARY) and live.settings == CANARY
    assert any("live_routing_applied" in line for _, line in _Logger.lines)


def test_a_refused_file_is_reported_with_its_reason_and_the_old_routing(tmp_path: Path) -> None:
    path = tmp_path / "routing.json"
    write_routing_file(path, CANARY, 5)
    live = LiveRouting(str(path), CONFIG)
    follow_live_routing(_PbUtils, live, model="dispatch_fused", instance="i0")
    path.write_text("{broken", encoding="utf-8")
    follow_live_routing(_PbUtils, live, model="dispatch_fused", instance="i0")
    report = _report(path)
    assert report["revision"] == 5 and report["routing"] == routing_digest(CANARY)
    assert "not JSON" in report["error"]
