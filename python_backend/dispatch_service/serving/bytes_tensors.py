"""BYTES input tensors decoded faster than the Python backend of Triton 2.51 does it.

The 2.51 stub turns each BYTES input into a numpy array by calling
``triton_python_backend_utils.deserialize_bytes_tensor``, looked up by name for every
tensor: a Python loop that builds a format string per element. `decode_bytes_tensor` gives
the same array with one slice per element, and one numpy view for the usual case of many
ids of equal length. Later backends decode in C++ and
no longer look the function up; installing it there changes nothing.
"""

from __future__ import annotations

import struct
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

__all__ = ["decode_bytes_tensor", "use_fast_bytes_decoding"]

_LENGTH: Final = struct.Struct("<I")  # each element: its length, then its bytes
# Up to this many bytes (a small window's ids) the loop is the faster way: numpy's setup
# costs more than it saves on a few dozen elements.
_LOOP_BYTES: Final = 512


def decode_bytes_tensor(encoded: NDArray[np.uint8]) -> NDArray[np.object_]:
    """Triton's serialized BYTES tensor -> a 1-D object array of bytes, in order.
    struct.error when the buffer ends inside an element, as the backend's own decoder."""
    data = np.asarray(encoded, dtype=np.uint8).tobytes()
    equal = _equal_lengths(data) if len(data) > _LOOP_BYTES else None
    if equal is not None:
        return equal
    items: list[bytes] = []
    offset, size = 0, len(data)
    while offset < size:
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += 4
        if offset + length > size:
            raise struct.error(f"element of {length} bytes past the end of the tensor ({size})")
        items.append(data[offset : offset + length])
        offset += length
    return _objects(items)


def _equal_lengths(data: bytes) -> NDArray[np.object_] | None:
    """The elements when every one has the first one's length (None otherwise): each
    element then starts where its stride says, which the equal length prefixes confirm."""
    if len(data) < 4:
        return None
    (length,) = _LENGTH.unpack_from(data, 0)
    stride = length + 4
    if length == 0 or len(data) % stride:
        return None
    rows = np.frombuffer(data, dtype=np.uint8).reshape(-1, stride)
    if not (rows[:, :4] == rows[0, :4]).all() or (rows[:, -1] == 0).any():
        return None  # numpy's fixed-width bytes would drop a trailing NUL: the loop keeps it
    return _objects(np.ascontiguousarray(rows[:, 4:]).view(f"S{length}").reshape(-1).tolist())


def _objects(items: list[bytes]) -> NDArray[np.object_]:
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out


def use_fast_bytes_decoding(pb_utils: Any) -> None:
    """Make this stub decode BYTES inputs with `decode_bytes_tensor` (``pb_utils`` is the
    ``triton_python_backend_utils`` module the stub looks the decoder up in)."""
    pb_utils.deserialize_bytes_tensor = decode_bytes_tensor
