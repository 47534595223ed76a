"""perf.window_cost: each stage of one window's in-process path, timed on its own."""

from __future__ import annotations

import pytest

from perf.window_cost import STAGES, format_table, stage_costs
from perf.windows import WindowSize

TINY = WindowSize("tiny", 1, 3, 2)


def test_every_stage_of_a_tiny_window_is_timed_and_tabled() -> None:
    costs = stage_costs(TINY, calls=5)
    assert list(costs) == [name for name, _ in STAGES]  # this library has every stage
    assert all(value > 0 for value in costs.values())
    # the parts of a stage cost less than the whole (medians of the same windows)
    assert costs["features"] < costs["encode"] < costs["fused"]
    table = format_table({"tiny": costs, "other": {"fused": 1.0}})
    lines = table.splitlines()
    assert lines[0].split()[-2:] == ["tiny", "other"]
    assert lines[1].split()[0] == "fused" and lines[1].endswith("1.0")
    assert "    map_columns" in table and lines[-1].split()[-1] == "-"


def test_a_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="calls"):
        stage_costs(TINY, calls=0)
