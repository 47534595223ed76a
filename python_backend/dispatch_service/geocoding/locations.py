"""A window's pickup and drop-off points from coordinates or addresses: what the encoder calls.

Per order and end, coordinates win when given; a row whose coordinates are NaN must carry
an address, and both ends of every such order go to the geocoder chain in one batch, so
they share one deadline and one round of concurrent lookups. The answer says per order and
end how each point was found (the contract's `LocationSource`: 0 given, 1 cache,
2 geocoder, 3 gazetteer), which the encoder answers as ORDER_LOCATION_SOURCE.

Input coordinates must already be WGS-84 (the window converts its stated datum first);
geocoded points are WGS-84 too, so nothing downstream changes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

import numpy as np
from numpy.typing import NDArray

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.metrics import Observation
from dispatch_service.domain.window import DispatchWindow
from dispatch_service.domain.window_wire import wire_name
from dispatch_service.geocoding.chain import (
    AddressText,
    BlockingGeocoder,
    GeocoderChain,
    GeocoderSettings,
    Resolution,
)
from dispatch_service.geocoding.metrics import GEOCODING_LATENCY, GeocodingObserver

__all__ = ["WindowGeocoder", "WindowLocations", "resolve_window_locations"]


@dataclass(frozen=True)
class WindowLocations:
    pickup: NDArray[np.float64]  # [B, 2] WGS-84
    dropoff: NDArray[np.float64]  # [B, 2] WGS-84
    source: NDArray[np.uint8]  # [B, 2]: column 0 pickup, column 1 drop-off


def _missing_rows(points: NDArray[np.float64], name: str) -> NDArray[np.bool_]:
    """Rows with no coordinates; a half-given point is an error."""
    if points.ndim != 2 or points.shape[1] != 2:
        raise DispatchInputError(name, "must have shape [B, 2] (lat, lon)", code="shape")
    nan = np.isnan(points)
    half = nan[:, 0] != nan[:, 1]
    if half.any():
        row = int(np.flatnonzero(half)[0])
        raise DispatchInputError(
            name, f"row {row}: lat and lon must both be given or both be NaN", code="not_finite"
        )
    return nan[:, 0]


@dataclass(frozen=True)
class _Lookups:
    """The addresses a window needs located (its NaN rows), in one batch for the chain:
    the pickups first, then the drop-offs."""

    texts: list[AddressText]
    cities: list[AddressText]
    fields: list[str]
    rows: list[int]
    pickups: NDArray[np.int64]  # rows whose pickup is looked up
    dropoffs: NDArray[np.int64]


def _lookups(
    pickup: NDArray[np.float64],
    dropoff: NDArray[np.float64],
    *,
    pickup_address: Sequence[AddressText],
    dropoff_address: Sequence[AddressText],
    city: Sequence[AddressText],
    fields: tuple[str, str, str, str],
) -> _Lookups:
    """Which rows need an address; ``fields``: pickup, drop-off, and their address names."""
    count = len(pickup)
    if not (len(dropoff) == len(pickup_address) == len(dropoff_address) == len(city) == count):
        raise DispatchInputError(
            "address columns", f"must have {count} rows, one per order", code="shape"
        )
    found = _Lookups([], [], [], [], np.flatnonzero(_missing_rows(pickup, fields[0])),
                     np.flatnonzero(_missing_rows(dropoff, fields[1])))  # fmt: skip
    for rows, name, addresses, field in (
        (found.pickups, fields[0], pickup_address, fields[2]),
        (found.dropoffs, fields[1], dropoff_address, fields[3]),
    ):
        listed = rows.tolist()
        texts = [addresses[row] for row in listed]
        bare = [row for row, text in zip(listed, texts, strict=True) if len(text) == 0]
        if bare:
            raise DispatchInputError(
                field, f"row {bare[0]}: must be given when {name} is NaN", code="missing"
            )
        found.texts.extend(texts)
        found.cities.extend(city[row] for row in listed)
        found.fields.extend([field] * len(listed))
        found.rows.extend(listed)
    return found


def _located(
    pickup: NDArray[np.float64],
    dropoff: NDArray[np.float64],
    lookups: _Lookups,
    found: Resolution | None,
) -> WindowLocations:
    """New arrays with the looked-up rows filled in, and their sources."""
    points = (np.array(pickup, dtype=np.float64), np.array(dropoff, dtype=np.float64))
    source = np.zeros((len(pickup), 2), dtype=np.uint8)
    if found is not None:
        split = len(lookups.pickups)
        for end, rows, part in ((0, lookups.pickups, slice(None, split)),
                                (1, lookups.dropoffs, slice(split, None))):  # fmt: skip
            points[end][rows] = found.latlon[part]
            source[rows, end] = found.source[part]
    return WindowLocations(points[0], points[1], source)


async def resolve_window_locations(
    chain: GeocoderChain,
    pickup: NDArray[np.float64],
    dropoff: NDArray[np.float64],
    *,
    pickup_address: Sequence[AddressText],
    dropoff_address: Sequence[AddressText],
    city: Sequence[AddressText],
    pickup_field: str = "ORDER_PICKUP",
    dropoff_field: str = "ORDER_DROPOFF",
    address_fields: tuple[str, str] = ("pickup_address", "dropoff_address"),
    city_field: str = "city",
    deadline_s: float | None = None,
) -> WindowLocations:
    """Fill the NaN rows of ``pickup`` / ``dropoff`` from their addresses (new arrays).

    The ``*_field`` names are what errors call each input (the wire's column names)."""
    fields = (pickup_field, dropoff_field, *address_fields)
    lookups = _lookups(
        pickup,
        dropoff,
        pickup_address=pickup_address,
        dropoff_address=dropoff_address,
        city=city,
        fields=fields,
    )
    found = None
    if lookups.texts:
        found = await chain.resolve_locations(
            lookups.texts,
            lookups.cities,
            field=lookups.fields,
            rows=lookups.rows,
            deadline_s=deadline_s,
            city_field=city_field,
        )
    return _located(pickup, dropoff, lookups, found)


_KEPT_LATENCIES: Final = 1024
# How errors call the window's points and addresses: the wire's columns.
_WIRE_FIELDS: Final = (
    wire_name("ORDER_PICKUP"),
    wire_name("ORDER_DROPOFF"),
    wire_name("ORDER_PICKUP_ADDRESS"),
    wire_name("ORDER_DROPOFF_ADDRESS"),
)


class WindowGeocoder:
    """What the encoder of one model instance calls: a window's NaN points from their
    addresses, in WGS-84, and where each point came from.

    The chain (cache, providers, gazetteer) is built on first use, or at load by `warm`
    (building it reads the gazetteer and cpca's tables: about a second, too long for a
    window's 300 ms deadline). It runs on its own event-loop thread (`BlockingGeocoder`):
    on the 2.51 build a non-decoupled `execute` holds its instance until it returns, async or
    not (docs/geocoding.md), so the wait is bounded by the deadline instead.
    """

    def __init__(self, settings: GeocoderSettings | None = None) -> None:
        self.settings = settings or GeocoderSettings()
        self._lock = threading.Lock()
        self._blocking: BlockingGeocoder | None = None
        self._observer = GeocodingObserver()
        # Until the adapter's next `observations`; bounded for callers that never ask.
        self._latencies: deque[float] = deque(maxlen=_KEPT_LATENCIES)

    def warm(self) -> WindowGeocoder:
        self._geocoder()
        return self

    def _geocoder(self) -> BlockingGeocoder:
        with self._lock:
            if self._blocking is None:
                self._blocking = BlockingGeocoder(GeocoderChain(self.settings))
            return self._blocking

    def locate(self, window: DispatchWindow) -> tuple[DispatchWindow, NDArray[np.int32]]:
        """``window`` with its NaN pickups / drop-offs geocoded, and the [B, 2] sources
        (all 0 for a window that came with coordinates: the chain is not touched)."""
        if not window.needs_geocoding:
            return window, np.zeros((window.num_orders, 2), dtype=np.int32)
        geocoder = self._geocoder()
        chain = geocoder.chain
        empty = [b""] * window.num_orders
        started = time.perf_counter()
        lookups = _lookups(
            window.pickup,
            window.dropoff,
            pickup_address=(
                empty if window.pickup_address is None else window.pickup_address.tolist()
            ),
            dropoff_address=(
                empty if window.dropoff_address is None else window.dropoff_address.tolist()
            ),
            city=empty if window.city is None else window.city.tolist(),
            fields=_WIRE_FIELDS,
        )
        # Every address already cached (a warm window): answered here, without a hop to
        # the geocoder's event-loop thread.
        found = chain.resolve_cached(lookups.texts, lookups.cities)
        if found is None:
            found = geocoder.run(
                chain.resolve_locations(
                    lookups.texts,
                    lookups.cities,
                    field=lookups.fields,
                    rows=lookups.rows,
                    city_field=wire_name("ORDER_CITY"),
                )
            )
        located = _located(window.pickup, window.dropoff, lookups, found)
        with self._lock:
            self._latencies.append((time.perf_counter() - started) * 1000.0)
        answer = replace(window, pickup=located.pickup, dropoff=located.dropoff)
        return answer, located.source.astype(np.int32)

    def observations(self) -> list[Observation]:
        """The geocoding metrics since the previous call (nothing when no window needed it)."""
        with self._lock:
            latencies = list(self._latencies)
            self._latencies.clear()
            blocking = self._blocking
        if blocking is None or not latencies:
            return []
        found = [Observation(GEOCODING_LATENCY, value) for value in latencies]
        return found + self._observer.observe(blocking.chain.stats(), None)

    def close(self) -> None:
        with self._lock:
            blocking, self._blocking = self._blocking, None
        if blocking is not None:
            blocking.close()
