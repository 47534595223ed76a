"""Measure several commits side by side, each served with its own library and models.

`python -m perf.commits HEAD~3,HEAD --rounds 2` checks every commit out into a temporary git
worktree, serves its model repository with tritonserver and measures windows over gRPC with
perf_analyzer (`--sizes`, default small at concurrency 1 and 64; `LEVELS`), for `dispatch`
and (where the commit has it) `dispatch_fused`, each commit sent input data its own code
writes (so a commit on contract v1 gets v1 tensors). Rounds go through all commits in turn, so a
drift of the host's load spreads over all of them. It prints one line per level and writes
`results.json` (every round's figures) to the output folder; code changes in
`perf/tuning_log.json` were measured this way. Each level also gives the CPU the server and
its stubs spent per answered window (psutil, the windows from Triton's statistics): on a busy
host, where the throughputs swing with the other processes, this is the steadier measure of
what a commit costs.

The backend stub's embedded Python ignores PYTHONPATH, so each worktree's `model.py` files
get one line that puts that worktree's library first on `sys.path` (the worktree is a
temporary copy; the repository is not touched).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dispatch_service.core.paths import REPO_ROOT

__all__ = [
    "LEVELS",
    "MODELS",
    "checkout",
    "input_data",
    "library_first",
    "main",
    "measure",
]

MODELS = ("dispatch", "dispatch_fused")
LEVELS = {"small": (1, 64), "medium": (1, 16), "large": (1,)}


def _library_paths(worktree: Path) -> list[str]:
    """The worktree's importable folders: the library and, since the layout split, the
    contract and the client packages (else the venv's editable installs would win)."""
    return [str(worktree / p) for p in ("python_backend", "contract", "client")]


def library_first(worktree: Path) -> int:
    """Make each model.py of the worktree import the worktree's library; returns how many."""
    line = f"import sys; sys.path[:0] = {_library_paths(worktree)!r}\n"
    patched = 0
    for model_py in sorted((worktree / "model_repository").glob("*/*/model.py")):
        text = model_py.read_text()
        if not text.startswith(line):
            model_py.write_text(line + text)
            patched += 1
    return patched


def checkout(commit: str, root: Path) -> Path:
    """A detached worktree of ``commit`` under ``root`` (reused when present)."""
    worktree = root / f"wt-{commit}"
    if not worktree.exists():
        subprocess.run(
            ["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", str(worktree), commit],
            check=True,
            capture_output=True,
        )
    library_first(worktree)
    return worktree


_WRITE_INPUTS = """
import sys
from pathlib import Path
from perf.pa import write_input_data
from perf.windows import SIZES, optional_inputs, simulated_windows
for size in sys.argv[2:]:
    path = Path(sys.argv[1]) / f"input_{size}.json"
    write_input_data(path, simulated_windows(SIZES[size], optional_inputs()))
"""


def input_data(worktree: Path, out: Path, sizes: Sequence[str]) -> dict[str, Path]:
    """perf_analyzer input files written by the worktree's own code, so that each commit is
    sent the tensors of its own contract (v1 and v2 differ); the same simulator windows."""
    folder = out / f"inputs-{worktree.name}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = [*_library_paths(worktree), str(worktree)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    subprocess.run(
        [sys.executable, "-c", _WRITE_INPUTS, str(folder), *sizes],
        cwd=worktree,
        env=env,
        check=True,
        capture_output=True,
    )
    return {size: folder / f"input_{size}.json" for size in sizes}


def measure(
    commits: Sequence[str], rounds: int, out: Path, sizes: Sequence[str] = ("small",)
) -> dict[str, list[dict[str, Any]]]:
    from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
    from perf.pa import PaJob, PerfAnalyzer
    from perf.server_cpu import served, server_cpu_s

    runtime = TritonRuntime.from_venv()
    pa = PerfAnalyzer.from_venv()
    worktrees = {commit: checkout(commit, out) for commit in commits}
    inputs = {commit: input_data(worktrees[commit], out, sizes) for commit in commits}
    results: dict[str, list[dict[str, Any]]] = {}
    for round_no in range(rounds):
        for commit in commits:
            repository = worktrees[commit] / "model_repository"
            models = [m for m in MODELS if (repository / m).is_dir()]
            options = ServerOptions(model_repository=repository, ports=Ports.free())
            with TritonServer(runtime, options, out / f"server-{commit}.log") as server:
                for model, size in [(m, s) for m in models for s in sizes]:
                    for concurrency in LEVELS[size]:
                        cpu_before, served_before = server_cpu_s(server), served(server, model)
                        job = PaJob(
                            url=server.grpc_url,
                            protocol="grpc",
                            input_data=inputs[commit][size],
                            concurrency=concurrency,
                            request_count=max(60 if size == "large" else 400, 25 * concurrency),
                            csv_path=out / f"{commit}_{model}_{size}_c{concurrency}.csv",
                            model=model,
                        )
                        outcome = pa.run(job, 120)
                        key = f"{commit} {model} {size} c={concurrency}"
                        if not outcome.ok:
                            print(f"{round_no} {key} failed: {outcome.log_tail[-200:]}")
                            continue
                        row = outcome.rows[0]
                        windows = served(server, model) - served_before
                        cpu_ms = 1000 * (server_cpu_s(server) - cpu_before) / max(1, windows)
                        figures = {**row.to_dict(), "server_cpu_ms_per_window": cpu_ms}
                        results.setdefault(key, []).append(figures)
                        print(
                            f"{round_no} {key} {row.throughput_per_s:.1f}/s "
                            f"p50 {row.p50_ms:.2f} p99 {row.p99_ms:.2f} "
                            f"server CPU {cpu_ms:.3f} ms/window",
                            flush=True,
                        )
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure commits side by side")
    parser.add_argument("commits", help="comma-separated commits, oldest first")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", default="small", help=f"comma-separated of {', '.join(LEVELS)}")
    parser.add_argument("--out", type=Path, default=None, help="default: a temporary folder")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="dispatch-commits-"))
    out.mkdir(parents=True, exist_ok=True)
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = sorted(set(sizes) - set(LEVELS))
    if unknown:
        parser.error(f"unknown sizes {unknown}")
    measure([c for c in args.commits.split(",") if c], args.rounds, out, sizes)
    print(f"results: {out / 'results.json'}; worktrees: delete {out}, then `git worktree prune`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
