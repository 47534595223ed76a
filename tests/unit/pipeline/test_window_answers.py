"""The library's answers against answers recorded before its speed-ups (`perf.window_answers`).

The fixture holds simulator windows of every bench size, registered city and evaluation
regime, and a digest of every tensor the code of the day answered them with (outputs, pair
features, scores): a faster path must answer each byte for byte as the recorded one did.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch_service.pipeline.fused import FusedDispatch
from perf.window_answers import answer_digests, fused_dispatch, load_windows, mismatches

FIXTURE = Path(__file__).parent / "data" / "window_answers"


@pytest.fixture(scope="module")
def dispatch() -> FusedDispatch:
    return fused_dispatch()


def test_fixture_covers_every_size_city_and_regime() -> None:
    cases, recorded = load_windows(FIXTURE)
    labels = [label for label, _ in cases]
    assert set(labels) == set(recorded)
    assert {label.split("/")[0] for label in labels} == {
        "shanghai", "beijing", "shenzhen", "chengdu"
    }  # fmt: skip
    assert any(label.endswith("/large") for label in labels)
    assert sum("/1x20/" in label for label in labels) >= 40


def test_every_window_answered_as_recorded(dispatch: FusedDispatch) -> None:
    cases, recorded = load_windows(FIXTURE)
    assert mismatches(dispatch, cases, recorded) == []


def test_windows_of_one_execute_answered_as_recorded(dispatch: FusedDispatch) -> None:
    """`run_batch` (the small windows of one Triton execute together) answers as recorded."""
    cases, recorded = load_windows(FIXTURE)
    small = [(label, tensors) for label, tensors in cases if "/1x" in label]
    results = dispatch.run_batch([tensors for _, tensors in small])
    for (label, _), result in zip(small, results, strict=True):
        assert not isinstance(result, Exception), label
        assert answer_digests(result) == recorded[label], label


def test_a_changed_answer_is_caught(dispatch: FusedDispatch) -> None:
    """The comparison sees a single changed window: its digests are not the recorded ones."""
    cases, recorded = load_windows(FIXTURE)
    (first, tensors), (second, _) = cases[0], cases[1]
    assert mismatches(dispatch, [(second, tensors)], recorded)
    assert not mismatches(dispatch, [(first, tensors)], recorded)
