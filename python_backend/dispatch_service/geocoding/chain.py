"""The geocoder chain: cache -> primary provider -> secondary provider -> offline gazetteer.

One call resolves all the addresses of a window (`GeocoderChain.resolve_locations`):

1. texts are checked (UTF-8, at most 256 bytes) and normalised; cities are resolved to
   adcodes (an unknown city is the caller's error, before any network);
2. the cache answers what it knows (source 1);
3. the distinct misses go out concurrently; each tries the primary, then the secondary,
   skipping a provider whose circuit breaker is open; each attempt has its own timeout so a
   hung primary still leaves time for the secondary (source 2);
4. at ``deadline - fallback_reserve`` the window stops waiting: what is still in flight,
   and every address the providers did not know, takes the offline path (source 3): cpca
   division + gazetteer road / POI, worked out while the providers were awaited. The answer
   never waits for the network past that point. Lookups still in flight are not cancelled:
   they end within their own attempt timeout and a late answer fills the cache for the
   next window (cancelling would also close their connections).

An address that nothing recognises is an error naming the field and the row.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import numpy as np
from cachetools import LRUCache, TTLCache
from numpy.typing import NDArray

from dispatch_contract import MAX_ADDRESS_BYTES, MAX_CITY_BYTES, LocationSource
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.window_text import decode_text
from dispatch_service.geocoding.breaker import BreakerState, CircuitBreaker
from dispatch_service.geocoding.cache import CacheKey, CacheStats, GeocodeCache
from dispatch_service.geocoding.gazetteer import (
    AdminRecogniser,
    Gazetteer,
    GazetteerMatch,
    match_address,
)
from dispatch_service.geocoding.normalize import (
    normalize_address,
    normalize_city,
)
from dispatch_service.geocoding.providers import (
    HttpGeocodeProvider,
    ProviderConfig,
    ProviderError,
    RawPoint,
    to_wgs84_points,
)

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "AddressText",
    "BlockingGeocoder",
    "GeocoderChain",
    "GeocoderSettings",
    "LocationSource",
    "Resolution",
]

# Offline matches worked out between two looks at the network (each well under 1 ms).
_OFFLINE_CHUNK: Final = 64
_CITY_CODES: Final = 4096
AddressText = str | bytes
T = TypeVar("T")


@dataclass(frozen=True)
class GeocoderSettings:
    """Geocoding settings, read from a model's config.pbtxt `parameters`.

    A provider whose URL is empty is not configured; with neither, every address takes the
    offline path. Keys belong in the deployment's config, never in code.
    """

    geocoder_primary_kind: str = "amap"
    geocoder_primary_url: str = ""
    geocoder_primary_key: str = ""
    # A file holding the key (mode 600, e.g. a mounted Secret): the served encoder reads it
    # into `geocoder_primary_key` at load (`pipeline.steps.geocoder_settings`).
    geocoder_primary_key_file: str = ""
    geocoder_secondary_kind: str = "baidu"
    geocoder_secondary_url: str = ""
    geocoder_secondary_key: str = ""
    geocoder_secondary_key_file: str = ""
    geocoder_deadline_ms: float = 300.0
    # Kept back from the deadline for the offline path and the answer.
    geocoder_fallback_reserve_ms: float = 20.0
    # One provider call; less than the deadline so a hung primary leaves the secondary time.
    geocoder_attempt_timeout_ms: float = 150.0
    geocoder_max_concurrency: int = 32
    geocoder_cache_entries: int = 100_000
    geocoder_cache_ttl_s: float = 24 * 3600.0
    geocoder_breaker_failures: int = 5
    geocoder_breaker_open_s: float = 10.0
    geocoder_gazetteer_path: str = ""  # empty: the gazetteer shipped with the package

    def __post_init__(self) -> None:
        if not self.geocoder_deadline_ms > 0:
            raise ValueError("geocoder_deadline_ms must be > 0")
        if not 0 <= self.geocoder_fallback_reserve_ms < self.geocoder_deadline_ms:
            raise ValueError("geocoder_fallback_reserve_ms must lie in [0, deadline)")
        if not self.geocoder_attempt_timeout_ms > 0:
            raise ValueError("geocoder_attempt_timeout_ms must be > 0")
        if self.geocoder_max_concurrency < 1:
            raise ValueError("geocoder_max_concurrency must be >= 1")
        for which in ("primary", "secondary"):
            if getattr(self, f"geocoder_{which}_key") and getattr(
                self, f"geocoder_{which}_key_file"
            ):
                raise ValueError(
                    f"geocoder_{which}_key and geocoder_{which}_key_file: give one, not both"
                )
        self.providers()  # a bad provider kind or URL fails at model load

    def providers(self) -> list[ProviderConfig]:
        found = []
        for name, kind, url, key in (
            ("primary", self.geocoder_primary_kind, self.geocoder_primary_url,
             self.geocoder_primary_key),
            ("secondary", self.geocoder_secondary_kind, self.geocoder_secondary_url,
             self.geocoder_secondary_key),
        ):  # fmt: skip
            if url:
                found.append(ProviderConfig(name=name, kind=kind, base_url=url, key=key))
        return found


@dataclass(frozen=True)
class Resolution:
    """Locations of one batch of addresses, in input order."""

    latlon: NDArray[np.float64]  # [n, 2] WGS-84; NaN where no address was given
    source: NDArray[np.uint8]  # [n] LocationSource values
    offline: tuple[GazetteerMatch | None, ...]  # the gazetteer's match where source is 3


class GeocoderChain:
    """Cache, providers with breakers, offline fallback; one per model instance.

    ``clock`` drives the cache TTL and the breakers (tests move it by hand); deadlines use
    the event loop's own clock.
    """

    def __init__(
        self,
        settings: GeocoderSettings | None = None,
        *,
        gazetteer: Gazetteer | None = None,
        recogniser: AdminRecogniser | None = None,
        clock: Any = time.monotonic,
    ) -> None:
        self.settings = settings or GeocoderSettings()
        s = self.settings
        self.cache = GeocodeCache(s.geocoder_cache_entries, s.geocoder_cache_ttl_s, clock)
        self.providers = [
            (
                HttpGeocodeProvider(config),
                CircuitBreaker(s.geocoder_breaker_failures, s.geocoder_breaker_open_s, clock),
            )
            for config in s.providers()
        ]
        if self.providers:  # aiohttp costs a fifth of a second to import: only when needed
            importlib.import_module("aiohttp")
        self.gazetteer = gazetteer or Gazetteer.load(s.geocoder_gazetteer_path or None)
        self.recogniser = recogniser or AdminRecogniser()
        # Bounded: unknown cities are remembered too, and a caller chooses what it sends.
        self._city_codes: LRUCache[str, str | None] = LRUCache(_CITY_CODES)
        self._offline: LRUCache[CacheKey, GazetteerMatch | None] = LRUCache(
            s.geocoder_cache_entries
        )
        # Text as sent -> its cache key and city code: a repeated address skips decoding and
        # normalising (most of a warm window's cost). A pure function of the text, so a plain
        # dict, emptied when full. Only texts that passed the checks are remembered.
        self._keys: dict[tuple[AddressText, AddressText], tuple[CacheKey, str | None]] = {}
        # Addresses every configured provider answered "not found" (not an error): asked
        # again only after the cache's TTL, so a repeated unknown address costs no round
        # trip per window and goes straight to the gazetteer.
        self._not_found: TTLCache[CacheKey, bool] = TTLCache(
            s.geocoder_cache_entries, s.geocoder_cache_ttl_s, timer=clock
        )
        self._session: aiohttp.ClientSession | None = None
        self._session_loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(self.settings.geocoder_max_concurrency)
        self._lock = threading.Lock()
        self.sources: Counter[str] = Counter()
        self.provider_failures: Counter[str] = Counter()
        self.provider_not_found: Counter[str] = Counter()
        self.late = 0  # lookups still running when their window's deadline came
        self.late_answers = 0  # ... of which answered afterwards (cached for next time)
        self._background: set[asyncio.Task[RawPoint | None]] = set()

    # ------------------------------------------------------------------ inputs and keys

    def _city_code(self, city: str, field: str, row: int) -> str | None:
        if not city:
            return None
        with self._lock:
            known = city in self._city_codes
            code = self._city_codes.get(city)
        if not known:
            code = self.recogniser.city_adcode(city)
            with self._lock:
                self._city_codes[city] = code
        if code is None:
            raise DispatchInputError(
                field, f"row {row}: city {city!r} must be a known city name or adcode",
                code="unknown_value",
            )  # fmt: skip
        return code

    def _offline_match(self, text: str, city_code: str | None) -> GazetteerMatch | None:
        """`match_address`, remembered: it is a pure function of its inputs, and a busy
        city's fallback sees the same addresses over and over."""
        key = (text, city_code or "")
        with self._lock:
            if key in self._offline:
                return self._offline[key]
        found = match_address(text, city_code, self.gazetteer, self.recogniser)
        with self._lock:
            self._offline[key] = found
        return found

    async def _offline_meanwhile(
        self,
        misses: dict[CacheKey, list[int]],
        city_codes: list[str | None],
        tasks: dict[CacheKey, asyncio.Task[RawPoint | None]],
        cutoff: float,
    ) -> None:
        """Work out the offline answers while the providers are being waited for, so
        that what is left after the cutoff is assembly, not matching. Large chunks: each
        yield lets queued answers run first, and on a busy CPU that would push the
        matching past the cutoff."""
        loop = asyncio.get_running_loop()
        todo = list(misses)
        for start in range(0, len(todo), _OFFLINE_CHUNK):
            await asyncio.sleep(0)  # let the lookups send their requests
            if loop.time() >= cutoff:
                return
            for key in todo[start : start + _OFFLINE_CHUNK]:
                task = tasks.get(key)  # None: known to no provider, not asked
                if task is None or not task.done():
                    self._offline_match(key[0], city_codes[misses[key][0]])

    # ---------------------------------------------------------------------- the network

    def _http(self) -> aiohttp.ClientSession:
        import aiohttp  # imported by __init__ where providers are configured (warm)

        loop = asyncio.get_running_loop()
        if self._session is None or self._session_loop is not loop or self._session.closed:
            limit = self.settings.geocoder_max_concurrency
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit))
            self._slots = asyncio.Semaphore(limit)
            self._session_loop = loop
        return self._session

    def _late_answer(self, key: CacheKey, task: asyncio.Task[RawPoint | None]) -> None:
        """A lookup that finished after its window was answered: cache what it found."""
        self._background.discard(task)
        if task.cancelled() or task.exception() is not None:
            return
        raw = task.result()
        if raw is not None:
            self.cache.put(key, to_wgs84_points([raw])[0])
            self.late_answers += 1

    async def close(self) -> None:
        """Stop late lookups and close the HTTP session (call from the loop that used it)."""
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self._background.clear()
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    async def _lookup(self, text: str, city: str, cutoff: float) -> RawPoint | None:
        """Primary, then secondary; the attempt clock starts once a slot is free, so a
        window's own queue never counts against a provider's breaker."""
        session = self._http()
        async with self._slots:
            return await self._attempts(session, text, city, cutoff)

    async def _attempts(
        self, session: aiohttp.ClientSession, text: str, city: str, cutoff: float
    ) -> RawPoint | None:
        loop = asyncio.get_running_loop()
        attempt_s = self.settings.geocoder_attempt_timeout_ms / 1000.0
        not_found = 0
        for provider, breaker in self.providers:
            remaining = cutoff - loop.time()
            if remaining <= 0:
                return None
            if not breaker.allow():
                continue
            try:
                # The provider's own timeout, not the window's: an answer that comes after
                # the window has moved on still fills the cache (see `_late_answer`).
                point = await provider.geocode(session, text, city, attempt_s)
            except TimeoutError:
                breaker.record_failure()
                self.provider_failures[provider.name] += 1
                continue
            except ProviderError:
                breaker.record_failure()
                self.provider_failures[provider.name] += 1
                continue
            except asyncio.CancelledError:
                breaker.release()
                raise
            breaker.record_success()
            if point is not None:
                return point
            self.provider_not_found[provider.name] += 1
            not_found += 1
        if not_found == len(self.providers):
            with self._lock:
                self._not_found[(text, city)] = True
        return None

    # -------------------------------------------------------------------- entry point

    def resolve_cached(
        self, texts: Sequence[AddressText], cities: Sequence[AddressText]
    ) -> Resolution | None:
        """`resolve_locations` without the network, when it needs none: every text seen
        before (checked then) and either cached or known to no provider (its gazetteer
        match, remembered). None otherwise, having counted nothing: call the full path."""
        n = len(texts)
        with self._lock:
            known = [self._keys.get(sent) for sent in zip(texts, cities, strict=True)]
        entries = [item for item in known if item is not None]
        if len(entries) != n:
            return None
        points = self.cache.get_many([key for key, _ in entries])
        latlon = np.empty((n, 2))
        source = np.full(n, LocationSource.CACHE, dtype=np.uint8)
        offline: list[GazetteerMatch | None] = [None] * n
        for i in [i for i, point in enumerate(points) if point is None]:
            key, city_code = entries[i]
            with self._lock:
                unknown = key in self._not_found
            match = self._offline_match(key[0], city_code) if unknown else None
            if match is None:
                return None  # to be asked, or unknown (the full path names field and row)
            points[i], source[i], offline[i] = match.latlon, LocationSource.GAZETTEER, match
        latlon[:] = points
        self.cache.count_hits(int((source == LocationSource.CACHE).sum()))
        self._count_sources(source)
        return Resolution(latlon, source, tuple(offline))

    def _count_sources(self, source: NDArray[np.uint8]) -> None:
        counts = np.bincount(source, minlength=len(LocationSource))
        found = {kind.name.lower(): int(counts[kind]) for kind in LocationSource if kind}
        with self._lock:
            self.sources.update({name: count for name, count in found.items() if count})

    async def resolve_locations(
        self,
        texts: Sequence[AddressText],
        cities: Sequence[AddressText] | None = None,
        *,
        field: str | Sequence[str] = "address",
        rows: Sequence[int] | None = None,
        deadline_s: float | None = None,
        city_field: str = "city",
    ) -> Resolution:
        """WGS-84 points and their sources for ``texts`` ("" = not given: NaN, source 0).

        ``field`` and ``rows`` name each text in errors (e.g. "pickup_address", row 3),
        ``city_field`` the cities;
        ``deadline_s`` defaults to the configured deadline. Raises `DispatchInputError`
        for bad text, an unknown city, or an address that nothing recognises.
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        s = self.settings
        budget = s.geocoder_deadline_ms / 1000.0 if deadline_s is None else deadline_s
        cutoff = start + budget - s.geocoder_fallback_reserve_ms / 1000.0
        n = len(texts)
        fields = [field] * n if isinstance(field, str) else list(field)
        row_ids = list(range(n)) if rows is None else list(rows)
        city_list: Sequence[AddressText] = [""] * n if cities is None else cities
        if not (len(fields) == len(row_ids) == len(city_list) == n):
            raise ValueError("texts, cities, field and rows must have the same length")

        latlon = np.full((n, 2), np.nan)
        source = np.zeros(n, dtype=np.uint8)
        keys: list[CacheKey | None] = [None] * n
        city_codes: list[str | None] = [None] * n
        for i in range(n):
            sent = (texts[i], city_list[i])
            with self._lock:
                known = self._keys.get(sent)
            if known is not None:
                keys[i], city_codes[i] = known
                continue
            text = decode_text(fields[i], row_ids[i], texts[i], MAX_ADDRESS_BYTES)
            city = decode_text(city_field, row_ids[i], city_list[i], MAX_CITY_BYTES)
            text, city = normalize_address(text), normalize_city(city)
            if not text:
                continue
            city_codes[i] = self._city_code(city, city_field, row_ids[i])
            keys[i] = (text, city)
            with self._lock:
                if len(self._keys) >= self.settings.geocoder_cache_entries:
                    self._keys.clear()
                self._keys[sent] = ((text, city), city_codes[i])

        misses: dict[CacheKey, list[int]] = {}
        for i, key in enumerate(keys):
            if key is None:
                continue
            hit = self.cache.get(key)
            if hit is not None:
                latlon[i] = hit
                source[i] = LocationSource.CACHE
            else:
                misses.setdefault(key, []).append(i)

        with self._lock:
            asked = [key for key in misses if key not in self._not_found]
        if asked and self.providers and cutoff > loop.time():
            tasks = {
                key: asyncio.ensure_future(self._lookup(key[0], key[1], cutoff)) for key in asked
            }
            await self._offline_meanwhile(misses, city_codes, tasks, cutoff)
            _, pending = await asyncio.wait(tasks.values(), timeout=max(cutoff - loop.time(), 0))
            for key, task in tasks.items():
                if task in pending:
                    # Not cancelled: the answer goes to the cache when it comes, and the
                    # connection stays open for reuse (a cancelled request closes it).
                    self._background.add(task)
                    task.add_done_callback(functools.partial(self._late_answer, key))
            self.late += len(pending)
            answered: list[tuple[CacheKey, RawPoint]] = []
            for key, task in tasks.items():
                if task in pending or task.cancelled() or task.exception() is not None:
                    continue
                raw = task.result()
                if raw is not None:
                    answered.append((key, raw))
            points = to_wgs84_points([raw for _, raw in answered])
            for (key, _), point in zip(answered, points, strict=True):
                self.cache.put(key, point)
                for i in misses.pop(key):
                    latlon[i] = point
                    source[i] = LocationSource.GEOCODER

        offline: list[GazetteerMatch | None] = [None] * n
        unknown: list[int] = []
        for key, indices in misses.items():
            found = self._offline_match(key[0], city_codes[indices[0]])
            for i in indices:
                if found is None:
                    unknown.append(i)
                    continue
                latlon[i] = found.latlon
                source[i] = LocationSource.GAZETTEER
                offline[i] = found
        if unknown:
            first = min(unknown)
            first_key = keys[first]
            shown = first_key[0] if first_key is not None else ""
            raise DispatchInputError(
                fields[first],
                f"row {row_ids[first]}: address {shown!r} "
                "must name a district, road or place the geocoders or the gazetteer know"
                + (f" ({len(unknown)} such rows)" if len(unknown) > 1 else ""),
                code="unknown_value",
            )
        self._count_sources(source)
        return Resolution(latlon, source, tuple(offline))

    def stats(self) -> dict[str, Any]:
        """Counters for metrics and logs: cache, sources, provider failures, breakers."""
        cache: CacheStats = self.cache.stats()
        with self._lock:
            return {
                "cache": cache.__dict__.copy(),
                "sources": dict(self.sources),
                "provider_failures": dict(self.provider_failures),
                "provider_not_found": dict(self.provider_not_found),
                "breakers": {p.name: b.state.value for p, b in self.providers},
                "breaker_opened": {p.name: b.times_opened for p, b in self.providers},
                "late": self.late,
                "late_answers": self.late_answers,
            }

    def breaker_state(self, name: str) -> BreakerState:
        for provider, breaker in self.providers:
            if provider.name == name:
                return breaker.state
        raise KeyError(name)


class BlockingGeocoder:
    """The chain for synchronous callers: its own event loop on a daemon thread.

    A Python-backend `execute` that is not async calls `resolve_locations` here; the
    chain's deadline bounds the wait. (An async `execute` awaits the chain directly.)
    """

    def __init__(self, chain: GeocoderChain) -> None:
        self.chain = chain
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="geocoder-loop", daemon=True
        )
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of the chain (e.g. `locations.resolve_window_locations`) on the
        geocoder's loop and wait for it."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result()

    def resolve_locations(
        self,
        texts: Sequence[AddressText],
        cities: Sequence[AddressText] | None = None,
        *,
        field: str | Sequence[str] = "address",
        rows: Sequence[int] | None = None,
        deadline_s: float | None = None,
    ) -> Resolution:
        return self.run(
            self.chain.resolve_locations(
                texts, cities, field=field, rows=rows, deadline_s=deadline_s
            )
        )

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.run(self.chain.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()
