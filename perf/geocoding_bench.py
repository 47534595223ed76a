"""Geocoder chain figures: windows of orders with addresses, cold and warm cache, slow providers.

Each window is ``orders`` simulated orders whose pickup and drop-off are written as the
addresses a customer would type (`offline.gazetteer_build.address_for_point`), so a window
resolves ``2 * orders`` addresses. The providers are the loopback `GeocodingServer` (amap
shape primary, baidu shape secondary) with a fixed latency. Per scenario: p50 / p99 / max
of the chain's wall time per window, and the share of addresses answered by each source.
The server runs in a child process, so its work does not share this process's GIL.

    python -m perf.geocoding_bench [--windows 20] [--orders 64]

Library only (no Triton): the chain's own cost and its deadline behaviour. The issue's
served-window comparison needs the encoder integration (contract v2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from typing import Any

import numpy as np

from dispatch_service.core.settings import load_settings
from dispatch_service.geocoding.chain import GeocoderChain, GeocoderSettings, LocationSource
from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer
from dispatch_service.offline import gazetteer_build, simulator
from dispatch_service.offline.geocoding_server import RemoteGeocodingServer

__all__ = ["main", "run_scenarios"]

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
        windows.append(
            [
                gazetteer_build.address_for_point(
                    (float(lat), float(lon)), gazetteer, recogniser, book=book
                )[0]
                for lat, lon in points
            ]
        )
    return windows


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
        sources.update(LocationSource(int(v)).name.lower() for v in found.source)
    total = sum(sources.values()) or 1
    ms = np.array(times) if times else np.array([np.nan])
    return {
        "windows": len(windows),
        "errors": errors,
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
        "first_ms": round(float(ms[0]), 2),  # before any breaker has opened
        "over_320ms": int((ms > 320.0).sum()),  # the bound: deadline + 20 ms
        "share": {name: round(n / total, 3) for name, n in sorted(sources.items())},
    }


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="geocoder chain figures")
    parser.add_argument("--windows", type=int, default=20)
    parser.add_argument("--orders", type=int, default=64)
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE",
        help="a GeocoderSettings field, e.g. geocoder_attempt_timeout_ms=250",
    )  # fmt: skip
    args = parser.parse_args(argv)
    overrides = load_settings(GeocoderSettings, dict(item.split("=", 1) for item in args.set))
    changed = {
        name: getattr(overrides, name) for name in (item.split("=", 1)[0] for item in args.set)
    }
    print(json.dumps(run_scenarios(args.windows, args.orders, args.seed, **changed), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
