"""Fixtures of the geocoding tests: the cpca recogniser, the shipped gazetteer, a real
loopback geocoding server (both API shapes) and a clock the tests move by hand."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from geocoding_helpers import SERVER_KEY, ManualClock

from dispatch_service.geocoding.gazetteer import AdminRecogniser, Gazetteer
from dispatch_service.offline.geocoding_server import GeocodingServer


@pytest.fixture(scope="session")
def recogniser() -> AdminRecogniser:
    return AdminRecogniser()


@pytest.fixture(scope="session")
def gazetteer() -> Gazetteer:
    return Gazetteer.load()


@pytest.fixture(scope="session")
def _server(gazetteer: Gazetteer, recogniser: AdminRecogniser) -> Iterator[GeocodingServer]:
    with GeocodingServer(key=SERVER_KEY, gazetteer=gazetteer, recogniser=recogniser) as server:
        yield server


@pytest.fixture()
def server(_server: GeocodingServer) -> Iterator[GeocodingServer]:
    """The shared server, both shapes healthy and fast at the start of each test."""
    _server.set_mode("amap")
    _server.set_mode("baidu")
    yield _server
    _server.set_mode("amap")
    _server.set_mode("baidu")


@pytest.fixture()
def clock() -> ManualClock:
    return ManualClock()
