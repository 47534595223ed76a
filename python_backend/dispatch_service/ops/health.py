"""A health check that tells the truth: each entry point answers a real small window.

Triton's `/v2/health/ready` says only that the models it loaded are ready: it answers 200
with `dispatch` missing and while inference hangs. The launcher therefore asks each required
entry point for one small window over gRPC with a short deadline, and, when one is missing,
explains why from the repository index and the signature verdicts, with the command that
fixes a refused signature.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from numpy.typing import NDArray

from dispatch_client.client import DispatchClient
from dispatch_client.errors import DispatchConnectionError, DispatchError, DispatchServerError
from dispatch_client.retry import NO_RETRY, UNAVAILABLE_STATUSES
from dispatch_client.transport import GrpcTransport
from dispatch_client.window_json import window_from_json
from dispatch_service.ops.model_control import ModelControlError, repository_index
from dispatch_service.ops.verified_load import LoadPlan
from dispatch_service.serving.probe import PROBE_PARAMETER

__all__ = [
    "PROBE_ORDERS",
    "PROBE_PRIORITY",
    "PROBE_RIDERS",
    "Probe",
    "deep_check",
    "explain_missing",
    "probe",
    "probe_window",
]

PROBE_WINDOW_FILE = "data/probe_window.json"
PROBE_ORDERS = 2
PROBE_RIDERS = 4
# Probes go at the standard level: ahead of every bulk window, and out of level 1, whose
# queue holds 4 windows that any caller may fill (docs/operations.md).
PROBE_PRIORITY = 2
_BUSY_STATUSES = UNAVAILABLE_STATUSES | {"StatusCode.DEADLINE_EXCEEDED"}


@cache
def probe_window() -> Mapping[str, NDArray[Any]]:
    """One small fixed window (2 orders, 4 riders, in Shanghai): cheap to serve, real to
    check. It is data (`ops/data/probe_window.json`, a simulated window) so that the launcher
    never runs the simulator."""
    text = files("dispatch_service.ops").joinpath(PROBE_WINDOW_FILE).read_text(encoding="utf-8")
    return window_from_json(text)


@dataclass(frozen=True)
class Probe:
    model: str
    ok: bool
    detail: str  # "" when ok
    seconds: float
    # Failed only for want of capacity: refused by a full queue, its queue deadline passed
    # or no answer in time. A server that is shedding load is alive if it still completes
    # other requests; the supervisor checks that (a hung one completes none).
    busy: bool = False
    # A full answer came, but through this fallback level (the scoring model away or
    # failing, the rule fallback answering): the entry point serves, degraded. 0: none.
    fallback_level: int = 0

    @property
    def degraded(self) -> bool:
        return not self.ok and self.fallback_level > 0

    def line(self) -> str:
        state = "ok" if self.ok else f"FAILED: {self.detail}"
        return f"{self.model}: {state} ({self.seconds * 1000:.0f} ms)"


def probe(
    grpc_url: str, model: str, timeout_s: float = 2.0, priority_key: str | None = None
) -> Probe:
    """Send the probe window to ``model``; ok when a full answer, scored by the chosen model
    version (no fallback), comes within the deadline. ``priority_key``: the server's, which
    the priority lane asks of every window (`dispatch_contract.keys`)."""
    start = time.monotonic()
    window = probe_window()
    busy = False
    fallback = 0
    # Marked as a probe: the models leave it out of the project's metrics (`serving.probe`).
    transport = GrpcTransport(grpc_url, timeout_s=timeout_s, parameters={PROBE_PARAMETER: True})
    try:
        # One send per probe: the verdict is what the server answers now, and the supervisor
        # already probes again on its own schedule. To the entry point named, not to the
        # priority lane a level-1 window would go to.
        client = DispatchClient(
            transport,
            model_name=model,
            priority=PROBE_PRIORITY,
            retry=NO_RETRY,
            priority_lane=None,
            priority_key=priority_key,
        )
        with client as c:
            result = c.dispatch(window)
        degraded = sorted({o.fallback_level for o in result.orders if o.fallback_level})
        if len(result.orders) != len(window["ORDER_IDS"]):
            ok, detail = False, f"answered {len(result.orders)} orders for {PROBE_ORDERS}"
        elif degraded:  # a fallback answer: the scoring model behind it is failing
            ok, detail = False, f"answered through fallback level {degraded[-1]}"
            fallback = int(degraded[-1])
        else:
            ok, detail = True, ""
    except DispatchError as exc:
        ok, detail = False, exc.message
        busy = isinstance(exc, DispatchConnectionError) or (
            isinstance(exc, DispatchServerError) and exc.status in _BUSY_STATUSES
        )
    except Exception as exc:  # a probe never raises: what failed is the verdict
        ok, detail = False, f"{type(exc).__name__}: {exc}"
    return Probe(model, ok, detail, time.monotonic() - start, busy, fallback)


def deep_check(
    grpc_url: str,
    models: Sequence[str],
    timeout_s: float = 2.0,
    priority_key: str | None = None,
) -> list[Probe]:
    """One probe per entry point, all at once (a hung server costs one deadline, not one
    per entry point); results in the order of ``models``."""
    if len(models) <= 1:
        return [probe(grpc_url, model, timeout_s, priority_key) for model in models]
    with ThreadPoolExecutor(max_workers=len(models), thread_name_prefix="probe") as pool:
        return list(pool.map(lambda model: probe(grpc_url, model, timeout_s, priority_key), models))


def explain_missing(
    http_url: str,
    models: Sequence[str],
    admin_key: str | None,
    plan: LoadPlan | None,
    timeout_s: float = 10.0,
) -> dict[str, str]:
    """Why each of ``models`` that is not READY is missing, as one line each."""
    try:
        index = repository_index(http_url, admin_key, timeout_s)
    except ModelControlError as exc:
        return {model: f"repository index unavailable ({exc})" for model in models}
    ready = {e["name"] for e in index if e.get("state") == "READY"}
    states = {e["name"]: e for e in index if e.get("state") != "READY"}
    refused_versions = [] if plan is None else list(plan.refused_versions)
    reasons = {}
    for model in models:
        if model in ready:
            continue
        if plan is not None and model in plan.refused:
            why = f"refused by signature verification: {plan.refused[model]}"
        elif model in states:
            entry = states[model]
            why = f"{entry.get('state', 'not loaded')}: {entry.get('reason') or 'no reason given'}"
        else:
            why = "not in the model repository"
        if refused_versions:
            fix = "; ".join(
                f"dispatch-admin sign --model {v.model} --version {v.version} --key KEY"
                for v in refused_versions
            )
            why += f" (refused versions: {fix}, then restart)"
        reasons[model] = why
    return reasons
