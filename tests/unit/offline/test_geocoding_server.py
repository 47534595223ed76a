"""The loopback geocoding server in a child process, driven over its /_control endpoints
(what perf.geocoding_bench uses)."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

import pytest

from dispatch_service.offline.geocoding_server import RemoteGeocodingServer


def _get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


def test_child_server_answers_switches_modes_and_stops() -> None:
    with RemoteGeocodingServer(key="k") as server:
        query = urllib.parse.urlencode({"key": "k", "address": "人民广场", "city": "上海"})
        status, body = _get(f"{server.url}/v3/geocode/geo?{query}")
        assert status == 200 and body["count"] == "1"
        server.set_mode("amap", failure="http_500")
        assert _get(f"{server.url}/v3/geocode/geo?{query}")[0] == 500
        wrong_key = urllib.parse.urlencode({"ak": "nope", "address": "人民广场"})
        status, body = _get(f"{server.url}/geocoding/v3/?{wrong_key}")
        assert status == 200 and body["status"] == 200  # baidu's "AK wrong" status
        assert server.calls("amap") == 2
        assert server.calls("baidu") == 1
        with pytest.raises(urllib.error.HTTPError):
            server.set_mode("amap", failure="explode")
    assert server.exit_code == 0  # stopped cleanly when its stdin closed
