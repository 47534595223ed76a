"""One window's cost under two libraries in one process, alternating call by call.

`perf.window_cost` run in two processes compares two libraries only as well as the host's
load holds still between them; on a shared host it does not. Here both libraries live in
one process: the other checkout's packages (``--base``: a `perf.commits` worktree, or
``git archive <commit> | tar -x -C DIR``, model files included) are imported beside this
checkout's, each library's modules swapped into ``sys.modules`` around its own calls (its
lazy imports then find its own modules), and every window is run by both
(`FusedDispatch.run`, the stub's library path), in alternating order, timed with this
thread's CPU clock and the wall clock. Each library serves from its own model repository.

Printed per size: windows timed, each library's median thread-CPU and wall microseconds
per window, and the ratio this / base of the CPU medians.

`python -m perf.window_ab --base DIR [--sizes small:2000,medium:200,large:30] [--json PATH]`
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from perf.windows import SIZES, Tensors, simulated_windows

__all__ = ["Library", "ab_costs", "format_costs", "load_library", "main"]

# The distributions whose modules each library brings (the checkout's three folders).
_PACKAGES = ("dispatch_service", "dispatch_contract", "dispatch_client")
_FOLDERS = ("python_backend", "contract", "client")


def _library_modules() -> dict[str, ModuleType]:
    return {name: module for name, module in sys.modules.items() if name.split(".")[0] in _PACKAGES}


@dataclass(frozen=True, eq=False)
class Library:
    """One library's dispatch_fused path and the modules it runs with."""

    run: Any  # FusedDispatch.run of this library
    modules: dict[str, ModuleType]
    origin: str  # the file its FusedDispatch came from


def load_library(checkout: Path | None, warm_up: Sequence[Tensors]) -> Library:
    """The fused dispatch of the checkout's packages (None: the ones this process imports),
    configured as `perf.window_cost` configures it, run once on each window of ``warm_up``
    (sessions, caches, modules imported lazily) before its modules are set aside: the
    other library's modules are then never in the way of its imports."""
    saved_path = sys.path[:]
    if checkout is not None:
        for name in _library_modules():
            del sys.modules[name]
        sys.path[:0] = [str(checkout / folder) for folder in _FOLDERS]
    try:
        fused = importlib.import_module("dispatch_service.pipeline.fused")
        model_config = importlib.import_module("dispatch_service.core.model_config")
        paths = importlib.import_module("dispatch_service.core.paths")
        settings = importlib.import_module("dispatch_service.routing.settings")
        repository = paths.MODEL_REPOSITORY
        parameters = model_config.config_parameters(
            model_config.profile_config_path(repository / settings.FUSED_MODEL_NAME)
        )
        dispatch = fused.FusedDispatch.from_repository(
            repository, settings.FusedSettings.from_parameters(parameters)
        )
        for inputs in warm_up:
            dispatch.run(inputs)
    finally:
        sys.path[:] = saved_path
    return Library(dispatch.run, _library_modules(), str(fused.__file__))


def ab_costs(
    base: Library, this: Library, windows: Sequence[Tensors], calls: int
) -> dict[str, float]:
    """Median thread-CPU and wall microseconds per window of each library (warmed up by
    `load_library`) over ``calls`` windows cycling through ``windows``, the two alternating
    which goes first; this library's modules are in place again afterwards."""
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    arms = {"base": base, "this": this}
    cpu: dict[str, list[int]] = {name: [] for name in arms}
    wall: dict[str, list[int]] = {name: [] for name in arms}
    try:
        for number in range(calls):
            inputs = windows[number % len(windows)]
            for name in ("base", "this") if number % 2 else ("this", "base"):
                library = arms[name]
                sys.modules.update(library.modules)
                started, started_cpu = time.perf_counter_ns(), time.thread_time_ns()
                library.run(inputs)
                cpu[name].append(time.thread_time_ns() - started_cpu)
                wall[name].append(time.perf_counter_ns() - started)
    finally:
        sys.modules.update(this.modules)
    costs = {f"{name}_cpu_us": statistics.median(cpu[name]) / 1000.0 for name in arms}
    costs |= {f"{name}_wall_us": statistics.median(wall[name]) / 1000.0 for name in arms}
    costs["cpu_ratio"] = costs["this_cpu_us"] / costs["base_cpu_us"]
    return costs


def format_costs(costs: dict[str, dict[str, float]], calls: dict[str, int]) -> str:
    lines = [f"{'size':<8}{'windows':>8}{'base cpu':>11}{'this cpu':>11}{'ratio':>7}"
             f"{'base wall':>11}{'this wall':>11}   (us per window, medians)"]  # fmt: skip
    for size, c in costs.items():
        lines.append(
            f"{size:<8}{calls[size]:>8}{c['base_cpu_us']:>11.1f}{c['this_cpu_us']:>11.1f}"
            f"{c['cpu_ratio']:>7.3f}{c['base_wall_us']:>11.1f}{c['this_wall_us']:>11.1f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base", type=Path, required=True, help="the other checkout's root")
    parser.add_argument("--sizes", default="small:2000,medium:200,large:30")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    calls: dict[str, int] = {}
    for part in args.sizes.split(","):
        size, _, count = part.strip().partition(":")
        if size not in SIZES or not count.isdigit():
            parser.error(f"--sizes takes size:count pairs of {sorted(SIZES)}, got {part!r}")
        calls[size] = int(count)
    windows = {size: simulated_windows(SIZES[size]) for size in calls}
    every = [inputs for size in calls for inputs in windows[size]]
    this = load_library(None, every)
    base = load_library(args.base.resolve(), every)
    costs = {size: ab_costs(base, this, windows[size], count) for size, count in calls.items()}
    print(f"base: {base.origin}\nthis: {this.origin}")
    print(format_costs(costs, calls))
    if args.json is not None:
        args.json.write_text(json.dumps(costs, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
