"""The outcome service: ``POST /v1/outcomes`` (and ``GET /v1/quality``) over one store.

`OutcomeService.routes` are aiohttp route definitions the launcher mounts on its HTTP
service (`ops.health_endpoint`'s ``extra_routes``); `OutcomeService.collector` is the
Prometheus collector its ``/metrics`` registers (reports by result and refusal reason,
and the live quality gauges). `serve_outcomes` runs the same routes as an app of their
own (for an analysis host, or tests).

Both routes take the outcome key (`dispatch_contract.keys`-style: header
`OUTCOME_KEY_HEADER`), never the admin key: the platform that reports outcomes gets no
control of the server. The key is compared in constant time. A report is read up to
`MAX_OUTCOME_BODY_BYTES` (a longer body is refused unread, 413), checked and stored by
`ingest.ingest_report` on a thread of its own (the store is blocking), so a slow store
slows only the reports. Every refusal names its reason (`dispatch_contract.outcomes`).

Housekeeping (`OutcomeService.start_housekeeping`: every `HOUSEKEEPING_INTERVAL_S`):
the retention period and size bound (`StoreLimits`) applied, and the quality figures
recomputed over the outcomes received in the last `QUALITY_WINDOW_S`.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dispatch_contract.outcomes import (
    MAX_OUTCOME_BODY_BYTES,
    OUTCOME_KEY_HEADER,
    OUTCOMES_PATH,
    RefusalReason,
)
from dispatch_service.outcomes.ingest import ReportAnswer, ReportRefusedError, ingest_report
from dispatch_service.outcomes.quality import QualityFigures, QualityKey, live_quality
from dispatch_service.outcomes.sql_store import open_store
from dispatch_service.outcomes.store import OutcomeStore, StoreError, StoreLimits

__all__ = [
    "HOUSEKEEPING_INTERVAL_S",
    "OUTCOME_SERIES",
    "QUALITY_PATH",
    "QUALITY_WINDOW_S",
    "OutcomeService",
    "serve_outcomes",
]

QUALITY_PATH: Final = "/v1/quality"
HOUSEKEEPING_INTERVAL_S: Final = 30.0
QUALITY_WINDOW_S: Final = 3600.0
# The gauges, one per figure (`QualityFigures`), labelled model_version, city, fallback_level.
QUALITY_GAUGES: Final = {
    "deliveries": "deliveries the figures are over (outcomes received in the window)",
    "eta_mae": "mean absolute error of the predicted ETA, minutes",
    "eta_bias": "mean (predicted - realised) minutes to delivery",
    "brier": "Brier score of the predicted on-time probability",
    "ece": "expected calibration error of the on-time probability (10 bins)",
    "late_rate": "share of deliveries later than promised",
    "delivery_minutes": "mean minutes from decision to delivery",
    "cost": "mean predicted cost of the assigned pair, CNY",
}
_RECEIVED: Final = "dispatch_outcomes_received"
_STORE_ERRORS: Final = "dispatch_outcome_store_errors"
# Every series the collector exports, as Prometheus names them (counters end in _total).
OUTCOME_SERIES: Final = (
    f"{_RECEIVED}_total",
    f"{_STORE_ERRORS}_total",
    *(f"dispatch_quality_{name}" for name in QUALITY_GAUGES),
)


@dataclass
class _Tally:
    """Records received since the start, by result (and refusal reason)."""

    stored: int = 0
    duplicates: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, answer: ReportAnswer) -> None:
        with self.lock:
            self.stored += answer.stored
            self.duplicates += answer.duplicates
            for refusal in answer.refused:
                self.refused[refusal.reason] = self.refused.get(refusal.reason, 0) + 1

    def refuse(self, reason: RefusalReason) -> None:
        with self.lock:
            self.refused[reason] = self.refused.get(reason, 0) + 1


class OutcomeService:
    """The routes, the collector and the housekeeping over one store (opened lazily, on
    the service's own thread, and again after a failure)."""

    def __init__(
        self,
        store_url: str,
        key: str,
        *,
        limits: StoreLimits | None = None,
        quality_window_s: float = QUALITY_WINDOW_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not key:
            raise ValueError("the outcome service needs a key")
        self.store_url = store_url
        self._key = key.encode("utf-8")
        self.limits = limits or StoreLimits()
        self.quality_window_s = quality_window_s
        self.clock = clock
        self._store: OutcomeStore | None = None
        # One thread owns the store: reports, housekeeping and quality queue on it.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outcome-store")
        self.tally = _Tally()
        self.quality: dict[QualityKey, QualityFigures] = {}
        self.store_errors = 0
        self._stop = threading.Event()
        self._housekeeper: threading.Thread | None = None

    # ---- the store, on its thread ----------------------------------------------------------

    def _with_store(self, work: Callable[[OutcomeStore], Any]) -> Any:
        if self._store is None:
            self._store = open_store(self.store_url)
        try:
            return work(self._store)
        except StoreError:
            store, self._store = self._store, None
            store.close()
            raise

    async def _on_store(self, work: Callable[[OutcomeStore], Any]) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._with_store, work)

    def close(self) -> None:
        """Stop the housekeeping and close the store."""
        self._stop.set()
        if self._housekeeper is not None:
            self._housekeeper.join(timeout=10.0)

        def close() -> None:
            if self._store is not None:
                self._store.close()
                self._store = None

        self._executor.submit(close).result(timeout=10.0)
        self._executor.shutdown(wait=True)

    # ---- HTTP ------------------------------------------------------------------------------

    def routes(self) -> list[web.RouteDef]:
        return [web.post(OUTCOMES_PATH, self.report), web.get(QUALITY_PATH, self.read_quality)]

    def _refused(self, status: int, reason: RefusalReason, detail: str) -> web.Response:
        self.tally.refuse(reason)
        response = web.json_response({"error": str(reason), "detail": detail}, status=status)
        if status == 413:
            response.force_close()  # the rest of the body is never read
        return response

    def _key_refusal(self, request: web.Request) -> web.Response | None:
        given = request.headers.get(OUTCOME_KEY_HEADER)
        if not given:
            return self._refused(
                401, RefusalReason.MISSING_KEY, f"send the outcome key in {OUTCOME_KEY_HEADER!r}"
            )
        if not hmac.compare_digest(given.encode("utf-8", "surrogateescape"), self._key):
            return self._refused(401, RefusalReason.WRONG_KEY, "the outcome key does not match")
        return None

    async def report(self, request: web.Request) -> web.Response:
        refusal = self._key_refusal(request)
        if refusal is not None:
            return refusal
        too_large = (
            RefusalReason.BODY_TOO_LARGE,
            f"at most {MAX_OUTCOME_BODY_BYTES} bytes per report: send several",
        )
        if (request.content_length or 0) > MAX_OUTCOME_BODY_BYTES:
            return self._refused(413, *too_large)
        chunks: list[bytes] = []
        size = 0
        while chunk := await request.content.read(65_536):  # a chunked body has no length
            size += len(chunk)
            if size > MAX_OUTCOME_BODY_BYTES:
                return self._refused(413, *too_large)
            chunks.append(chunk)
        body = b"".join(chunks)
        now = self.clock()
        try:
            answer: ReportAnswer = await self._on_store(
                lambda store: ingest_report(body, store, clock=lambda: now)
            )
        except ReportRefusedError as exc:
            return self._refused(exc.status, exc.reason, exc.detail)
        except StoreError as exc:
            self.store_errors += 1
            return self._refused(503, RefusalReason.STORE_UNAVAILABLE, str(exc)[:300])
        self.tally.add(answer)
        return web.json_response(answer.to_json_dict())

    async def read_quality(self, request: web.Request) -> web.Response:
        """The figures over outcomes received since ``?since=`` (unix s; default: the
        quality window), as JSON."""
        refusal = self._key_refusal(request)
        if refusal is not None:
            return refusal
        try:
            since = float(request.query.get("since", self.clock() - self.quality_window_s))
        except ValueError:
            return web.json_response(
                {"error": "bad_since", "detail": "since: unix seconds"}, status=400
            )
        try:
            figures = await self._on_store(lambda store: live_quality(store.joined(since=since)))
        except StoreError as exc:
            return self._refused(503, RefusalReason.STORE_UNAVAILABLE, str(exc)[:300])
        return web.json_response({"since": since, "quality": quality_json(figures)})

    # ---- housekeeping --------------------------------------------------------------------

    def housekeep(self) -> None:
        """Retention and size bound applied, the quality gauges recomputed (blocking: on the
        store's thread)."""

        def work(store: OutcomeStore) -> dict[QualityKey, QualityFigures]:
            now = self.clock()
            store.prune(self.limits, now=now)
            return live_quality(store.joined(since=now - self.quality_window_s))

        try:
            self.quality = self._executor.submit(self._with_store, work).result()
        except Exception:  # the store down (or closing): the next round tries again
            self.store_errors += 1

    def start_housekeeping(self, interval_s: float = HOUSEKEEPING_INTERVAL_S) -> None:
        """`housekeep` now and every ``interval_s`` from a thread of its own, until `close`."""

        def run() -> None:
            while True:
                self.housekeep()
                if self._stop.wait(interval_s):
                    return

        self._housekeeper = threading.Thread(target=run, name="outcome-housekeeping", daemon=True)
        self._housekeeper.start()

    # ---- Prometheus ------------------------------------------------------------------------

    def collector(self) -> Collector:
        return _OutcomeCollector(self)


def quality_json(figures: dict[QualityKey, QualityFigures]) -> list[dict[str, Any]]:
    """The figures as JSON rows (NaN, where there were no deliveries, as null)."""
    return [
        {
            "model_version": key.model_version,
            "city": key.city,
            "fallback_level": key.fallback_level,
            **{
                name: (None if isinstance(v, float) and math.isnan(v) else v)
                for name, v in value.to_json_dict().items()
            },
        }
        for key, value in figures.items()
    ]


class _OutcomeCollector(Collector):
    def __init__(self, service: OutcomeService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        tally = self.service.tally
        received = CounterMetricFamily(
            _RECEIVED,
            "outcome records received, by result (stored, duplicate, refused) and refusal reason",
            labels=["result", "reason"],
        )
        with tally.lock:
            received.add_metric(["stored", ""], tally.stored)
            received.add_metric(["duplicate", ""], tally.duplicates)
            for reason, count in sorted(tally.refused.items()):
                received.add_metric(["refused", str(reason)], count)
        yield received
        errors = CounterMetricFamily(
            _STORE_ERRORS, "outcome store failures seen by the outcome service"
        )
        errors.add_metric([], self.service.store_errors)
        yield errors
        labels = ["model_version", "city", "fallback_level"]
        quality = self.service.quality
        for name, description in QUALITY_GAUGES.items():
            gauge = GaugeMetricFamily(f"dispatch_quality_{name}", description, labels=labels)
            for key, figures in quality.items():
                value = float(getattr(figures, name))
                if not math.isnan(value):
                    gauge.add_metric(
                        [str(key.model_version), key.city, str(key.fallback_level)], value
                    )
            yield gauge


def serve_outcomes(service: OutcomeService) -> web.Application:
    """The service's routes as an app of their own (run it with `aiohttp.web.run_app` or an
    AppRunner; `OutcomeService.start_housekeeping` beside it)."""
    app = web.Application(client_max_size=MAX_OUTCOME_BODY_BYTES + 1)
    app.add_routes(service.routes())
    return app
