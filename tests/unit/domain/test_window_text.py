"""The text rules of a window: ids and free text are UTF-8, within their byte limits."""

from __future__ import annotations

import pytest

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.window_text import check_id_text, decode_text, utf8_as_sent


def test_ids_as_sent_are_taken_only_when_every_one_is_utf8_bytes_within_bounds() -> None:
    taken = utf8_as_sent([b"a", "上".encode()], 1, 3)
    assert taken is not None and taken.tolist() == [b"a", "上".encode()]
    assert utf8_as_sent([b"a", "b"], 1, 3) is None  # text: checked one by one
    assert utf8_as_sent([b"a", b""], 1, 3) is None  # too short
    assert utf8_as_sent([b"abcd"], 1, 3) is None  # too long
    assert utf8_as_sent([b"a", b"\xff"], 1, 3) is None  # not UTF-8
    assert utf8_as_sent([b"\xe4", b"\xb8\x8a"], 1, 3) is None  # no sequence spans two ids
    empty = utf8_as_sent([], 1, 3)
    assert empty is not None and empty.size == 0


def test_an_id_that_is_not_utf8_names_tensor_row_and_byte() -> None:
    check_id_text("ORDER_IDS", 0, "上".encode())
    with pytest.raises(DispatchInputError) as caught:
        check_id_text("ORDER_IDS", 4, b"ok\xff")
    assert caught.value.tensor == "ORDER_IDS" and caught.value.code == "dtype"
    assert "row 4" in str(caught.value.rule) and "byte 2" in str(caught.value.rule)


@pytest.mark.parametrize(
    ("value", "code"),
    [(b"x" * 9, "id_length"), (b"\xff", "dtype"), (7, "dtype")],
)
def test_free_text_breaking_a_rule_names_it(value: object, code: str) -> None:
    with pytest.raises(DispatchInputError) as caught:
        decode_text("ORDER_CITY", 1, value, 8)  # type: ignore[arg-type]
    assert caught.value.tensor == "ORDER_CITY" and caught.value.code == code


def test_free_text_is_decoded_from_bytes_or_taken_as_text() -> None:
    assert decode_text("ORDER_CITY", 0, "上海".encode(), 8) == "上海"
    assert decode_text("ORDER_CITY", 0, "上海", 8) == "上海"
