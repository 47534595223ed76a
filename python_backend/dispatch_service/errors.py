"""Errors that travel back to the caller as one clear line."""

from __future__ import annotations


class DispatchInputError(ValueError):
    """A request broke a rule; the message names the tensor and the rule.

    The Triton adapter turns it into an INVALID_ARG error for that request only.
    """

    def __init__(self, tensor: str, rule: str) -> None:
        self.tensor = tensor
        self.rule = rule
        super().__init__(f"{tensor}: {rule}")
