"""The `with` shape every client object shares: leaving the block calls `close()`."""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = [
    "Closing",
]


class Closing:
    """Mixin: `with obj:` closes `obj` on the way out, however the block ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
