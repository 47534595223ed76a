"""Geocoder chain figures: windows of orders with addresses, cold and warm cache, slow providers.

Each window is ``orders`` simulated orders whose pickup and drop-off are written as the
addresses a customer would type (`offline.gazetteer_build.address_for_point`), so a window
resolves ``2 * orders`` addresses. The providers are the loopback `GeocodingServer` (amap
shape primary, baidu shape secondary) with a fixed latency. Per scenario: p50 / p99 / max
of the chain's wall time per window, and the share of addresses answered by each source.
The server runs in a child process, so its work does not share this process's GIL.

    python -m perf.geocoding_bench [--windows 20] [--orders 64]          # the chain alone
    python -m perf.geocoding_bench --served [--windows 10] [--riders 200]  # through Triton

`--served` (what `make bench` runs): a tritonserver over a copy of the repository whose
encoder names the loopback server as its providers (`use_as_providers`), and windows of
``orders`` x ``riders`` sent one at a time over gRPC to `dispatch_fused`: the same windows
with coordinates, then with every pickup and drop-off as an address, providers at 20 ms
(cold, then warm: the same windows again) and at 400 ms (cold: other windows). Per scenario
the client's p50 / p99 / max per window and the share of points by `ORDER_LOCATION_SOURCE`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from dispatch_client.client import LOCATION_SOURCE_NAMES
from dispatch_contract import ORDER_LOCATION_SOURCE, batched
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.settings import load_settings
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.geocoding.chain import GeocoderChain, GeocoderSettings
from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer
from dispatch_service.offline import gazetteer_build, simulator
from dispatch_service.offline.geocoding_server import RemoteGeocodingServer, use_as_providers
from perf.sessions import TritonSession

__all__ = ["main", "run_scenarios", "served_scenarios"]

FUSED = "dispatch_fused"

_KEY = "bench-key"


def _windows(
    count: int, orders: int, seed: int, gazetteer: Gazetteer, recogniser: AdminRecogniser
) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    book = gazetteer_build.AddressBook(gazetteer, recogniser)
    windows = []
    for _ in range(count):
        window = simulator.generate_window(rng, orders, 1)
        points = np.concatenate([window.pickup, window.dropoff])
        windows.append([book.address((float(lat), float(lon)))[0] for lat, lon in points])
    return windows


def _summary(
    windows: int, errors: int, times: list[float], sources: Counter[str]
) -> dict[str, Any]:
    """One scenario's figures: ms per window answered and the share of each source."""
    total = sum(sources.values()) or 1
    ms = np.array(times) if times else np.array([np.nan])
    return {
        "windows": windows,
        "errors": errors,
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
        "first_ms": round(float(ms[0]), 2),  # before any breaker has opened
        "over_320ms": int((ms > 320.0).sum()),  # the bound: deadline + 20 ms
        "share": {name: round(n / total, 3) for name, n in sorted(sources.items())},
    }


async def _measure(chain: GeocoderChain, windows: list[list[str]]) -> dict[str, Any]:
    times: list[float] = []
    sources: Counter[str] = Counter()
    errors = 0
    for texts in windows:
        start = time.perf_counter()
        try:
            found = await chain.resolve_locations(texts, ["上海"] * len(texts))
        except ValueError:
            errors += 1
            continue
        times.append((time.perf_counter() - start) * 1000.0)
        sources.update(LOCATION_SOURCE_NAMES[int(v)] for v in found.source)
    return _summary(len(windows), errors, times, sources)


def run_scenarios(
    windows: int = 20, orders: int = 64, seed: int = 5, **overrides: Any
) -> dict[str, Any]:
    gazetteer = Gazetteer.load()
    recogniser = AdminRecogniser()
    cold = _windows(windows, orders, seed, gazetteer, recogniser)
    results: dict[str, Any] = {"orders_per_window": orders, "addresses_per_window": 2 * orders}
    with RemoteGeocodingServer(key=_KEY) as server:
        settings = GeocoderSettings(
            geocoder_primary_url=server.url,
            geocoder_primary_key=_KEY,
            geocoder_secondary_url=server.url,
            geocoder_secondary_key=_KEY,
            **overrides,
        )

        async def scenarios() -> None:
            for latency in (20.0, 400.0):
                server.set_mode("amap", latency_ms=latency)
                server.set_mode("baidu", latency_ms=latency)
                # A fresh chain per latency: closed breakers, empty cache.
                chain = GeocoderChain(settings, gazetteer=gazetteer, recogniser=recogniser)
                name = f"provider_{latency:.0f}ms"
                results[f"{name}_cold"] = await _measure(chain, cold)
                if latency == 20.0:
                    results[f"{name}_warm"] = await _measure(chain, cold)
                results[f"{name}_stats"] = chain.stats()
                await chain.close()

        asyncio.run(scenarios())
    return results


def _served(
    client: grpcclient.InferenceServerClient, model: str, windows: list[dict[str, Any]]
) -> dict[str, Any]:
    """One request per window, in turn: client-side ms per window and the sources."""
    outputs = [grpcclient.InferRequestedOutput(ORDER_LOCATION_SOURCE.name)]
    times: list[float] = []
    sources: Counter[str] = Counter()
    errors = 0
    for tensors in windows:
        inputs = []
        for name, array in batched(tensors).items():
            item = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            item.set_data_from_numpy(array)
            inputs.append(item)
        start = time.perf_counter()
        try:
            result = client.infer(model, inputs, outputs=outputs)
        except InferenceServerException:
            errors += 1
            continue
        times.append((time.perf_counter() - start) * 1000.0)
        found = np.asarray(result.as_numpy(ORDER_LOCATION_SOURCE.name)).reshape(-1)
        sources.update(LOCATION_SOURCE_NAMES[int(v)] for v in found)
    return _summary(len(windows), errors, times, sources)


def served_scenarios(
    windows: int = 10, orders: int = 64, riders: int = 200, seed: int = 5, model: str = FUSED
) -> dict[str, Any]:
    """Windows with coordinates and the same windows with addresses, through Triton."""
    gazetteer, recogniser = Gazetteer.load(), AdminRecogniser()
    book = gazetteer_build.AddressBook(gazetteer, recogniser)
    rng = np.random.default_rng(seed)
    plain = [simulator.generate_window(rng, orders, riders) for _ in range(2 * windows)]
    coordinates = [window_to_wire(w) for w in plain[:windows]]
    addressed = [window_to_wire(gazetteer_build.window_with_addresses(w, book)) for w in plain]
    results: dict[str, Any] = {"model": model, "orders": orders, "riders": riders}
    with tempfile.TemporaryDirectory() as tmp, RemoteGeocodingServer(key=_KEY) as server:
        repository = Path(tmp) / "repo"
        shutil.copytree(MODEL_REPOSITORY, repository, ignore=shutil.ignore_patterns("__pycache__"))
        use_as_providers(repository, server.url, _KEY)
        with (
            TritonSession(repository, Path(tmp) / "tritonserver.log") as triton,
            grpcclient.InferenceServerClient(triton.server.grpc_url) as client,
        ):
            _served(client, model, coordinates[:4])  # warm-up: sessions, allocations
            results["coordinates"] = _served(client, model, coordinates)
            server.set_mode("amap", latency_ms=20.0)
            server.set_mode("baidu", latency_ms=20.0)
            results["provider_20ms_cold"] = _served(client, model, addressed[:windows])
            # each instance keeps its own cache: one more pass fills the other's
            _served(client, model, addressed[:windows])
            results["provider_20ms_warm"] = _served(client, model, addressed[:windows])
            results["coordinates_again"] = _served(client, model, coordinates)
            server.set_mode("amap", latency_ms=400.0)
            server.set_mode("baidu", latency_ms=400.0)
            results["provider_400ms_cold"] = _served(client, model, addressed[windows:])
    warm, plain_p50 = (
        results["provider_20ms_warm"]["p50_ms"],
        min(results["coordinates"]["p50_ms"], results["coordinates_again"]["p50_ms"]),
    )
    results["warm_over_coordinates_p50"] = round(warm / plain_p50, 3)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="geocoder chain figures")
    parser.add_argument("--served", action="store_true", help="through Triton (dispatch_fused)")
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--orders", type=int, default=64)
    parser.add_argument("--riders", type=int, default=200, help="with --served")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE",
        help="a GeocoderSettings field, e.g. geocoder_attempt_timeout_ms=250",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.served:
        found = served_scenarios(args.windows, args.orders, args.riders, args.seed)
        print(json.dumps(found, indent=2))
        return 0
    overrides = load_settings(GeocoderSettings, dict(item.split("=", 1) for item in args.set))
    changed = {
        name: getattr(overrides, name) for name in (item.split("=", 1)[0] for item in args.set)
    }
    print(json.dumps(run_scenarios(args.windows, args.orders, args.seed, **changed), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
