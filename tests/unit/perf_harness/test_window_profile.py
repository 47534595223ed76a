"""perf.window_profile: where one window's time goes, function by function (cProfile)."""

from __future__ import annotations

import pytest

from perf.window_profile import format_profile, profile_windows
from perf.windows import WindowSize

TINY = WindowSize("tiny", 1, 3, 2)


def test_a_tiny_window_s_calls_are_counted_per_window() -> None:
    profile = profile_windows(TINY, windows=4)
    assert (profile.size, profile.windows) == ("tiny", 4)
    names = [cost.name for cost in profile.functions]
    # the library's path is in it, each function's calls per window (run: once per window)
    run = next(
        cost for cost in profile.functions if cost.name.endswith("(run)") and "fused" in cost.name
    )
    assert run.calls == 1.0 and run.cumulative_us >= run.own_us > 0
    assert any("encode_pairs" in name for name in names)
    assert profile.calls_per_window == pytest.approx(sum(c.calls for c in profile.functions))
    own = [cost.own_us for cost in profile.functions]
    assert own == sorted(own, reverse=True)
    text = format_profile(profile, top=3)
    lines = text.splitlines()
    assert lines[0].startswith("tiny: 4 windows, ") and "calls" in lines[0]
    assert len(lines) == 2 + 3
    # the dearest by cumulative time is the outermost call: FusedDispatch.run
    top = format_profile(profile, top=1, sort="cumulative").splitlines()[-1]
    assert "pipeline/fused.py:" in top and top.endswith("(run)")


def test_a_count_below_one_and_an_unknown_sort_are_refused() -> None:
    with pytest.raises(ValueError, match="windows"):
        profile_windows(TINY, windows=0)
    profile = profile_windows(TINY, windows=1)
    with pytest.raises(ValueError, match="sort"):
        format_profile(profile, sort="calls")


def test_the_general_steps_are_profiled_without_the_small_window_path() -> None:
    small = profile_windows(TINY, windows=2)
    general = profile_windows(TINY, windows=2, small_windows=False)
    assert any("small_window.py" in cost.name for cost in small.functions)
    assert not any("small_window.py" in cost.name for cost in general.functions)
    assert small.calls_per_window < general.calls_per_window
