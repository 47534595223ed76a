"""A window's pickup and drop-off points from coordinates or addresses: what the encoder calls.

Per order and end, coordinates win when given; a row whose coordinates are NaN must carry
an address, and both ends of every such order go to the geocoder chain in one batch, so
they share one deadline and one round of concurrent lookups. The answer says per order and
end how each point was found (`chain.LocationSource`: 0 given, 1 cache, 2 geocoder,
3 gazetteer).

Input coordinates must already be WGS-84 (the window converts its stated datum first);
geocoded points are WGS-84 too, so nothing downstream changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.geocoding.chain import AddressText, GeocoderChain

__all__ = ["WindowLocations", "resolve_window_locations"]


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


async def resolve_window_locations(
    chain: GeocoderChain,
    pickup: NDArray[np.float64],
    dropoff: NDArray[np.float64],
    pickup_address: Sequence[AddressText],
    dropoff_address: Sequence[AddressText],
    city: Sequence[AddressText],
    *,
    pickup_field: str = "ORDER_PICKUP",
    dropoff_field: str = "ORDER_DROPOFF",
    deadline_s: float | None = None,
) -> WindowLocations:
    """Fill the NaN rows of ``pickup`` / ``dropoff`` from their addresses (new arrays)."""
    count = len(pickup)
    if not (len(dropoff) == len(pickup_address) == len(dropoff_address) == len(city) == count):
        raise DispatchInputError(
            "address columns", f"must have {count} rows, one per order", code="shape"
        )
    pickup_out = np.array(pickup, dtype=np.float64, copy=True)
    dropoff_out = np.array(dropoff, dtype=np.float64, copy=True)
    source = np.zeros((count, 2), dtype=np.uint8)
    texts: list[AddressText] = []
    cities: list[AddressText] = []
    fields: list[str] = []
    rows: list[int] = []
    slots: list[tuple[int, int]] = []
    for end, (points, name, addresses, field) in enumerate(
        (
            (pickup_out, pickup_field, pickup_address, "pickup_address"),
            (dropoff_out, dropoff_field, dropoff_address, "dropoff_address"),
        )
    ):
        for row in np.flatnonzero(_missing_rows(points, name)).tolist():
            if len(addresses[row]) == 0:
                raise DispatchInputError(
                    field, f"row {row}: must be given when {name} is NaN", code="missing"
                )
            texts.append(addresses[row])
            cities.append(city[row])
            fields.append(field)
            rows.append(row)
            slots.append((row, end))
    if texts:
        found = await chain.resolve_locations(
            texts, cities, field=fields, rows=rows, deadline_s=deadline_s
        )
        for k, (row, end) in enumerate(slots):
            (pickup_out if end == 0 else dropoff_out)[row] = found.latlon[k]
            source[row, end] = found.source[k]
    return WindowLocations(pickup_out, dropoff_out, source)
