"""dispatch_service.domain.ids: the ids' byte order, the tie-break that stands for a row."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch_service.domain.ids import id_order, id_rank


@pytest.mark.parametrize("count", [0, 1, 7, 300, 2000])  # both sides of the Python-sort cut
def test_id_order_is_pythons_byte_order(count: int) -> None:
    rng = np.random.default_rng(count)
    ids = [bytes(rng.integers(0, 4, int(rng.integers(1, 20))).tolist()) for _ in range(count)]
    ids = list(dict.fromkeys(ids))  # unique, as in a window
    expected = sorted(range(len(ids)), key=ids.__getitem__)
    assert id_order(ids).tolist() == expected
    rank = id_rank(ids)
    assert [ids[i] for i in np.argsort(rank)] == sorted(ids)


def test_trailing_nul_bytes_still_order_by_length() -> None:
    """Fixed-width packing pads with NUL bytes; the length settles such ids, as bytes do."""
    base = [b"a\x00", b"a", b"\x00", b"a\x00\x00", b"b" * 64, b"a\x01"]
    ids = base + [f"x{i}".encode() for i in range(400)]  # past the Python-sort cut
    assert id_order(ids).tolist() == sorted(range(len(ids)), key=ids.__getitem__)


def test_the_order_follows_the_ids_not_their_positions() -> None:
    ids = [b"r-10", b"r-2", b"r-1"]
    assert [ids[i] for i in id_order(ids)] == [b"r-1", b"r-10", b"r-2"]
    shuffled = [ids[i] for i in (2, 0, 1)]
    assert [shuffled[i] for i in id_order(shuffled)] == [b"r-1", b"r-10", b"r-2"]
