"""The entry points refuse new windows while the launcher drains the server.

On SIGTERM the launcher turns its readiness false, then closes this gate: it creates the file
named by ``DISPATCH_DRAIN_FILE`` in the server's environment (in a folder only the launcher's
user can write). From then on the models where a window enters the server --
`feature_encoder`, the first step of the `dispatch` and `dispatch_features` ensembles,
`dispatch_fused` and `dispatch_priority` -- answer each new request UNAVAILABLE (retryable:
the window has not been worked, and a client sends it again, to another replica behind a
load balancer), while the windows already past that point finish. The launcher stops Triton
once those are done.

Without it, Triton 2.51 keeps accepting while it stops: a drain under continuous traffic never
became quiet, ran into its timeout, and Triton then answered every request NOT_FOUND ("no
available versions") while it unloaded its models -- an answer no client retries.

Asking costs one ``stat`` per `execute`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

__all__ = ["DRAINING_MESSAGE", "DRAIN_FILE_ENV", "DrainGate", "draining_responses"]

DRAIN_FILE_ENV: Final = "DISPATCH_DRAIN_FILE"
DRAINING_MESSAGE: Final = (
    "the server is draining (shutting down) and takes no new windows: send it again "
    "(to another replica)"
)


@dataclass(frozen=True)
class DrainGate:
    """Closed once the file at ``path`` exists; never closed without a path."""

    path: str = ""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> DrainGate:
        return cls((os.environ if environ is None else environ).get(DRAIN_FILE_ENV, ""))

    def closed(self) -> bool:
        return bool(self.path) and os.path.exists(self.path)


class _Responder(Protocol):
    pb: Any
    model_name: str

    def error(self, request: Any, message: str, code: Any) -> Any: ...


def draining_responses(responder: _Responder, requests: Sequence[Any]) -> list[Any]:
    """Each request refused UNAVAILABLE, unworked."""
    code = responder.pb.TritonError.UNAVAILABLE
    message = f"{responder.model_name}: {DRAINING_MESSAGE}"
    return [responder.error(request, message, code) for request in requests]
