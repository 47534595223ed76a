"""The windows of one Triton `execute`: each one's outcome on its own, and its rows back.

A batched step works on the concatenation of its windows; these helpers keep what is per
window per window: `isolated_outcomes` runs a step on each window alone, its exception that
window's outcome; `batched_outcomes` runs a batch step on the windows an earlier step did
not fail, each failure kept in its place; `split_rows` cuts a concatenated result back into
each window's rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from numpy.typing import NDArray

__all__ = ["batched_outcomes", "isolated_outcomes", "split_rows"]

T = TypeVar("T")
U = TypeVar("U")


def isolated_outcomes(
    items: Iterable[T | Exception], work: Callable[[T], U]
) -> list[U | Exception]:
    """``work`` on each window of a batch (one Triton `execute`), each on its own: an item
    that is already an exception (an earlier step's failure) stays as it is, and whatever
    ``work`` raises becomes that window's outcome, never the batch's."""
    out: list[U | Exception] = []
    for item in items:
        if isinstance(item, Exception):
            out.append(item)
            continue
        try:
            out.append(work(item))
        except Exception as exc:  # this window's own error
            out.append(exc)
    return out


def batched_outcomes(
    items: Sequence[T | Exception], work: Callable[[list[T]], Sequence[U | Exception]]
) -> list[U | Exception]:
    """``work`` on the items that are not exceptions (an earlier step's failures), as one
    batch that answers one outcome per item in order; each failure keeps its place."""
    done = iter(work([item for item in items if not isinstance(item, Exception)]))
    return [item if isinstance(item, Exception) else next(done) for item in items]


def split_rows(array: NDArray[Any], counts: Sequence[int]) -> list[NDArray[Any]]:
    """``array`` cut along its first axis into consecutive parts of ``counts`` rows (views).

    What `np.split` at the running totals returns, without its per-part `swapaxes` calls,
    which cost more than the work on a batch of small windows. The counts must add up to
    the array's length."""
    total = sum(counts)
    if total != len(array):
        raise ValueError(f"counts add up to {total} rows, the array has {len(array)}")
    parts: list[NDArray[Any]] = []
    start = 0
    for count in counts:
        parts.append(array[start : start + count])
        start += count
    return parts
