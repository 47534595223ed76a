"""Client text made safe for log lines, and the rate limit on per-request lines
(dispatch_service.core.log_text)."""

from __future__ import annotations

import json

import pytest

from dispatch_service.core.log_text import (
    MAX_LOGGED_CHARS,
    LogRateLimit,
    clip,
    describe_error,
    without_values,
)


def test_short_printable_text_is_kept_as_it_is() -> None:
    assert clip("req-42_ok:/x") == "req-42_ok:/x"


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        ("a\nb", "a\\nb"),
        ("a\r\nforged line", "a\\r\\nforged line"),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("nul\x00", "nul\\x00"),
        ("line\u2028sep", "line\\u2028sep"),
        ("caf\u00e9", "caf\\xe9"),
        ("back\\slash", "back\\\\slash"),
    ],
)
def test_control_characters_newlines_and_non_ascii_are_escaped(text: str, logged: str) -> None:
    assert clip(text) == logged
    assert clip(text).isascii() and clip(text).isprintable()


def test_a_megabyte_id_is_cut_to_the_limit_with_its_length() -> None:
    huge = "x" * (1 << 20)
    logged = clip(huge)
    assert logged == "x" * MAX_LOGGED_CHARS + f"...[{1 << 20} chars]"
    assert len(json.dumps({"request_id": logged})) < 200


def test_escaping_never_lets_a_line_grow_past_the_limit() -> None:
    for text in ("\u2028" * 10_000, "\x00" * 10_000, "\U0001f600" * 10_000, "\\" * 10_000):
        logged = clip(text)
        assert len(logged) <= MAX_LOGGED_CHARS + len("...[10000 chars]")
        assert logged.endswith("...[10000 chars]")


def test_bytes_are_read_as_utf8() -> None:
    assert clip(b"ok\n") == "ok\\n"
    assert clip(b"\xff") == "\\ufffd"
    assert clip(b"y" * 1000).endswith("...[1000 chars]")


def test_quoted_values_are_dropped_from_messages() -> None:
    rule = "row 3: address 'No. 7 Secret Lane' must name a district; city \"Gotham\" unknown"
    assert without_values(rule) == "row 3: address '...' must name a district; city '...' unknown"
    assert without_values("id 'it\\'s mine' repeated") == "id '...' repeated"
    assert without_values("latitude must be within [-90.0, 90.0] (row 3)") == (
        "latitude must be within [-90.0, 90.0] (row 3)"
    )


def test_a_long_message_loses_its_values_before_it_is_cut() -> None:
    message = "address '" + "Secret " * 10_000 + "' unknown"
    logged = without_values(message)
    assert logged == f"address '...'...[{len(message)} chars]"


def test_an_error_is_its_type_and_its_message_without_values() -> None:
    error = KeyError("client-key-9")
    assert describe_error(error) == "KeyError: '...'"
    assert describe_error(ValueError("a\nb")) == "ValueError: a\\nb"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_rate_limit_lets_a_burst_through_then_counts_what_it_drops() -> None:
    clock = Clock()
    limit = LogRateLimit(per_s=2.0, burst=3, clock=clock)
    assert [limit.admit() for _ in range(3)] == [0, 0, 0]
    assert [limit.admit() for _ in range(5)] == [None] * 5
    assert limit.dropped == 5
    clock.now += 0.5  # one token back
    assert limit.admit() == 5  # let through, reporting the five dropped before it
    assert limit.admit() is None
    clock.now += 100.0  # refills to the burst, no further
    assert [limit.admit() for _ in range(4)] == [1, 0, 0, None]


def test_the_rate_limit_needs_a_rate_and_a_burst() -> None:
    with pytest.raises(ValueError):
        LogRateLimit(per_s=0.0)
    with pytest.raises(ValueError):
        LogRateLimit(burst=0)
