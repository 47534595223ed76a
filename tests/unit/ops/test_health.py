"""Why an entry point is missing (dispatch_service.ops.health.explain_missing)."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from dispatch_client.errors import DispatchConnectionError, DispatchServerError
from dispatch_client.retry import NO_RETRY, RetryPolicy
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


class _Client:
    """Stands in for DispatchClient: records its priority and retry policy, raises what the
    test chose."""

    priorities: ClassVar[list[int | None]] = []
    retries: ClassVar[list[RetryPolicy | None]] = []
    error: ClassVar[Exception] = RuntimeError("unset")

    def __init__(
        self,
        transport: Any,
        model_name: str,
        priority: int | None = None,
        retry: RetryPolicy | None = None,
        priority_lane: str | None = "lane",
        priority_key: str | None = None,
    ) -> None:
        _Client.priorities.append(priority)
        _Client.retries.append(retry)

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def dispatch(self, window: Any) -> Any:
        raise _Client.error


@pytest.mark.parametrize(
    ("error", "busy"),
    [
        (DispatchServerError("Exceeds maximum queue size", "StatusCode.UNAVAILABLE"), True),
        (DispatchServerError("Request timeout expired", "StatusCode.UNAVAILABLE"), True),
        (DispatchConnectionError("no answer from x over gRPC within 2 s"), True),
        (DispatchServerError("ORDER_FIELDS: must be finite", "StatusCode.INVALID_ARGUMENT"), False),
        (DispatchServerError("Stub process is not healthy", "StatusCode.INTERNAL"), False),
        (RuntimeError("boom"), False),
    ],
)
def test_probes_go_first_in_line_and_say_when_they_failed_for_want_of_capacity(
    monkeypatch: pytest.MonkeyPatch, error: Exception, busy: bool
) -> None:
    monkeypatch.setattr(health, "DispatchClient", _Client)
    _Client.priorities, _Client.retries, _Client.error = [], [], error
    result = health.probe("127.0.0.1:1", "dispatch_fused", timeout_s=0.5)
    assert not result.ok and result.busy is busy
    assert _Client.priorities == [health.PROBE_PRIORITY] == [2]
    assert _Client.retries == [NO_RETRY]  # a probe's verdict is one send


class _Recorder:
    """A transport that records the model each window is sent to, and refuses it."""

    models: ClassVar[list[str]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def infer(self, model_name: str, *args: Any, **kwargs: Any) -> Any:
        _Recorder.models.append(model_name)
        raise DispatchServerError("Exceeds maximum queue size", "StatusCode.UNAVAILABLE")

    def close(self) -> None:
        pass


@pytest.mark.parametrize("model", ["dispatch", "dispatch_fused", "dispatch_priority"])
def test_a_probe_reaches_the_entry_point_it_names_not_the_priority_lane(
    monkeypatch: pytest.MonkeyPatch, model: str
) -> None:
    """The probe names its entry point; DispatchClient would send a level-1 window to the
    lane."""
    monkeypatch.setattr(health, "GrpcTransport", _Recorder)
    _Recorder.models = []
    assert health.probe("127.0.0.1:1", model, timeout_s=0.5).busy
    assert _Recorder.models == [model]


def test_the_probe_window_is_the_simulated_window_it_was_made_from() -> None:
    """The committed probe window is the simulator's window for seed 20 (2 orders, 4 riders);
    regenerate the file with `window_to_json` if the simulator or the contract changes."""
    import numpy as np

    from dispatch_service.domain.window import window_to_tensors
    from dispatch_service.offline.simulator import generate_window

    simulated = window_to_tensors(
        generate_window(np.random.default_rng(20), health.PROBE_ORDERS, health.PROBE_RIDERS)
    )
    served = health.probe_window()
    assert sorted(served) == sorted(simulated)
    for name, values in simulated.items():
        assert served[name].dtype == values.dtype, name
        np.testing.assert_array_equal(served[name], values, err_msg=name)


def test_the_launcher_never_imports_the_simulator() -> None:
    """Checked in a fresh interpreter: the launcher, its supervisor and a probe run without
    `dispatch_service.offline` (the import-linter contract holds the static imports)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import dispatch_service.ops.server\n"
        "from dispatch_service.ops import health\n"
        "health.probe_window()\n"
        "print(sorted(m for m in sys.modules if m.startswith('dispatch_service.offline')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout
