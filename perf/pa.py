"""perf_analyzer 2.51 (shipped by tritonclient 2.51.0) as a small library.

- `write_input_data` / `read_input_data`: perf_analyzer's `--input-data` JSON made from
  request tensors (one entry per window; BYTES as UTF-8 text, numbers exact).
- `output_shm_size`: the `--output-shared-memory-size` that holds every output of the given
  answers (system shared memory needs it for BYTES and variable-shape outputs).
- `PaJob` / `PerfAnalyzer.run`: one concurrency level, bounded in requests and by a
  wall-clock timeout; `parse_csv` reads the `-f` report, `parse_request_count` the number
  of measured requests from the output.

Facts about this 2.51 build that shape the benchmark (checked on the target machine):
- `-i http --input-tensor-format json` puts only the first element of each input tensor in
  the JSON body (e.g. `"shape":[20],"data":[2]`), so Triton rejects every multi-element
  window ("Shape does not match true shape of 'data' field"). HTTP JSON is therefore
  measured with `perf.loadgen` instead.
- `--shared-memory system` refuses a model with an optional input unless the input data
  supplies it ("does not support optional inputs"): windows carry every optional input.
- Measurement windows end on whole seconds. In `count_windows` mode every request that
  completes inside a window counts, so the CSV is exact (it matched per-request timestamps
  to 0.1%). With `--request-count` the CSV divides N by the whole seconds it took (50
  requests in 0.4 s read "49.95 infer/sec"); only the profile export is exact there.
- `-i http` with `--request-count` at concurrency 64 or 128 sometimes never exits (2 of 4
  and 1 of 4 runs, sync and `--async` alike), and with `--shared-memory system` the
  profile export is sometimes cut off at 64 KiB although the exit status is 0. The
  benchmark therefore uses `count_windows` mode and the CSV for every perf_analyzer level.
- With `--shared-memory system` it names its regions after the tensors (`/dev/shm/ORDER_IDS`,
  `/dev/shm/COORD_SYSTEM_0_3`, ...) and removes them when it exits; killed (a level's
  timeout), it leaves them all behind. `PerfAnalyzer.run` then removes the ones that run
  created (`remove_leftover_regions`).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import (
    DISPATCH_ENSEMBLE_INPUTS,
    DISPATCH_ENSEMBLE_OUTPUTS,
    FEATURE_ENTRY_INPUTS,
    spec_by_name,
)
from perf.stats import LevelStats

__all__ = [
    "SHM_DIR",
    "WINDOWS",
    "PaJob",
    "PaOutcome",
    "PerfAnalyzer",
    "Protocol",
    "SharedMemory",
    "Tensors",
    "input_data_document",
    "output_shm_size",
    "parse_csv",
    "parse_request_count",
    "parse_server_breakdown",
    "read_input_data",
    "remove_leftover_regions",
    "shm_entries",
    "tensor_entry",
    "wire_bytes",
    "write_input_data",
]

Tensors = dict[str, NDArray[Any]]
Protocol = Literal["grpc", "http"]
SharedMemory = Literal["none", "system", "cuda"]  # cuda: perf/gpu_check.py
# Every level runs in perf_analyzer's `count_windows` mode: windows of at least a third of
# the job's `request_count` requests (whole seconds), until 3 in a row agree within a factor
# of 2, at most 6 windows (`--request-count` rates N over whole seconds: module notes).
WINDOWS = 3

# ---- --input-data files ---------------------------------------------------------------------


def tensor_entry(array: NDArray[Any]) -> dict[str, Any]:
    """One tensor as perf_analyzer's JSON: flat row-major `content` plus its `shape`."""
    flat = array.reshape(-1)
    if array.dtype.kind in "OSU":
        content: list[Any] = [
            item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in flat
        ]
    else:
        content = flat.tolist()  # Python ints/floats: repr round-trips FP64 and FP32 exactly
    return {"content": content, "shape": [int(d) for d in array.shape]}


def input_data_document(windows: Sequence[Mapping[str, NDArray[Any]]]) -> dict[str, Any]:
    return {"data": [{name: tensor_entry(array) for name, array in w.items()} for w in windows]}


def write_input_data(path: Path, windows: Sequence[Mapping[str, NDArray[Any]]]) -> int:
    """Write the `--input-data` file; returns its size in bytes."""
    text = json.dumps(input_data_document(windows), separators=(",", ":"))
    path.write_text(text)
    return len(text.encode())


def read_input_data(text: str) -> list[Tensors]:
    """The windows of an `--input-data` document, typed by the `dispatch` contract."""
    windows: list[Tensors] = []
    for entry in json.loads(text)["data"]:
        window: Tensors = {}
        for name, tensor in entry.items():
            spec = spec_by_name(name)
            shape = tuple(int(d) for d in tensor["shape"])
            if spec.triton_dtype == "BYTES":
                values = np.empty(len(tensor["content"]), dtype=object)
                values[:] = [str(v).encode("utf-8") for v in tensor["content"]]
            else:
                values = np.asarray(tensor["content"], dtype=spec.numpy_dtype)
            window[name] = values.reshape(shape)
        windows.append(window)
    return windows


# ---- shared-memory sizing --------------------------------------------------------------------


def wire_bytes(array: NDArray[Any]) -> int:
    """Bytes a tensor takes in Triton's raw form (BYTES: 4-byte length + data per item)."""
    if array.dtype.kind in "OSU":
        return sum(
            4 + len(item if isinstance(item, bytes) else str(item).encode("utf-8"))
            for item in array.reshape(-1)
        )
    return int(array.nbytes)


def output_shm_size(
    answers: Sequence[Mapping[str, NDArray[Any]]], margin: float = 1.25, page: int = 4096
) -> int:
    """Per-output region size for perf_analyzer: the largest output, with room, page-rounded."""
    largest = max((wire_bytes(a) for answer in answers for a in answer.values()), default=0)
    return max(page, math.ceil(largest * margin / page) * page)


# ---- running perf_analyzer -------------------------------------------------------------------


@dataclass(frozen=True)
class PaJob:
    """One perf_analyzer invocation: one model, one protocol, one concurrency level."""

    url: str
    protocol: Protocol
    input_data: Path
    concurrency: int
    request_count: int
    csv_path: Path
    model: str = "dispatch"
    shared_memory: SharedMemory = "none"
    output_shm_size: int | None = None

    def __post_init__(self) -> None:
        if self.shared_memory != "none" and self.protocol != "grpc":
            raise ValueError("the benchmark uses shared memory over gRPC only")
        if self.concurrency < 1 or self.request_count < self.concurrency:
            raise ValueError("need concurrency >= 1 and request_count >= concurrency")

    def arguments(self) -> list[str]:
        args = [
            "-m",
            self.model,
            "-u",
            self.url,
            "-i",
            self.protocol,
            "--input-data",
            str(self.input_data),
            "--concurrency-range",
            f"{self.concurrency}:{self.concurrency}",
            "-f",
            str(self.csv_path),
        ]
        per_window = max(self.concurrency, math.ceil(self.request_count / WINDOWS))
        args += [
            "--measurement-mode",
            "count_windows",
            "--measurement-request-count",
            str(per_window),
            "--stability-percentage",
            "100",
            "--max-trials",
            str(WINDOWS + 3),
        ]
        if self.shared_memory != "none":
            args += ["--shared-memory", self.shared_memory]
            if self.output_shm_size is not None:
                args += ["--output-shared-memory-size", str(self.output_shm_size)]
        return args


@dataclass(frozen=True)
class PaOutcome:
    command: str
    returncode: int
    rows: list[LevelStats]
    log_tail: str
    server: dict[str, dict[str, float]] = field(default_factory=dict)  # parse_server_breakdown

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.rows)


@dataclass(frozen=True)
class PerfAnalyzer:
    binary: Path
    library_path: Path  # holds libcudart.so.12, which the 2.51 binary links against

    @classmethod
    def from_venv(cls, venv: Path | None = None) -> PerfAnalyzer:
        venv = venv or Path(sys.prefix)
        site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        return cls(venv / "bin" / "perf_analyzer", site / "nvidia" / "cuda_runtime" / "lib")

    def environment(self) -> dict[str, str]:
        return dict(os.environ, LD_LIBRARY_PATH=str(self.library_path))

    def version(self) -> str:
        done = subprocess.run(
            [str(self.binary), "--version"],
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        lines = (done.stdout.strip() or done.stderr.strip()).splitlines()
        return lines[0] if lines else "unknown"

    def run(self, job: PaJob, timeout_s: float) -> PaOutcome:
        command = [str(self.binary), *job.arguments()]
        text = " ".join(command)
        before = shm_entries() if job.shared_memory == "system" else frozenset()
        try:
            done = subprocess.run(
                command,
                env=self.environment(),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:  # perf_analyzer was killed
            out = exc.stdout if isinstance(exc.stdout, str) else ""
            tail = f"timed out after {timeout_s:.0f} s"
            if job.shared_memory == "system":
                removed = remove_leftover_regions(before)
                tail += f"; removed {len(removed)} shared-memory regions it left"
            return PaOutcome(text, 124, [], f"{tail}\n{out[-1500:]}")
        job.csv_path.with_suffix(".log").write_text(f"{text}\n\n{done.stdout}\n{done.stderr}")
        rows: list[LevelStats] = []
        if done.returncode == 0 and job.csv_path.exists():
            measured = parse_request_count(done.stdout) or job.request_count
            rows = [
                LevelStats(**{**row.to_dict(), "requests": measured})
                for row in parse_csv(job.csv_path.read_text())
            ]
        tail = (done.stdout[-1500:] + "\n" + done.stderr[-1500:]).strip()
        return PaOutcome(
            text, done.returncode, rows, tail, parse_server_breakdown(done.stdout, job.model)
        )


SHM_DIR = Path("/dev/shm")
_TENSOR_NAMES = frozenset(
    spec.name
    for spec in (*DISPATCH_ENSEMBLE_INPUTS, *DISPATCH_ENSEMBLE_OUTPUTS, *FEATURE_ENTRY_INPUTS)
)


def shm_entries(directory: Path = SHM_DIR) -> frozenset[str]:
    return frozenset(os.listdir(directory)) if directory.is_dir() else frozenset()


def _tensor_region(name: str) -> bool:
    """Whether a /dev/shm entry is named like perf_analyzer's region for a contract tensor."""
    return any(name == tensor or name.startswith(f"{tensor}_") for tensor in _TENSOR_NAMES)


def remove_leftover_regions(before: frozenset[str], directory: Path = SHM_DIR) -> list[str]:
    """Remove the regions a killed perf_analyzer left: entries new since ``before`` and
    named after a contract tensor (never the server's own regions, named otherwise)."""
    removed = []
    for name in sorted(shm_entries(directory) - before):
        if _tensor_region(name):
            (directory / name).unlink(missing_ok=True)
            removed.append(name)
    return removed


def parse_request_count(output: str) -> int | None:
    """Requests in the reported measurement: the client's "Request count" in the output."""
    client = output.partition("Client:")[2]
    match = re.search(r"Request count:\s*(\d+)", client)
    return int(match.group(1)) if match else None


_PARTS = (
    r"\s+Avg request latency: (?P<total>\d+) usec \(overhead (?P<overhead>\d+) usec \+ "
    r"queue (?P<queue>\d+) usec \+ compute input (?P<input>\d+) usec \+ "
    r"compute infer (?P<infer>\d+) usec \+ compute output (?P<output>\d+) usec\)"
)
_STEP = re.compile(
    r"^\s+(?P<model>[\w.-]+), version: (?P<version>\d+)\n(?:.*\n)*?" + _PARTS, re.MULTILINE
)
_SINGLE = re.compile(r"^" + _PARTS, re.MULTILINE)


def _parts_ms(match: re.Match[str]) -> dict[str, float]:
    return {
        "total_ms": float(match["total"]) / 1000.0,
        "queue_ms": float(match["queue"]) / 1000.0,
        "compute_infer_ms": float(match["infer"]) / 1000.0,
        "compute_io_ms": (float(match["input"]) + float(match["output"])) / 1000.0,
        "overhead_ms": float(match["overhead"]) / 1000.0,
    }


def parse_server_breakdown(output: str, model: str | None = None) -> dict[str, dict[str, float]]:
    """Server-side average request latency and its parts, ms, per model Triton ran.

    For an ensemble: one entry per composing model ("name vN"), from perf_analyzer's
    "Composing models" block. For a single model (no such block) perf_analyzer prints the
    parts on the "Server:" block's own latency line, without a name: one entry keyed
    `model`, when given. Empty when the output has neither.
    """
    composing = output.partition("Composing models:")[2]
    if composing:
        return {f"{m['model']} v{m['version']}": _parts_ms(m) for m in _STEP.finditer(composing)}
    single = _SINGLE.search(output.partition("Server:")[2])
    if model is None or single is None:
        return {}
    return {model: _parts_ms(single)}


def parse_csv(text: str) -> list[LevelStats]:
    """Rows of perf_analyzer's `-f` CSV (latencies there are in microseconds)."""
    rows = []
    for row in csv.DictReader(io.StringIO(text)):
        rows.append(
            LevelStats(
                concurrency=int(float(row["Concurrency"])),
                throughput_per_s=float(row["Inferences/Second"]),
                p50_ms=float(row["p50 latency"]) / 1000.0,
                p90_ms=float(row["p90 latency"]) / 1000.0,
                p95_ms=float(row["p95 latency"]) / 1000.0,
                p99_ms=float(row["p99 latency"]) / 1000.0,
            )
        )
    return rows
