"""The text rules of a window: ids and free text (addresses, cities) are UTF-8.

Kept apart from the window so the geocoder and the batch path share one rule without
loading the whole window module.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_service.core.errors import DispatchInputError

__all__ = ["check_id_text", "decode_text", "utf8_as_sent"]


def utf8_as_sent(items: list[Any], min_bytes: int, max_bytes: int) -> NDArray[np.object_] | None:
    """Ids as most requests send them: UTF-8 bytes of [min_bytes, max_bytes] each, taken
    as they are (as an object array); None when an item needs the checks one by one."""
    if not set(map(type, items)) <= {bytes}:  # exactly bytes, no subclass (one C pass)
        return None
    lengths = list(map(len, items))
    if lengths and (min(lengths) < min_bytes or max(lengths) > max_bytes):
        return None
    if not _all_utf8(items):
        return None
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _all_utf8(items: list[bytes]) -> bool:
    """True when every id is valid UTF-8: one decode of the ids joined by NUL (a byte no
    multi-byte sequence can end or continue with, so no sequence spans two ids)."""
    try:
        b"\0".join(items).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def check_id_text(name: str, row: int, value: bytes) -> None:
    """Ids are text: valid UTF-8, or an HTTP JSON answer carrying them is not valid JSON."""
    try:
        value.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DispatchInputError(
            name, f"ids must be valid UTF-8, row {row} is not (byte {exc.start})", "dtype"
        ) from None


def decode_text(name: str, row: int, value: str | bytes, limit: int) -> str:
    """The rule for free text (addresses, cities): UTF-8 of at most ``limit`` bytes."""
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
    elif isinstance(value, bytes):
        data = value
    else:
        raise DispatchInputError(name, f"must be bytes or text (row {row})", "dtype")
    if len(data) > limit:
        raise DispatchInputError(
            name, f"must be at most {limit} bytes of UTF-8, row {row} has {len(data)}", "id_length"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DispatchInputError(
            name, f"must be valid UTF-8, row {row} is not (byte {exc.start})", "dtype"
        ) from None
