"""What one window costs when it arrives at an idle process: the c=1 latency floor of a host.

At concurrency 1 every request reaches a stub that has been waiting. On the 2-core VMs we
bench on, the same code then needs far more CPU than in a hot loop: after a 2 ms wait
`dispatch_fused`'s single-window path took 1.5-1.9 ms of CPU instead of 0.86-0.95 ms, also
with the process pinned to one core (so it is not a migration between cores), and inside the
live stub 1.7 ms. Most likely the idle core runs other work meanwhile (the VM's host) and the
window starts with cold caches. Compare a host's figures here with its c=1 p50 before blaming
the pipeline or Triton.

`python -m perf.idle_cost [--size small] [--gaps-ms 0,0.5,2] [--seconds 3]` runs
`FusedDispatch.run` (what a batch of one runs in `dispatch_fused`) on the simulated windows
with an idle gap before each, and prints the CPU time per window for each gap (JSON).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import model_layout
from dispatch_service.pipeline.fused import FusedDispatch
from dispatch_service.routing.settings import FUSED_MODEL_NAME, FusedSettings
from perf.windows import SIZES, simulated_windows

__all__ = ["cpu_per_window", "main"]


def cpu_per_window(
    size: str, gaps_ms: Sequence[float], seconds: float, repository: Path = MODEL_REPOSITORY
) -> dict[str, Any]:
    """CPU microseconds per window (this thread's CPU time) after each idle gap, and how
    many windows each gap measured; about `seconds` of wall time per gap."""
    settings = FusedSettings.from_parameters(
        config_parameters(model_layout(repository, FUSED_MODEL_NAME).config)
    )
    dispatch = FusedDispatch.from_repository(repository, settings)
    windows = simulated_windows(SIZES[size])
    for window in windows:  # warm-up: every window once, not measured
        dispatch.run(window)
    figures: list[dict[str, float]] = []
    for gap_ms in gaps_ms:
        if gap_ms < 0:
            raise ValueError(f"an idle gap must be >= 0 ms, got {gap_ms:g}")
        cpu = 0.0
        count = 0
        deadline = time.perf_counter() + seconds
        while count == 0 or time.perf_counter() < deadline:
            if gap_ms:
                time.sleep(gap_ms / 1000.0)
            started = time.thread_time()
            dispatch.run(windows[count % len(windows)])
            cpu += time.thread_time() - started
            count += 1
        figures.append({"gap_ms": gap_ms, "windows": count, "cpu_us_per_window": 1e6 * cpu / count})
    return {
        "model": "dispatch_fused (in process, FusedDispatch.run)",
        "size": size,
        "runs": figures,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--gaps-ms", default="0,0.5,2", help="comma-separated idle gaps, ms")
    parser.add_argument("--seconds", type=float, default=3.0, help="per gap")
    args = parser.parse_args(argv)
    gaps = [float(part) for part in args.gaps_ms.split(",") if part.strip()]
    print(json.dumps(cpu_per_window(args.size, gaps, args.seconds), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
