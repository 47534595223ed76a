"""Geocoding providers over HTTP, in the request/response shapes of Chinese map APIs.

Two shapes are spoken, the two most common in Chinese order systems:

- ``amap``: ``GET {base}/v3/geocode/geo?key=&address=&city=&output=JSON`` answering
  ``{"status": "1", "count": "1", "geocodes": [{"location": "lng,lat", "adcode": ...}]}``
  with GCJ-02 coordinates; ``status "0"`` is an error (``info`` says which);
- ``baidu``: ``GET {base}/geocoding/v3/?ak=&address=&city=&output=json&ret_coordtype=bd09ll``
  answering ``{"status": 0, "result": {"location": {"lng": .., "lat": ..}}}`` with BD-09
  coordinates; a non-zero ``status`` is an error, except "no result" (无相关结果).

Base URL and key come from configuration (`chain.GeocoderSettings`), never from code.
Answers are converted to WGS-84 with `domain.geo.to_wgs84`, so the rest of the service
never sees a Chinese datum.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from dispatch_contract import CoordSystem
from dispatch_service.domain import geo
from dispatch_service.geocoding.cache import LatLon

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "PROVIDER_DATUM",
    "PROVIDER_KINDS",
    "HttpGeocodeProvider",
    "ProviderConfig",
    "ProviderError",
    "RawPoint",
    "to_wgs84_points",
]

PROVIDER_KINDS: Final = ("amap", "baidu")
PROVIDER_DATUM: Final = {"amap": CoordSystem.GCJ02, "baidu": CoordSystem.BD09}
_BAIDU_NO_RESULT: Final = "无相关结果"


# (lat, lon, datum) as a provider answered.
RawPoint = tuple[float, float, CoordSystem]


def to_wgs84_points(points: list[RawPoint]) -> list[LatLon]:
    """Provider answers in WGS-84, one vectorised conversion per datum."""
    out: list[LatLon] = [(0.0, 0.0)] * len(points)
    for datum in {p[2] for p in points}:
        index = [i for i, p in enumerate(points) if p[2] == datum]
        wgs = geo.to_wgs84(np.array([points[i][:2] for i in index]), datum)
        for k, i in enumerate(index):
            out[i] = (float(wgs[k, 0]), float(wgs[k, 1]))
    return out


class ProviderError(RuntimeError):
    """The provider failed (transport, HTTP status, error status, malformed answer)."""


@dataclass(frozen=True)
class ProviderConfig:
    """One provider: its API shape, where it is and the key it wants."""

    name: str
    kind: str
    base_url: str
    key: str

    def __post_init__(self) -> None:
        if self.kind not in PROVIDER_KINDS:
            raise ValueError(
                f"provider {self.name!r}: kind must be one of {', '.join(PROVIDER_KINDS)}"
            )
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"provider {self.name!r}: base_url must be an http(s) URL")


class HttpGeocodeProvider:
    """Turns one address into a WGS-84 point through one provider's HTTP API."""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self.name = config.name
        self.datum = PROVIDER_DATUM[config.kind]
        base = config.base_url.rstrip("/")
        if config.kind == "amap":
            self._url = f"{base}/v3/geocode/geo"
        else:
            self._url = f"{base}/geocoding/v3/"

    def _params(self, address: str, city: str) -> dict[str, str]:
        if self.config.kind == "amap":
            params = {"key": self.config.key, "address": address, "output": "JSON"}
        else:
            params = {
                "ak": self.config.key,
                "address": address,
                "output": "json",
                "ret_coordtype": "bd09ll",
            }
        if city:
            params["city"] = city
        return params

    async def geocode(
        self, session: aiohttp.ClientSession, address: str, city: str, timeout_s: float
    ) -> RawPoint | None:
        """(lat, lon, datum) of ``address`` as the provider answered it; None when the
        provider knows no such place. The caller converts a window's answers to WGS-84 in
        one vectorised call (`to_wgs84_points`): one point at a time, the inverse datum
        iteration costs more than the HTTP call.

        Raises `ProviderError` on any failure, `asyncio.TimeoutError` past ``timeout_s``.
        """
        import aiohttp  # loaded with the session that calls this (`GeocoderChain._http`)

        async with asyncio.timeout(timeout_s):
            try:
                async with session.get(self._url, params=self._params(address, city)) as reply:
                    if reply.status != 200:
                        raise ProviderError(f"{self.name}: HTTP {reply.status}")
                    body = await reply.json(content_type=None)
            except aiohttp.ClientError as exc:
                # The type only: some aiohttp messages carry the URL, and with it the key.
                raise ProviderError(f"{self.name}: {type(exc).__name__}") from exc
            except ValueError as exc:  # body is not JSON
                raise ProviderError(f"{self.name}: answer is not JSON") from exc
        point = self._parse(body)
        if point is None:
            return None
        return point[0], point[1], self.datum

    def _parse(self, body: Any) -> LatLon | None:
        """(lat, lon) in the provider's datum, None for "no such place"."""
        if not isinstance(body, dict):
            raise ProviderError(f"{self.name}: answer is not a JSON object")
        try:
            if self.config.kind == "amap":
                if str(body.get("status")) != "1":
                    raise ProviderError(f"{self.name}: status {body.get('info', '?')}")
                found = body.get("geocodes") or []
                if not found:
                    return None
                lng_text, lat_text = str(found[0]["location"]).split(",")
                lat, lon = float(lat_text), float(lng_text)
            else:
                status = int(body.get("status", -1))
                if status != 0:
                    if _BAIDU_NO_RESULT in str(body.get("msg", "")):
                        return None
                    raise ProviderError(f"{self.name}: status {status} {body.get('msg', '')}")
                location = body["result"]["location"]
                lat, lon = float(location["lat"]), float(location["lng"])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ProviderError(f"{self.name}: malformed answer ({exc!r})") from exc
        if not (math.isfinite(lat) and math.isfinite(lon)) or not bool(
            geo.in_mainland_china(lat, lon)
        ):
            raise ProviderError(f"{self.name}: answered a point outside China ({lat}, {lon})")
        return lat, lon
