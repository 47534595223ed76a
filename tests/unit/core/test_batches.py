"""Per-window outcomes and rows of a batch (`core.batches`)."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch_service.core.batches import batched_outcomes, isolated_outcomes, split_rows
from dispatch_service.core.errors import DispatchInputError


def test_each_window_of_a_batch_fails_alone() -> None:
    earlier = DispatchInputError("ORDER_IDS", "ids must be unique", "unique")

    def halve(n: int) -> int:
        if n % 2:
            raise ValueError(f"{n} is odd")
        return n // 2

    got = isolated_outcomes([4, earlier, 3, 8], halve)
    assert got[0] == 2 and got[3] == 4
    assert got[1] is earlier  # an earlier step's failure is kept, work never sees it
    assert isinstance(got[2], ValueError) and str(got[2]) == "3 is odd"


@pytest.mark.parametrize("counts", [[3], [1, 0, 2], [0, 0, 3], [2, 1], [0]])
def test_rows_come_back_as_numpy_splits_them(counts: list[int]) -> None:
    rows = sum(counts)
    array = np.arange(rows * 4, dtype=np.float32).reshape(rows, 2, 2)
    got = split_rows(array, counts)
    expected = np.split(array, np.cumsum(counts)[:-1])
    assert len(got) == len(expected) == len(counts)
    for part, want in zip(got, expected, strict=True):
        assert part.shape == want.shape and part.dtype == want.dtype
        assert part.tobytes() == want.tobytes()
        assert part.base is array or part.size == 0 or np.shares_memory(part, array)


def test_counts_that_do_not_cover_the_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="add up to 2 rows, the array has 3"):
        split_rows(np.zeros(3), [1, 1])


def test_a_batch_step_runs_on_the_windows_an_earlier_step_did_not_fail() -> None:
    earlier = DispatchInputError("ORDER_IDS", "ids must be unique", "unique")
    seen: list[list[int]] = []

    def doubled(batch: list[int]) -> list[int | Exception]:
        seen.append(batch)
        return [n * 2 if n != 3 else ValueError("3") for n in batch]

    got = batched_outcomes([1, earlier, 3, 4], doubled)
    assert seen == [[1, 3, 4]]  # one call, the failures left out
    assert got[0] == 2 and got[1] is earlier and got[3] == 8
    assert isinstance(got[2], ValueError)
    assert batched_outcomes([earlier], doubled) == [earlier]
