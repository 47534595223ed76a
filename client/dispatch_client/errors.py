"""The client's errors, each carrying one line fit to show a person as is.

Three kinds, because callers act on them differently: a bad window is the caller's to fix
(`WindowJSONError`), a refusal comes from the server and names its rule
(`DispatchServerError`), and an unreachable or silent server is worth a retry
(`DispatchConnectionError`).
"""

from __future__ import annotations

__all__ = [
    "INVALID_INPUT_STATUSES",
    "DispatchConnectionError",
    "DispatchError",
    "DispatchServerError",
    "WindowJSONError",
    "one_line",
]


INVALID_INPUT_STATUSES = frozenset({"400", "StatusCode.INVALID_ARGUMENT"})
"""The statuses with which Triton refuses a request's input (TRITONSERVER_ERROR_INVALID_ARG)."""


def one_line(text: str) -> str:
    """Join a multi-line message (e.g. a server traceback) so logs and the CLI keep one line."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


class WindowJSONError(ValueError):
    """A window document broke a structural rule; the message names the field path and rule.

    `path` is like ``orders[3].pickup``; ``window`` stands for the document as a whole.
    """

    def __init__(self, path: str, rule: str) -> None:
        self.path = path
        self.rule = rule
        super().__init__(f"{path}: {rule}")


class DispatchError(Exception):
    """Base of the errors raised while talking to the server.

    `request_id` is the id the request was sent with (Triton's request ``id``; the server's
    rejection log lines carry it), set by `DispatchClient` when it knows it. `attempts` is how
    many times it was sent (`RetryPolicy`); the error is the last attempt's.
    """

    def __init__(self, message: str, request_id: str | None = None) -> None:
        self.message = one_line(message)
        self.request_id = request_id
        self.attempts = 1
        super().__init__(self.message)


class DispatchServerError(DispatchError):
    """The server answered with an error (or an answer that breaks the contract).

    `message` is the server's own text, on one line; `status` is the protocol's code
    (HTTP status such as ``"400"``, or a gRPC code such as ``"StatusCode.INVALID_ARGUMENT"``)
    when there was one.
    """

    def __init__(
        self, message: str, status: str | None = None, request_id: str | None = None
    ) -> None:
        self.status = status
        super().__init__(message, request_id)

    @property
    def invalid_input(self) -> bool:
        """The server refused the request's content (HTTP 400, gRPC INVALID_ARGUMENT).

        Anything else it says (unknown model 404/NOT_FOUND, internal 500/INTERNAL, queue full
        503/UNAVAILABLE) is a server-side failure: resending the same input may succeed.
        """
        return self.status in INVALID_INPUT_STATUSES


class DispatchConnectionError(DispatchError):
    """The server could not be reached or did not answer in time; retrying may help.

    `timed_out`: the request went out but no answer came in time, so the server may still be
    working on it (`RetryPolicy` does not send it again); False when no connection was made.
    """

    def __init__(
        self, message: str, request_id: str | None = None, *, timed_out: bool = False
    ) -> None:
        self.timed_out = timed_out
        super().__init__(message, request_id)
