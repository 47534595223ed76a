"""Addresses to WGS-84 coordinates: cache, HTTP geocoding providers, an offline gazetteer.

Layer between `pipeline` (which encodes windows) and `domain` (whose `geo` converts map
datums). Orders that carry a typed address instead of coordinates are resolved here within
a window's deadline; `chain.GeocoderChain.resolve` is the entry point the encoder calls.
"""

__all__: list[str] = []
