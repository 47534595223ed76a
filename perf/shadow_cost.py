"""What does shadow scoring cost? The same windows with shadow_percent 0 and 100.

Starts a server of its own on free loopback ports, keeps every order on the stable version
(canary 2 at 0 %; each setting written as a revision of the live routing file, as a fleet
replica's launcher does), and sends the same window sequentially over gRPC: first with no shadow,
then with every request also scored by version 2, then with no shadow again (a drift check).
Prints client-side p50/p95/p99 per setting and window size, and the added milliseconds.

    .venv/bin/python -m perf.shadow_cost [--requests 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from dispatch_contract import DISPATCH_ENSEMBLE_OUTPUTS, batched
from dispatch_service.core.paths import REPO_ROOT
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from dispatch_service.routing.live import write_routing_file
from dispatch_service.routing.settings import INITIAL_ROUTING

__all__ = [
    "OUTPUTS",
    "SIZES",
    "main",
    "measure",
]

SIZES = ((1, 20), (64, 200))
OUTPUTS = [spec.name for spec in DISPATCH_ENSEMBLE_OUTPUTS]


def _inputs(orders: int, riders: int) -> list[grpcclient.InferInput]:
    tensors = batched(window_to_wire(generate_window(np.random.default_rng(11), orders, riders)))
    inputs = []
    for name, array in tensors.items():
        item = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array)
        inputs.append(item)
    return inputs


def _latencies_ms(
    client: grpcclient.InferenceServerClient, inputs: list[grpcclient.InferInput], count: int
) -> list[float]:
    wanted = [grpcclient.InferRequestedOutput(name) for name in OUTPUTS]
    out = []
    for _ in range(count):
        started = time.perf_counter()
        client.infer("dispatch", inputs, outputs=wanted)
        out.append((time.perf_counter() - started) * 1000.0)
    return out


def _summary(values: list[float]) -> dict[str, float]:
    array = np.asarray(values)
    return {
        "p50_ms": float(np.percentile(array, 50)),
        "p95_ms": float(np.percentile(array, 95)),
        "p99_ms": float(np.percentile(array, 99)),
        "mean_ms": float(array.mean()),
    }


def measure(server: TritonServer, requests: int) -> dict[str, Any]:
    """The figures per window size and setting; ``server`` started with ``live_routing``."""
    routing_file = server.routing_file()
    if routing_file is None:
        raise ValueError("measure needs a server started with live_routing")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: dict[str, Any] = {}
    revision = 0
    try:
        for orders, riders in SIZES:
            inputs = _inputs(orders, riders)
            size = f"{orders}x{riders}"
            for label, shadow in (("no_shadow", 0), ("shadow_100", 100), ("no_shadow_again", 0)):
                revision += 1
                routing = replace(INITIAL_ROUTING, shadow_percent=shadow)
                write_routing_file(routing_file, routing, revision)
                # each entry point routes by the file from its next execute on
                _latencies_ms(client, inputs, 20)
                results.setdefault(size, {})[label] = _summary(
                    _latencies_ms(client, inputs, requests)
                )
    finally:
        client.close()
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.shadow_cost", description=__doc__)
    parser.add_argument("--requests", type=int, default=200, help="per setting and size")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    runtime = TritonRuntime.from_venv()
    log = REPO_ROOT / ".triton" / "shadow_cost_server.log"
    options = ServerOptions(ports=Ports.free(), live_routing=True)
    with TritonServer(runtime, options, log) as server:
        results = measure(server, args.requests)
    print("| window | setting | p50 ms | p95 ms | p99 ms |")
    print("| --- | --- | --- | --- | --- |")
    for size, settings in results.items():
        for label, figures in settings.items():
            print(
                f"| {size} | {label} | {figures['p50_ms']:.2f} | {figures['p95_ms']:.2f} | "
                f"{figures['p99_ms']:.2f} |"
            )
        base = (settings["no_shadow"]["p50_ms"] + settings["no_shadow_again"]["p50_ms"]) / 2
        print(
            f"| {size} | shadow adds (p50) | {settings['shadow_100']['p50_ms'] - base:+.2f} | | |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
