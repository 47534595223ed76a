"""perf.window_ab: two libraries in one process, each run with its own modules."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from perf.window_ab import ab_costs, format_costs, load_library
from perf.windows import WindowSize, simulated_windows

TINY = WindowSize("tiny", 1, 3, 2)
CHECKOUT = Path(__file__).resolve().parents[3]


@pytest.fixture
def restored_modules() -> Iterator[None]:
    """The second library's modules leave with the test (later tests import the originals)."""
    before = dict(sys.modules)
    yield
    for name in [name for name in sys.modules if name not in before]:
        del sys.modules[name]
    sys.modules.update(before)


@pytest.mark.usefixtures("restored_modules")
def test_a_second_copy_of_a_library_runs_with_its_own_modules() -> None:
    windows = simulated_windows(TINY)
    this = load_library(None, windows)
    base = load_library(CHECKOUT, windows)  # the same files, imported a second time
    fused = "dispatch_service.pipeline.fused"
    assert base.modules[fused] is not this.modules[fused]
    assert base.origin == this.origin
    assert base.run.__self__.encoder.__class__ is not this.run.__self__.encoder.__class__
    costs = ab_costs(base, this, windows, calls=6)
    assert sys.modules[fused] is this.modules[fused]  # this library's modules are back
    assert set(costs) == {
        "base_cpu_us", "this_cpu_us", "base_wall_us", "this_wall_us", "cpu_ratio",
    }  # fmt: skip
    assert all(value > 0 for value in costs.values())
    assert costs["cpu_ratio"] == costs["this_cpu_us"] / costs["base_cpu_us"]
    table = format_costs({"tiny": costs}, {"tiny": 6})
    assert table.splitlines()[1].split()[:2] == ["tiny", "6"]


def test_a_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="calls"):
        ab_costs(None, None, [], calls=0)  # type: ignore[arg-type]
