"""Errors that travel back to the caller as one clear line."""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "RULE_CODES",
    "DispatchInputError",
    "rule_code",
]

# Stable, low-cardinality keys of the broken rule: the `rule` label of
# dispatch_validation_rejections_total and the `code` of a rejection's log line.
RULE_CODES: Final = (
    "missing",  # a required tensor is absent
    "dtype",  # wrong element type (tensor dtype, or an id that is not text)
    "shape",  # wrong rank, width or row count
    "count",  # too few or too many orders / riders
    "not_finite",  # NaN or infinity
    "range",  # a number outside its allowed interval
    "unique",  # a repeated id or candidate
    "id_length",  # an empty or too long id
    "unknown_value",  # not one of the defined values (datum, constraint bits, vehicle)
    "invalid",  # any other rule (raise sites that name no code and match nothing above)
)

# First match wins; the patterns cover the messages of the library's raise sites
# (tests/unit/test_errors.py checks every literal one).
_DERIVED_CODES: Final = (
    ("missing", re.compile(r"is required but missing")),
    ("unique", re.compile(r"must be unique|more than once")),
    ("id_length", re.compile(r"must not be empty|must be at most \S+ bytes")),
    (
        "dtype",
        re.compile(
            r"must be (an? )?(BOOL|BYTES|U?INT(8|16|32|64)|FP(16|32|64)|BF16)\b"
            r"|must be [A-Z][A-Z0-9]*, got"  # "must be {dtype}, got ...": dtypes are upper case
            r"|must be numeric|bytes or text|must hold bytes|must be ASCII"
        ),
    ),
    ("shape", re.compile(r"must have .*(shape|dimension|rows|columns)")),
    ("count", re.compile(r"must hold between")),
    ("not_finite", re.compile(r"must be finite(,| on)")),
    (
        "unknown_value",
        re.compile(r"must be one of|must be '|only bits .* are defined|must be 0 \("),
    ),
    (
        "range",
        re.compile(
            r"must be within|must be >=|must lie in|must not be more than|must be -1 or"
            r"|must be a positive|positive sum"
        ),
    ),
)


def rule_code(rule: str) -> str:
    """The stable key of a free-text rule message ("invalid" when nothing matches)."""
    for code, pattern in _DERIVED_CODES:
        if pattern.search(rule):
            return code
    return "invalid"


class DispatchInputError(ValueError):
    """A request broke a rule; the message names the tensor and the rule.

    `code` is a short stable key of the rule (one of `RULE_CODES`) for metrics and logs;
    when a raise site names none it is derived from the message. The Triton adapter turns
    the error into an INVALID_ARG error for that request only.
    """

    def __init__(self, tensor: str, rule: str, code: str | None = None) -> None:
        if code is not None and code not in RULE_CODES:
            raise ValueError(f"unknown rule code {code!r}; use one of {', '.join(RULE_CODES)}")
        self.tensor = tensor
        self.rule = rule
        self.code = code if code is not None else rule_code(rule)
        super().__init__(f"{tensor}: {rule}")
