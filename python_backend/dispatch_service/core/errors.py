"""Errors that travel back to the caller as one clear line."""

from __future__ import annotations

from typing import Final

__all__ = [
    "RULE_CODES",
    "DispatchInputError",
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
    "city",  # no registered city serves the window's points, or they lie in two
    "invalid",  # any other rule
)


class DispatchInputError(ValueError):
    """A request broke a rule; the message names the tensor and the rule.

    `code` is a short stable key of the rule (one of `RULE_CODES`) for metrics and logs,
    named by the raise site itself: the message is for people and may change wording
    without moving a metric. `row` (the offending row, where one is) goes into the message
    only: `tensor` and `code` label a metric, so neither may carry it. The Triton adapter
    turns the error into an INVALID_ARG error for that request only.
    """

    def __init__(self, tensor: str, rule: str, code: str, *, row: int | None = None) -> None:
        if code not in RULE_CODES:
            raise ValueError(f"unknown rule code {code!r}; use one of {', '.join(RULE_CODES)}")
        self.tensor = tensor
        self.rule = rule
        self.code = code
        self.row = row
        super().__init__(self._message())

    def _message(self) -> str:
        where = self.tensor if self.row is None else f"{self.tensor} row {self.row}"
        return f"{where}: {self.rule}"

    def rename(self, tensor: str) -> None:
        """Name the error by ``tensor`` instead (the wire column that carried the value)."""
        self.tensor = tensor
        self.args = (self._message(),)
