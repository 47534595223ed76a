"""The launcher's one HTTP service (aiohttp, on a thread with its own event loop):

- ``/livez`` and ``/readyz``: 200 or 503, for the process manager's probes;
- ``/healthz``: the supervisor's snapshot and the build (`launcher_metrics.build_info`) as
  JSON, 200 while ready, else 503;
- ``/metrics``: the launcher's `prometheus_client` registry (`launcher_metrics`);
- with a control gate, the ``/v2/...`` control requests (`control_gate`): bodies over
  `MAX_CONTROL_BODY_BYTES` are refused before they are read;
- ``extra_routes``: more routes from other parts of the launcher (aiohttp route
  definitions, e.g. ``web.get("/outcomes", handler)``), mounted before the service starts.

Handlers that may block run in threads: the gate's requests (a load may take minutes) in a
pool of their own, the probes and scrapes (collectors take locks) in the loop's default
pool, so loads in flight never hold up a probe.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Protocol

from aiohttp import web
from prometheus_client.registry import CollectorRegistry

from dispatch_service.ops.control_gate import MAX_CONTROL_BODY_BYTES, ControlGate, GateAnswer
from dispatch_service.ops.launcher_metrics import build_info, exposition

__all__ = ["HealthService", "HealthVerdicts", "serve_health"]

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
# Control requests served at once (more wait for a thread); Triton loads one model at a time.
CONTROL_THREADS = 4
_START_TIMEOUT_S = 30.0


class HealthVerdicts(Protocol):
    """What the service serves (`supervisor.Supervisor`)."""

    def live(self) -> bool: ...
    def ready(self) -> bool: ...
    def snapshot(self) -> dict[str, Any]: ...


class HealthService:
    """A started service: its address, and `stop` (which waits for the thread to end)."""

    def __init__(
        self,
        runner: web.AppRunner,
        loop: asyncio.AbstractEventLoop,
        thread: threading.Thread,
        address: tuple[str, int],
    ) -> None:
        self._runner = runner
        self._loop = loop
        self._thread = thread
        self.address = address

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def stop(self, timeout_s: float = 10.0) -> None:
        """Close the listener and open connections, then end the loop's thread."""
        if not self._thread.is_alive():
            return
        done = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
        try:
            done.result(timeout_s)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout_s)


def _text(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text, content_type="text/plain")


def _gate_response(answer: GateAnswer) -> web.Response:
    return web.Response(
        status=answer.status, body=answer.body, headers={"Content-Type": answer.content_type}
    )


def health_app(
    verdicts: HealthVerdicts,
    registry: CollectorRegistry,
    gate: ControlGate | None = None,
    extra_routes: Sequence[web.AbstractRouteDef] = (),
    control_pool: Executor | None = None,
) -> web.Application:
    """The service's application (`serve_health` runs it); ``control_pool`` runs the gate's
    requests (None: the loop's default pool)."""

    async def livez(_: web.Request) -> web.Response:
        ok = await asyncio.to_thread(verdicts.live)
        return _text(200 if ok else 503, "live\n" if ok else "dead\n")

    async def readyz(_: web.Request) -> web.Response:
        ok = await asyncio.to_thread(verdicts.ready)
        return _text(200 if ok else 503, "ready\n" if ok else "not ready\n")

    async def healthz(_: web.Request) -> web.Response:
        snap = await asyncio.to_thread(verdicts.snapshot)
        body = {**snap, "build": build_info()}
        return web.json_response(body, status=200 if snap["ready"] else 503)

    async def metrics(_: web.Request) -> web.Response:
        text = await asyncio.to_thread(exposition, registry)
        return web.Response(text=text, headers={"Content-Type": PROMETHEUS_TEXT})

    async def control(request: web.Request) -> web.Response:
        if gate is None:
            return _text(404, "not found\n")
        headers = {name.lower(): value for name, value in request.headers.items()}
        body: bytes | None = None
        if request.method == "POST":
            length = request.content_length
            if length is not None and length > MAX_CONTROL_BODY_BYTES:
                text = f"Content-Length: a number up to {MAX_CONTROL_BODY_BYTES} bytes"
                response = _gate_response(GateAnswer.error(413, text))
                response.force_close()  # the body is never read
                return response
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:  # chunked, past the cap
                text = f"body: up to {MAX_CONTROL_BODY_BYTES} bytes"
                return _gate_response(GateAnswer.error(413, text))
        answer = await asyncio.get_running_loop().run_in_executor(
            control_pool, gate.handle, request.method, request.raw_path, headers, body
        )
        return _gate_response(answer)

    app = web.Application(client_max_size=MAX_CONTROL_BODY_BYTES)
    app.add_routes(
        [
            web.get("/livez", livez),
            web.get("/readyz", readyz),
            web.get("/healthz", healthz),
            web.get("/metrics", metrics),
            *extra_routes,
            web.get("/v2{tail:.*}", control),
            web.post("/v2{tail:.*}", control),
        ]
    )
    return app


def serve_health(
    verdicts: HealthVerdicts,
    host: str,
    port: int,
    gate: ControlGate | None = None,
    *,
    registry: CollectorRegistry,
    extra_routes: Sequence[web.AbstractRouteDef] = (),
) -> HealthService:
    """Serve `health_app` on ``host:port`` (0: a free port) from a thread of its own; returns
    once it listens. A port that is taken raises `OSError` here."""
    control_pool = ThreadPoolExecutor(CONTROL_THREADS, thread_name_prefix="health-control")
    app = health_app(verdicts, registry, gate, extra_routes, control_pool)
    loop = asyncio.new_event_loop()
    # A stop waits this long for requests in flight (a scrape, a probe; a gate load that
    # takes longer is cut off: the launcher is stopping its server anyway).
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=1.0)
    started = threading.Event()
    failure: list[BaseException] = []
    address: list[tuple[str, int]] = []

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, host, port).start()
        bound = runner.addresses[0]
        address.append((str(bound[0]), int(bound[1])))

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start())
        except BaseException as exc:  # the port taken, most often: raised in serve_health
            failure.append(exc)
            started.set()
            loop.run_until_complete(runner.cleanup())
            loop.close()
            control_pool.shutdown(wait=False)
            return
        started.set()
        try:
            loop.run_forever()
        finally:  # connections the cleanup left (a client that never sent its request)
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()
            control_pool.shutdown(wait=False, cancel_futures=True)

    thread = threading.Thread(target=run, name="health-http", daemon=True)
    thread.start()
    if not started.wait(_START_TIMEOUT_S):
        raise OSError(f"the health endpoint did not start on {host}:{port}")
    if failure:
        thread.join()
        raise failure[0]
    return HealthService(runner, loop, thread, address[0])
