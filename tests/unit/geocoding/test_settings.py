"""GeocoderSettings come from config.pbtxt parameters like every other model setting."""

from __future__ import annotations

import pytest

from dispatch_service.core.settings import SettingsError, load_settings
from dispatch_service.geocoding.chain import GeocoderSettings
from dispatch_service.geocoding.providers import ProviderConfig


def test_parameters_become_typed_settings_and_providers() -> None:
    settings = load_settings(
        GeocoderSettings,
        {
            "geocoder_primary_url": "http://127.0.0.1:9000",
            "geocoder_primary_key": "k1",
            "geocoder_secondary_kind": "amap",
            "geocoder_secondary_url": "https://geo.example.internal/",
            "geocoder_secondary_key": "k2",
            "geocoder_deadline_ms": "250",
            "geocoder_cache_entries": "500",
        },
    )
    assert settings.geocoder_deadline_ms == 250.0
    assert settings.geocoder_cache_entries == 500
    assert settings.providers() == [
        ProviderConfig("primary", "amap", "http://127.0.0.1:9000", "k1"),
        ProviderConfig("secondary", "amap", "https://geo.example.internal/", "k2"),
    ]


def test_no_url_means_no_provider() -> None:
    assert GeocoderSettings().providers() == []


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"geocoder_deadline_ms": "0"}, "geocoder_deadline_ms must be > 0"),
        ({"geocoder_fallback_reserve_ms": "300"}, "geocoder_fallback_reserve_ms must lie in"),
        ({"geocoder_max_concurrency": "0"}, "geocoder_max_concurrency must be >= 1"),
        ({"geocoder_deadline_ms": "soon"}, "is not a valid float"),
    ],
)
def test_bad_values_fail_at_load(parameters: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(GeocoderSettings, parameters)


@pytest.mark.parametrize(
    ("kind", "url", "message"),
    [("google", "http://x", "kind must be one of amap, baidu"), ("amap", "ftp://x", "http")],
)
def test_bad_provider_is_refused_at_load(kind: str, url: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(
            GeocoderSettings, {"geocoder_primary_kind": kind, "geocoder_primary_url": url}
        )
