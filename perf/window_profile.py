"""Where one window's time goes, function by function: cProfile over `FusedDispatch.run`.

`perf.window_cost` times the stages; this says which functions inside them cost the time and
how many interpreter-level calls a window makes. It runs `dispatch_fused`'s library path
(`FusedDispatch.run`, a batch of one, as the model's stub runs it) over ``--windows`` windows
cycling through the bench's simulated windows of a size (`perf.windows`), after one warm-up
pass, under `cProfile`, and prints:

- the calls per window (every Python function call and every C call cProfile sees: numpy
  functions and methods, builtins), and the profiled seconds per window;
- the top functions by own time (``tottime``), each with its calls per window, its own and
  cumulative microseconds per window, and its share of the profiled time.

cProfile adds a fixed cost to every call, so a window full of small calls looks dearer
under it than it is: read the shares and the call counts, and time with `perf.window_cost`.

``--general`` profiles the general steps alone (`FusedDispatch.small_windows` off: a
one-order window then takes the path every other window takes).

`python -m perf.window_profile --size small --windows 500 [--top 25] [--sort cumulative]
[--general]`
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatch_service.core.model_config import config_parameters, profile_config_path
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.pipeline.fused import FusedDispatch
from dispatch_service.routing.settings import FUSED_MODEL_NAME, FusedSettings
from perf.windows import SIZES, Tensors, WindowSize, simulated_windows

__all__ = ["FunctionCost", "WindowProfile", "format_profile", "main", "profile_windows"]

_SORT_KEYS = {"tottime": 2, "cumulative": 3}


@dataclass(frozen=True)
class FunctionCost:
    """One function's share of the profiled windows, per window."""

    name: str  # file:line(function), or {built-in method ...}
    calls: float
    own_us: float
    cumulative_us: float


@dataclass(frozen=True)
class WindowProfile:
    size: str
    windows: int
    calls_per_window: float
    profiled_us_per_window: float
    functions: tuple[FunctionCost, ...]  # every function, dearest own time first


def _label(key: tuple[str, int, str]) -> str:
    filename, line, function = key
    if filename == "~":  # a C function: its name says it all
        return function
    for marker in ("dispatch_service/", "site-packages/"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{filename}:{line}({function})"


def profile_windows(
    size: WindowSize,
    windows: int,
    repository: Path = MODEL_REPOSITORY,
    inputs: Sequence[Tensors] | None = None,
    *,
    small_windows: bool = True,
) -> WindowProfile:
    """cProfile of ``windows`` `FusedDispatch.run` calls over the size's simulated windows
    (``small_windows``: `FusedDispatch.small_windows`)."""
    if windows < 1:
        raise ValueError(f"windows must be >= 1, got {windows}")
    settings = FusedSettings.from_parameters(
        config_parameters(profile_config_path(repository / FUSED_MODEL_NAME))
    )
    dispatch = FusedDispatch.from_repository(repository, settings, small_windows=small_windows)
    cycle = list(inputs or simulated_windows(size))
    for window in cycle:  # warm-up: sessions, caches and lazily built tables
        dispatch.run(window)
    profiler = cProfile.Profile()
    profiler.enable()
    for number in range(windows):
        dispatch.run(cycle[number % len(cycle)])
    profiler.disable()
    stats: Mapping[Any, Any] = pstats.Stats(profiler, stream=io.StringIO()).stats  # type: ignore[attr-defined]
    functions = sorted(
        (
            FunctionCost(
                name=_label(key),
                calls=called / windows,
                own_us=own * 1e6 / windows,
                cumulative_us=cumulative * 1e6 / windows,
            )
            for key, (_, called, own, cumulative, _) in stats.items()
        ),
        key=lambda cost: cost.own_us,
        reverse=True,
    )
    return WindowProfile(
        size=size.name,
        windows=windows,
        calls_per_window=sum(cost.calls for cost in functions),
        profiled_us_per_window=sum(cost.own_us for cost in functions),
        functions=tuple(functions),
    )


def format_profile(profile: WindowProfile, top: int = 25, sort: str = "tottime") -> str:
    """The headline figures and the ``top`` functions by own (or cumulative) time."""
    if sort not in _SORT_KEYS:
        raise ValueError(f"sort must be one of {sorted(_SORT_KEYS)}, got {sort!r}")
    rows = sorted(
        profile.functions,
        key=(lambda c: c.own_us) if sort == "tottime" else (lambda c: c.cumulative_us),
        reverse=True,
    )[:top]
    total = profile.profiled_us_per_window or 1.0
    lines = [
        f"{profile.size}: {profile.windows} windows, {profile.calls_per_window:,.0f} calls "
        f"and {profile.profiled_us_per_window:,.0f} us per window under cProfile",
        f"{'calls/window':>12} {'own us':>9} {'cum us':>9} {'own %':>6}  function",
    ]
    lines += [
        f"{c.calls:>12,.1f} {c.own_us:>9,.1f} {c.cumulative_us:>9,.1f} "
        f"{100.0 * c.own_us / total:>6.1f}  {c.name}"
        for c in rows
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--windows", type=int, default=500, help="windows profiled")
    parser.add_argument("--top", type=int, default=25, help="functions listed")
    parser.add_argument("--sort", default="tottime", choices=sorted(_SORT_KEYS))
    parser.add_argument(
        "--general", action="store_true", help="the general steps only (no small-window path)"
    )
    args = parser.parse_args(argv)
    profile = profile_windows(SIZES[args.size], args.windows, small_windows=not args.general)
    print(format_profile(profile, top=args.top, sort=args.sort))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
