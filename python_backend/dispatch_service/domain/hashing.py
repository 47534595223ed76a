"""A stable 64-bit hash of ids (FNV-1a): the same in every process, unlike ``hash()``.

Kept apart from the resolver (which breaks ties with it) so that routing, which buckets
users by it, imports numpy only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import numpy as np
from numpy.typing import NDArray

__all__ = ["fnv1a_64", "rider_id_hashes"]

_FNV_OFFSET: Final = np.uint64(0xCBF29CE484222325)
_FNV_PRIME: Final = np.uint64(0x100000001B3)
_FNV_MASK: Final = (1 << 64) - 1
# Up to this many id bytes in all a plain Python loop beats the per-column numpy passes.
_FNV_SCALAR_BYTES: Final = 256
# Rider ids recur from window to window; their hashes are kept up to this many entries.
_HASH_CACHE_SIZE: Final = 1 << 15
_hash_cache: dict[bytes, int] = {}


def fnv1a_64(ids: Iterable[bytes]) -> NDArray[np.uint64]:
    """64-bit FNV-1a of each id: a tie-break that is identical in every process.

    Vectorised over ids; the Python loop runs over byte positions (at most the longest
    id, 64 under the contract), masking ids that are already finished.
    """
    items = list(ids)
    count = len(items)
    if sum(map(len, items)) <= _FNV_SCALAR_BYTES:
        return np.fromiter(map(_fnv1a_scalar, items), dtype=np.uint64, count=count)
    out = np.full(count, _FNV_OFFSET, dtype=np.uint64)
    lengths = np.fromiter((len(item) for item in items), dtype=np.int64, count=count)
    width = int(lengths.max())
    if width == 0:
        return out
    # 'S' pads with NUL bytes; real trailing NULs survive in the buffer, and the mask
    # comes from the true lengths, so they are hashed too.
    raw = np.array(items, dtype=f"S{width}").view(np.uint8).reshape(count, width)
    for column in range(width):
        live = lengths > column
        mixed = (out ^ raw[:, column].astype(np.uint64)) * _FNV_PRIME  # wraps mod 2**64
        np.copyto(out, mixed, where=live)
    return out


def _fnv1a_scalar(item: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in item:
        value = ((value ^ byte) * 0x100000001B3) & _FNV_MASK
    return value


def rider_id_hashes(ids: list[bytes]) -> NDArray[np.uint64]:
    """`fnv1a_64` through a bounded cache: most riders were hashed in an earlier window."""
    cache = _hash_cache
    found = list(map(cache.get, ids))
    if None in found:
        missing = [item for item, value in zip(ids, found, strict=True) if value is None]
        fresh = dict(zip(missing, fnv1a_64(missing).tolist(), strict=True))
        found = [
            fresh[item] if value is None else value for item, value in zip(ids, found, strict=True)
        ]
        if len(cache) + len(fresh) > _HASH_CACHE_SIZE:
            cache.clear()
        cache.update(fresh)
    return np.array(found, dtype=np.uint64)
