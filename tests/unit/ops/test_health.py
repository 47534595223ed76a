"""Why an entry point is missing (dispatch_service.ops.health.explain_missing)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch_service.core.signing import Outcome, Verification
from dispatch_service.ops import health
from dispatch_service.ops.verified_load import LoadPlan


@pytest.fixture
def index(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = [
        {"name": "dispatch_fused", "version": "1", "state": "READY"},
        {"name": "dispatch", "state": "UNAVAILABLE", "reason": "unable to load step"},
    ]
    monkeypatch.setattr(health, "repository_index", lambda *a, **k: entries)
    return entries


def test_ready_models_are_not_missing_and_others_say_why(index: list[dict[str, Any]]) -> None:
    reasons = health.explain_missing("h:1", ["dispatch", "dispatch_fused", "nope"], "k", None)
    assert reasons == {
        "dispatch": "UNAVAILABLE: unable to load step",
        "nope": "not in the model repository",
    }


def test_refused_signatures_come_with_the_command_that_fixes_them(
    index: list[dict[str, Any]],
) -> None:
    refused = Verification(
        model="dispatch_model",
        version=2,
        outcome=Outcome.MISSING_MANIFEST,
        reason="no MANIFEST.json",
    )
    plan = LoadPlan(
        startup=(),
        refused={"dispatch": "step dispatch_model has no verified version"},
        verifications=(refused,),
    )
    (line,) = health.explain_missing("h:1", ["dispatch"], "k", plan).values()
    assert "refused by signature verification: step dispatch_model" in line
    assert "dispatch-admin sign --model dispatch_model --version 2 --key KEY" in line
