"""Valid gRPC requests with 1-15 ms client deadlines, and what they do to the server.

`callers` threads, each with its own gRPC client, send the same valid window to one entry
point with a client deadline drawn uniformly from `deadline_ms` (the client cancels the call
when it passes), until `requests` have been sent; `good_callers` more threads send the same
window with a 2 s deadline meanwhile, as the other callers of a production server would.
Every answer is classified: served, deadline (the client gave up: DEADLINE_EXCEEDED),
cancelled (the server answered CANCELLED), queue_full (UNAVAILABLE "Exceeds maximum queue
size"), expired (UNAVAILABLE "Request timeout expired": a queue's own deadline), down (the
server was unreachable: dead or restarting), other (kept, with samples).
A caller that finds the server down waits `down_wait_s` before its next send, so a crash does
not burn the budget while the launcher restarts Triton.

On the embedded Triton 2.51 such a burst on the `dispatch` ensemble ends in SIGSEGV in the gRPC
front end (docs/security.md, "Client deadlines crash the embedded 2.51"); the launcher then
restarts it (`dispatch_service.ops.restart`). `python -m perf.deadline_burst` starts its own
launcher on free loopback ports (default policy), sends `--requests` (10,000) to each entry
point, reads the launcher's crash and restart counters after each, waits for it to be ready
again, and writes `perf/reports/deadline-<stamp>/report.json` and `report.md`.
`tests/integration/test_deadline_burst.py` runs a smaller burst in CI.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import tritonclient.grpc as grpcclient
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from dispatch_contract import batched
from dispatch_contract.keys import PRIORITY_KEY_HEADER
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window

__all__ = [
    "BurstResult",
    "BurstSettings",
    "LauncherMetrics",
    "classify",
    "launcher_metrics",
    "main",
    "run_burst",
    "wait_ready",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
GOOD_DEADLINE_S = 2.0
OUTCOMES = ("served", "deadline", "cancelled", "queue_full", "expired", "down", "other")


@dataclass(frozen=True)
class BurstSettings:
    model: str
    requests: int = 10_000
    callers: int = 32
    deadline_ms: tuple[float, float] = (1.0, 15.0)
    good_callers: int = 4
    orders: int = 8
    riders: int = 40
    seed: int = 3
    down_wait_s: float = 0.2
    # The priority key, sent as its header (the lane `dispatch_priority` refuses a window
    # without it); None: no key.
    priority_key: str | None = None


@dataclass
class BurstResult:
    model: str
    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    good: Counter[str] = field(default_factory=Counter)
    samples: dict[str, str] = field(default_factory=dict)  # one message per outcome

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "sent": self.sent,
            "outcomes": dict(self.outcomes),
            "good_callers": dict(self.good),
            "samples": dict(self.samples),
        }


def classify(exc: InferenceServerException | None) -> str:
    """The outcome of one call: None is served; else by status and message."""
    if exc is None:
        return "served"
    status, text = str(exc.status() or ""), str(exc).lower()
    if "DEADLINE_EXCEEDED" in status:
        return "deadline"
    if "CANCELLED" in status:
        return "cancelled"
    if "UNAVAILABLE" in status and "maximum queue size" in text:
        return "queue_full"
    if "UNAVAILABLE" in status and "timeout expired" in text:
        return "expired"  # the model's queue policy timed it out (its default deadline)
    if "UNAVAILABLE" in status or "connect" in text or "socket closed" in text:
        return "down"
    return "other"


def window_inputs(settings: BurstSettings) -> list[grpcclient.InferInput]:
    window = generate_window(np.random.default_rng(settings.seed), settings.orders, settings.riders)
    tensors: dict[str, NDArray[Any]] = batched(window_to_wire(window))
    inputs = []
    for name, array in tensors.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def run_burst(grpc_url: str, settings: BurstSettings) -> BurstResult:
    """One burst (see the module docstring); returns when every request has been sent and
    answered and the good callers have stopped. Loopback only."""
    host = grpc_url.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost", "[::1]"):
        raise ValueError(f"bursts are only sent to loopback, not {grpc_url!r}")
    result = BurstResult(settings.model)
    lock = threading.Lock()
    left = [settings.requests]
    done = threading.Event()
    inputs = window_inputs(settings)
    headers = (
        None if settings.priority_key is None else {PRIORITY_KEY_HEADER: settings.priority_key}
    )

    def record(counter: Counter[str], exc: InferenceServerException | None) -> str:
        outcome = classify(exc)
        with lock:
            counter[outcome] += 1
            if exc is not None and outcome not in result.samples:
                result.samples[outcome] = str(exc)[:300]
        return outcome

    def short_caller(k: int) -> None:
        rng = np.random.default_rng(settings.seed * 1000 + k)
        client = grpcclient.InferenceServerClient(grpc_url)
        low, high = settings.deadline_ms
        try:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                    result.sent += 1
                error = None
                try:
                    client.infer(
                        settings.model,
                        inputs,
                        client_timeout=float(rng.uniform(low, high)) / 1e3,
                        headers=headers,
                    )
                except InferenceServerException as exc:
                    error = exc
                if record(result.outcomes, error) == "down":
                    done.wait(settings.down_wait_s)
        finally:
            client.close()

    def good_caller() -> None:
        client = grpcclient.InferenceServerClient(grpc_url)
        try:
            while not done.is_set():
                error = None
                try:
                    client.infer(
                        settings.model, inputs, client_timeout=GOOD_DEADLINE_S, headers=headers
                    )
                except InferenceServerException as exc:
                    error = exc
                if record(result.good, error) == "down":
                    done.wait(settings.down_wait_s)
        finally:
            client.close()

    short = [threading.Thread(target=short_caller, args=(k,)) for k in range(settings.callers)]
    good = [threading.Thread(target=good_caller) for _ in range(settings.good_callers)]
    for thread in (*short, *good):
        thread.start()
    for thread in short:
        thread.join()
    done.set()
    for thread in good:
        thread.join()
    return result


@dataclass(frozen=True)
class LauncherMetrics:
    crashes: int
    server_restarts: int
    stub_restarts: int
    ready: bool


def launcher_metrics(health_url: str, timeout_s: float = 5.0) -> LauncherMetrics:
    """The launcher's crash, restart and readiness figures from its `/metrics`."""
    with urllib.request.urlopen(f"{health_url}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()

    def total(name: str) -> int:
        return int(
            sum(float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.M))
        )

    return LauncherMetrics(
        crashes=total("dispatch_launcher_server_crashes_total"),
        server_restarts=total("dispatch_launcher_server_restarts_total"),
        stub_restarts=total("dispatch_launcher_stub_restarts_total"),
        ready=total("dispatch_launcher_ready") == 1,
    )


def wait_ready(
    health_url: str,
    checks: int = 120,
    every_s: float = 0.5,
    alive: Callable[[], bool] = lambda: True,
) -> bool:
    """Poll `/readyz` at most ``checks`` times while ``alive()``; True once it answers 200."""
    for _ in range(checks):
        if not alive():
            return False
        try:
            with urllib.request.urlopen(f"{health_url}/readyz", timeout=5) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(every_s)
    return False


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_launcher(
    folder: Path, extra: Sequence[str], log: TextIO
) -> tuple[subprocess.Popen[str], str, str]:
    ports = [_free_port() for _ in range(4)]
    argv = [
        sys.executable,
        "-m",
        "dispatch_service.ops.server",
        "--http-port",
        str(ports[0]),
        "--grpc-port",
        str(ports[1]),
        "--metrics-port",
        str(ports[2]),
        "--health-port",
        str(ports[3]),
        "--log",
        str(folder / "server.log"),
        "--key-dir",
        str(folder / "keys"),
        *extra,
    ]
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, text=True)
    return process, f"127.0.0.1:{ports[1]}", f"http://127.0.0.1:{ports[3]}"


def _markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Deadline burst",
        "",
        f"{report['callers']} callers with {report['deadline_ms'][0]:g}-"
        f"{report['deadline_ms'][1]:g} ms deadlines, {report['good_callers']} callers with "
        f"{GOOD_DEADLINE_S:g} s, {report['window']} window, launcher policy "
        f"`{report['on_dead']}`.",
        "",
        "| entry point | sent | " + " | ".join(OUTCOMES) + " | good callers | crashes | "
        "restarts | ready after |",
        "| --- | --- | " + " | ".join("---" for _ in OUTCOMES) + " | --- | --- | --- | --- |",
    ]
    for run in report["runs"]:
        outcomes = run["outcomes"]
        good = ", ".join(f"{k} {v}" for k, v in sorted(run["good_callers"].items()))
        lines.append(
            f"| {run['model']} | {run['sent']} | "
            + " | ".join(str(outcomes.get(o, 0)) for o in OUTCOMES)
            + f" | {good} | {run['crashes']} | {run['server_restarts']} | {run['ready_after']} |"
        )
    lines += ["", f"launcher alive at the end: {report['launcher_alive']}", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="per entry point")
    parser.add_argument("--callers", type=int, default=32)
    parser.add_argument("--good-callers", type=int, default=4)
    parser.add_argument("--models", default="dispatch,dispatch_fused")
    parser.add_argument("--window", default="8x40", help="orders x riders (default 8x40)")
    parser.add_argument("--on-dead", choices=("exit", "restart"), default=None)
    parser.add_argument(
        "--triton-arg", action="append", default=[], help="one more tritonserver flag"
    )
    parser.add_argument("--out", type=Path, default=None, help="report folder")
    args = parser.parse_args(argv)
    orders, riders = (int(x) for x in args.window.split("x"))
    folder = args.out or REPO_ROOT / "perf" / "reports" / time.strftime("deadline-%Y%m%d-%H%M%S")
    folder.mkdir(parents=True, exist_ok=True)
    extra = [f"--triton-arg={a}" for a in args.triton_arg]
    if args.on_dead is not None:
        extra += ["--on-dead", args.on_dead]
    log = (folder / "launcher.out").open("w")
    process, grpc_url, health = _start_launcher(folder, extra, log)
    report: dict[str, Any] = {
        "callers": args.callers,
        "good_callers": args.good_callers,
        "deadline_ms": [1.0, 15.0],
        "window": args.window,
        "on_dead": args.on_dead or "default (restart for the embedded build)",
        "triton_args": args.triton_arg,
        "runs": [],
    }
    try:

        def alive() -> bool:
            return process.poll() is None

        if not wait_ready(health, checks=480, alive=alive):
            out(f"the launcher never became ready: see {folder / 'launcher.out'}")
            return 1
        for model in [m for m in args.models.split(",") if m]:
            settings = BurstSettings(
                model,
                requests=args.requests,
                callers=args.callers,
                good_callers=args.good_callers,
                orders=orders,
                riders=riders,
            )
            started = time.monotonic()
            result = run_burst(grpc_url, settings)
            seconds = time.monotonic() - started
            ready = wait_ready(health, alive=alive)
            metrics = launcher_metrics(health) if process.poll() is None else None
            run = {
                **result.as_dict(),
                "seconds": round(seconds, 1),
                "crashes": None if metrics is None else metrics.crashes,
                "server_restarts": None if metrics is None else metrics.server_restarts,
                "stub_restarts": None if metrics is None else metrics.stub_restarts,
                "ready_after": ready,
            }
            report["runs"].append(run)
            out(json.dumps(run))
    finally:
        report["launcher_alive"] = process.poll() is None
        if process.poll() is None:
            process.terminate()
            process.wait(timeout=90)
        log.close()
        (folder / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (folder / "report.md").write_text(_markdown(report))
        out(f"report: {folder / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
