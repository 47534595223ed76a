"""The window's ids in a fixed order: the tie-break that makes a decision a function of the set.

A caller may list the orders and riders of a window in any order; the answer must not
change with it. Wherever a rule needs a last tie-break between two orders or two
riders (equal distances, equal scores, an exact tie between two optimal assignments), it
uses their ids in ascending byte order, never their rows. Ids are unique within a window
(`window.window_from_wire`), so this order is total there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_service.core.errors import DispatchInputError

__all__ = ["id_order", "id_rank", "ids_as_bytes"]

IntArray = NDArray[np.int64]

# Up to this many ids Python's sort beats packing them into integer columns.
_PYTHON_SORT_MAX: Final = 256
_WORD: Final = 8


def id_order(ids: Sequence[bytes]) -> IntArray:
    """Positions of ``ids`` in ascending byte order (equal ids keep their positions' order).

    Byte order is Python's order of ``bytes``: a proper prefix sorts first. Large lists are
    sorted as big-endian 8-byte words plus the length (numpy's lexsort, no Python compare);
    the length settles ids that differ only by trailing NUL bytes, which the fixed-width
    packing pads alike.
    """
    count = len(ids)
    if count <= _PYTHON_SORT_MAX:
        return np.array(sorted(range(count), key=ids.__getitem__), dtype=np.int64)
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=count)
    width = max(_WORD, -(-int(lengths.max()) // _WORD) * _WORD)
    words = np.array(ids, dtype=f"S{width}").view(">u8").reshape(count, width // _WORD)
    # np.lexsort: the last key is the primary one.
    keys = (lengths, *(words[:, column] for column in range(words.shape[1] - 1, -1, -1)))
    order: IntArray = np.lexsort(keys).astype(np.int64)
    return order


def id_rank(ids: Sequence[bytes]) -> IntArray:
    """Each id's place in `id_order` (0 for the smallest): a sort key that stands for it."""
    rank = np.empty(len(ids), dtype=np.int64)
    rank[id_order(ids)] = np.arange(len(ids), dtype=np.int64)
    return rank


def ids_as_bytes(name: str, ids: ArrayLike, rows: NDArray[np.int64] | None = None) -> list[bytes]:
    """The ids of tensor `name` (all, or the given rows) as bytes: str is UTF-8 encoded,
    anything else is refused naming the tensor and the row."""
    array = np.asarray(ids, dtype=object).reshape(-1)
    numbers = range(array.size) if rows is None else rows.tolist()
    items = array.tolist() if rows is None else array[rows].tolist()
    if set(map(type, items)) <= {bytes}:  # the usual case, without a Python-level loop
        return items  # type: ignore[no-any-return]
    out: list[bytes] = []
    for row, item in zip(numbers, items, strict=True):
        if isinstance(item, bytes):
            out.append(item)
        elif isinstance(item, str):
            out.append(item.encode("utf-8"))
        else:
            raise DispatchInputError(
                name, f"must hold bytes, got {type(item).__name__} (row {row})", "dtype"
            )
    return out
