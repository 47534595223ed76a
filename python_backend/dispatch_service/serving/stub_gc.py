"""A stub's setup without Python's cyclic garbage collector.

A Python-backend stub's setup is mostly imports (numba, SciPy, ONNX Runtime, pydantic, the
library: about 200,000 objects in `dispatch_fused`'s), and the collector kept walking them
as they were made: about 300 young, 27 middle and 2 full collections in one
`dispatch_fused` setup, 10-20 % of a stub's setup CPU. A server restarted after a crash is
ready once its last stub is set up, and on a busy host that takes as long as their CPU
allows (docs/operations.md, "Health, supervision and drain").

So each model's `initialize` pauses the collector before it imports anything heavy
(`pause`), and once the instance is set up (`TritonResponder.loaded`) `resume` freezes
what the setup made (`gc.freeze`: modules, classes, tables that live as long as the stub;
the collector never walks them again) and turns the collector back on. Without the
freeze, the first full collection while serving would walk all of them: 70-100 ms of one
request's time in that stub. A setup leaves next to no cyclic garbage (about a thousand
objects in `dispatch_fused`'s); frozen, it stays.

Nothing here acts unless `pause` turned the collector off: `resume` in a process that never
paused it (a unit test calling `loaded`) changes nothing.
"""

from __future__ import annotations

import gc

__all__ = ["pause", "paused", "resume"]

_paused = False


def pause() -> None:
    """Turn the collector off for a stub's setup (where it is on; see the module docstring)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def paused() -> bool:
    """Whether `pause` turned the collector off and `resume` has not yet turned it back on."""
    return _paused


def resume() -> None:
    """Freeze what the setup made and turn the collector back on, where `pause` turned it
    off; otherwise nothing."""
    global _paused
    if not _paused:
        return
    _paused = False
    gc.freeze()
    gc.enable()
