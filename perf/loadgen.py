"""A closed-loop HTTP load generator (asyncio + aiohttp), used for every HTTP JSON measurement.

`concurrency` streams share one connection pool; each sends the next prebuilt body as soon as
it has read the previous answer. One warm-up request per stream opens the connections and
is not measured. A level stops by itself after `max_requests` measured requests or after
`max_seconds`, whichever comes first, and talks to loopback addresses only. The same loop
drives Triton's HTTP endpoint and the FastAPI baseline, so their figures are comparable.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp

from perf.bodies import RequestBody
from perf.stats import LevelStats, level_stats

__all__ = [
    "LOOPBACK_HOSTS",
    "LoadPlan",
    "LoadResult",
    "require_loopback",
    "run_load",
]

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def require_loopback(url: str) -> str:
    """`url` itself when it names a loopback host over http; ValueError otherwise."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in LOOPBACK_HOSTS:
        raise ValueError(f"load is only sent to http://127.0.0.1 (loopback), not {url!r}")
    return url


@dataclass(frozen=True)
class LoadPlan:
    url: str
    bodies: Sequence[RequestBody]
    concurrency: int
    max_requests: int
    max_seconds: float
    request_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        require_loopback(self.url)
        if not self.bodies:
            raise ValueError("need at least one request body")
        if self.concurrency < 1 or self.max_requests < 1 or self.max_seconds <= 0:
            raise ValueError("concurrency, max_requests and max_seconds must be positive")


@dataclass
class LoadResult:
    concurrency: int
    latencies_s: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed_s: float = 0.0
    first_error: str | None = None

    def stats(self) -> LevelStats:
        return level_stats(self.concurrency, self.latencies_s, self.elapsed_s, self.errors)


async def _send(session: aiohttp.ClientSession, url: str, body: RequestBody) -> str | None:
    """One request; None when answered 200 (body read in full), else what went wrong."""
    try:
        async with session.post(url, data=body.data, headers=body.headers) as response:
            payload = await response.read()
            if response.status != 200:
                return f"HTTP {response.status}: {payload[:300]!r}"
            return None
    except (aiohttp.ClientError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"


async def _run(plan: LoadPlan) -> LoadResult:
    result = LoadResult(plan.concurrency)
    bodies = plan.bodies
    connector = aiohttp.TCPConnector(limit=plan.concurrency)
    timeout = aiohttp.ClientTimeout(total=plan.request_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        warmups = await asyncio.gather(
            *(_send(session, plan.url, bodies[i % len(bodies)]) for i in range(plan.concurrency))
        )
        failed = [w for w in warmups if w is not None]
        if failed:
            result.errors, result.first_error = len(failed), failed[0]
            return result
        issued = itertools.count()
        start = time.perf_counter()
        deadline = start + plan.max_seconds

        async def stream() -> None:
            while True:
                index = next(issued)
                if index >= plan.max_requests or time.perf_counter() >= deadline:
                    return
                sent = time.perf_counter()
                error = await _send(session, plan.url, bodies[index % len(bodies)])
                if error is None:
                    result.latencies_s.append(time.perf_counter() - sent)
                else:
                    result.errors += 1
                    result.first_error = result.first_error or error

        await asyncio.gather(*(stream() for _ in range(plan.concurrency)))
        result.elapsed_s = time.perf_counter() - start
    return result


def run_load(plan: LoadPlan) -> LoadResult:
    """Run one bounded level to completion (blocking)."""
    return asyncio.run(_run(plan))
