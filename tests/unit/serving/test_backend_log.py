"""Behaviour of dispatch_service.serving.backend_log: the stub's log lines and its region."""

from __future__ import annotations

import json

import pytest

from dispatch_service.serving.backend_log import log_event, seal_backend_region
from pb_stand_in import FakePbUtils


def test_a_log_event_is_one_sorted_json_line_at_its_level() -> None:
    pb = FakePbUtils()
    log_event(pb, "warn", model="m", event="x", count=3)
    ((level, line),) = pb.Logger.lines
    assert level == "warn"
    assert line == json.dumps({"count": 3, "event": "x", "model": "m"})


def test_the_region_is_sealed(monkeypatch: pytest.MonkeyPatch) -> None:
    sealed: list[str] = []
    monkeypatch.setattr(
        "dispatch_service.serving.backend_log.seal_own_region", lambda: sealed.append("x")
    )
    pb = FakePbUtils()
    seal_backend_region(pb, "topk_resolver")
    assert sealed == ["x"] and pb.Logger.lines == []


def test_a_region_that_cannot_be_sealed_is_logged_and_the_load_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse() -> None:
        raise PermissionError("/dev/shm/dispatchsrv_1_ab_x is not a region of this server")

    monkeypatch.setattr("dispatch_service.serving.backend_log.seal_own_region", refuse)
    pb = FakePbUtils()
    seal_backend_region(pb, "topk_resolver")
    ((level, line),) = pb.Logger.lines
    warning = json.loads(line)
    assert level == "warn"
    assert warning["event"] == "shm_region_not_sealed" and warning["model"] == "topk_resolver"
    assert warning["error"].startswith("PermissionError: /dev/shm/dispatchsrv_1_ab_x")
