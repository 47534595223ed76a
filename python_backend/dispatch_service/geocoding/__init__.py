"""Addresses to WGS-84 coordinates: cache, HTTP geocoding providers, an offline gazetteer.

Layer between `pipeline` (which encodes windows) and `domain` (whose `geo` converts map
datums). Orders that carry a typed address instead of coordinates are resolved here within
a window's deadline; `resolve_window_locations` is the entry point the encoder calls, over
one `GeocoderChain` per model instance (docs/geocoding.md).

The names below are re-exported lazily (module `__getattr__`): importing the package
loads none of its modules, so neither aiohttp nor cpca (and pandas) load until used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dispatch_service.core.lazy import lazy_exports

if TYPE_CHECKING:
    from dispatch_service.geocoding.chain import (
        BlockingGeocoder,
        GeocoderChain,
        GeocoderSettings,
        LocationSource,
    )
    from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer
    from dispatch_service.geocoding.locations import WindowLocations, resolve_window_locations
    from dispatch_service.geocoding.metrics import GEOCODING_METRICS, GeocodingObserver

__all__ = [
    "GEOCODING_METRICS",
    "AdminRecogniser",
    "BlockingGeocoder",
    "Gazetteer",
    "GeocoderChain",
    "GeocoderSettings",
    "GeocodingObserver",
    "LocationSource",
    "WindowLocations",
    "resolve_window_locations",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "chain": ("BlockingGeocoder", "GeocoderChain", "GeocoderSettings", "LocationSource"),
        "gazetteer": ("AdminRecogniser", "Gazetteer"),
        "locations": ("WindowLocations", "resolve_window_locations"),
        "metrics": ("GEOCODING_METRICS", "GeocodingObserver"),
    },
)
