"""A real local HTTP geocoding server for tests and benchmarks, serving the city gazetteer.

It speaks both provider shapes `dispatch_service.geocoding.providers` calls (``amap``:
GCJ-02 answers; ``baidu``: BD-09 answers) on loopback, and answers from the gazetteer (road
+ house number or POI matches only, as a map provider would) plus any extra places a test
adds. Its latency and failure mode can be switched while it runs:

| failure | what the client sees |
| --- | --- |
| ``none`` | a normal answer after ``latency_ms`` |
| ``http_500`` | HTTP 500 |
| ``error_status`` | HTTP 200 with the provider's error status (bad key, quota) |
| ``garbage`` | HTTP 200 with a body that is not JSON |
| ``hang`` | no answer for a minute (the client's timeout fires) |

The server runs its own event loop on a daemon thread, so a slow answer never slows the
test's or the benchmark's loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import numpy as np
from aiohttp import web

from dispatch_contract import CoordSystem
from dispatch_service.core.model_config import read_model_config, write_model_config
from dispatch_service.core.repository_layout import ENCODER_MODEL, model_layout
from dispatch_service.domain import geo
from dispatch_service.geocoding.gazetteer import (
    AdminRecogniser,
    Gazetteer,
    MatchKind,
    match_address,
)
from dispatch_service.geocoding.normalize import normalize_address

__all__ = [
    "FAILURE_MODES",
    "GeocodingServer",
    "RemoteGeocodingServer",
    "ServerMode",
    "main",
    "use_as_providers",
]

FAILURE_MODES: Final = ("none", "http_500", "error_status", "garbage", "hang")
_HANG_S: Final = 60.0


@dataclass
class ServerMode:
    latency_ms: float = 0.0
    failure: str = "none"


@dataclass
class _State:
    modes: dict[str, ServerMode] = field(
        default_factory=lambda: {"amap": ServerMode(), "baidu": ServerMode()}
    )
    calls: Counter[str] = field(default_factory=Counter)
    extra: dict[str, tuple[float, float]] = field(default_factory=dict)


class GeocodingServer:
    """``with GeocodingServer(key="k") as server: server.url`` (loopback, a free port)."""

    def __init__(
        self,
        key: str = "test-key",
        gazetteer: Gazetteer | None = None,
        recogniser: AdminRecogniser | None = None,
    ) -> None:
        self.key = key
        self.gazetteer = gazetteer or Gazetteer.load()
        self.recogniser = recogniser or AdminRecogniser()
        self._state = _State()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    # ------------------------------------------------------------------- control

    def set_mode(self, kind: str, latency_ms: float = 0.0, failure: str = "none") -> None:
        """Switch one API shape's behaviour ("amap" or "baidu") from now on."""
        if failure not in FAILURE_MODES:
            raise ValueError(f"failure must be one of {', '.join(FAILURE_MODES)}")
        with self._lock:
            self._state.modes[kind] = ServerMode(latency_ms, failure)

    def add_place(self, address: str, latlon: tuple[float, float]) -> None:
        """A place only the server knows (WGS-84), by normalised address."""
        with self._lock:
            self._state.extra[normalize_address(address)] = latlon

    def calls(self, kind: str) -> int:
        with self._lock:
            return self._state.calls[kind]

    # ------------------------------------------------------------------- answers

    def _locate(self, address: str, city: str) -> tuple[float, float] | None:
        text = normalize_address(address)
        with self._lock:
            if text in self._state.extra:
                return self._state.extra[text]
        code = self.recogniser.city_adcode(city) if city else None
        found = match_address(text, code, self.gazetteer, self.recogniser)
        if found is None or found.kind not in (MatchKind.ROAD_NUMBER, MatchKind.POI):
            return None
        return found.latlon

    async def _answer(self, request: web.Request, kind: str) -> web.Response:
        with self._lock:
            mode = self._state.modes[kind]
            self._state.calls[kind] += 1
        if mode.failure == "hang":
            await asyncio.sleep(_HANG_S)
        if mode.latency_ms > 0:
            await asyncio.sleep(mode.latency_ms / 1000.0)
        if mode.failure == "http_500":
            return web.Response(status=500, text="internal error")
        if mode.failure == "garbage":
            return web.Response(status=200, text="<html>busy</html>")
        query = request.rel_url.query
        key = query.get("key" if kind == "amap" else "ak", "")
        if mode.failure == "error_status" or key != self.key:
            if kind == "amap":
                return web.json_response(
                    {"status": "0", "info": "INVALID_USER_KEY", "infocode": "10001"}
                )
            return web.json_response({"status": 200, "msg": "APP不存在\uff0cAK有误请检查再重试"})
        point = await asyncio.to_thread(
            self._locate, query.get("address", ""), query.get("city", "")
        )
        if kind == "amap":
            if point is None:
                return web.json_response(
                    {"status": "1", "info": "OK", "infocode": "10000", "count": "0",
                     "geocodes": []}
                )  # fmt: skip
            lat, lon = geo.from_wgs84(np.array([point]), CoordSystem.GCJ02)[0]
            return web.json_response(
                {
                    "status": "1",
                    "info": "OK",
                    "infocode": "10000",
                    "count": "1",
                    "geocodes": [
                        {
                            "formatted_address": query.get("address", ""),
                            "location": f"{lon:.6f},{lat:.6f}",
                            "level": "门牌号",
                        }
                    ],
                }
            )
        if point is None:
            return web.json_response({"status": 1, "msg": "Internal Service Error:无相关结果"})
        lat, lon = geo.from_wgs84(np.array([point]), CoordSystem.BD09)[0]
        return web.json_response(
            {
                "status": 0,
                "result": {
                    "location": {"lng": round(float(lon), 6), "lat": round(float(lat), 6)},
                    "precise": 1,
                    "confidence": 80,
                    "comprehension": 100,
                    "level": "门址",
                },
            }
        )

    async def _amap(self, request: web.Request) -> web.Response:
        return await self._answer(request, "amap")

    async def _baidu(self, request: web.Request) -> web.Response:
        return await self._answer(request, "baidu")

    async def _control_mode(self, request: web.Request) -> web.Response:
        body = await request.json()
        try:
            self.set_mode(
                str(body["kind"]),
                float(body.get("latency_ms", 0.0)),
                str(body.get("failure", "none")),
            )
        except (KeyError, ValueError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response({"ok": True})

    async def _control_calls(self, _: web.Request) -> web.Response:
        with self._lock:
            return web.json_response(dict(self._state.calls))

    # ------------------------------------------------------------------- lifecycle

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_get("/v3/geocode/geo", self._amap)
        app.router.add_get("/geocoding/v3/", self._baidu)
        app.router.add_post("/_control/mode", self._control_mode)
        app.router.add_get("/_control/calls", self._control_calls)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
        await web.SockSite(self._runner, sock).start()
        return f"http://127.0.0.1:{port}"

    def start(self) -> str:
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="geocoding-server", daemon=True
        )
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self.url

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        # Handlers still sleeping (hang mode) end here, not as "destroyed but pending".
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> GeocodingServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


class RemoteGeocodingServer:
    """The same server in a child process (its own interpreter and GIL), driven over its
    ``/_control`` endpoints: for benchmarks and for a Triton server's models to call."""

    def __init__(self, key: str = "test-key") -> None:
        self.key = key
        self._process: subprocess.Popen[str] | None = None
        self.url = ""
        self.exit_code: int | None = None  # the child's, once stopped

    def start(self) -> str:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "dispatch_service.offline.geocoding_server", "--key", self.key],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if not line.startswith("URL "):
            self.stop()
            raise RuntimeError(f"geocoding server did not start: {line!r}")
        self.url = line.split(" ", 1)[1]
        return self.url

    def set_mode(self, kind: str, latency_ms: float = 0.0, failure: str = "none") -> None:
        body = json.dumps({"kind": kind, "latency_ms": latency_ms, "failure": failure})
        request = urllib.request.Request(
            f"{self.url}/_control/mode", data=body.encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as reply:
            reply.read()

    def calls(self, kind: str) -> int:
        with urllib.request.urlopen(f"{self.url}/_control/calls", timeout=10) as reply:
            return int(json.loads(reply.read()).get(kind, 0))

    def stop(self) -> None:
        if self._process is not None:
            if self._process.stdin is not None:
                self._process.stdin.close()  # the child stops when its stdin closes
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            if self._process.stdout is not None:
                self._process.stdout.close()
            self.exit_code = self._process.returncode
            self._process = None

    def __enter__(self) -> RemoteGeocodingServer:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def use_as_providers(
    repository: Path,
    url: str,
    key: str,
    settings: Mapping[str, str] | None = None,
    key_file: Path | None = None,
) -> None:
    """Point the feature_encoder of a repository copy (and so dispatch_fused, which reads
    its settings) at this server as both providers: amap shape primary, baidu secondary;
    ``settings`` sets further `GeocoderSettings` parameters. With ``key_file`` the key is
    written there (mode 600) and the config names the file, as a deployment would."""
    path = model_layout(repository, ENCODER_MODEL).config
    config = read_model_config(path)
    values = {
        "geocoder_primary_kind": "amap",
        "geocoder_primary_url": url,
        "geocoder_secondary_kind": "baidu",
        "geocoder_secondary_url": url,
    }
    for which in ("primary", "secondary"):
        if key_file is None:
            values[f"geocoder_{which}_key"] = key
        else:
            values[f"geocoder_{which}_key_file"] = str(key_file)
    if key_file is not None:
        key_file.write_text(key + "\n", encoding="utf-8")
        key_file.chmod(0o600)
    values.update(settings or {})
    for name, value in values.items():
        config.parameters[name].string_value = str(value)
    write_model_config(path, config)


def main(argv: list[str] | None = None) -> int:
    """Serve on loopback until stdin closes; the first stdout line is ``URL <url>``."""
    parser = argparse.ArgumentParser(description="local geocoding server (tests, benchmarks)")
    parser.add_argument("--key", default="test-key")
    args = parser.parse_args(argv)
    with GeocodingServer(key=args.key) as server:
        print(f"URL {server.url}", flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
