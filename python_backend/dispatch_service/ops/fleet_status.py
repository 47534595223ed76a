"""What every replica of the fleet routes by: the answer of `dispatch-admin status`.

Each launcher says on its health endpoint (``/healthz`` field ``fleet_state``) which revision
it serves and, per entry-point process, which routing that process reads now (its report
beside the live routing file, `routing.live.write_entry_point`). `fleet_status` asks every
replica registered in the store and every one named, and says of each whether it and all its
entry points route by the stored revision.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any, Final

from dispatch_service.ops.fleet_state import ReplicaReport, SignedState, StateStore
from dispatch_service.routing.live import routing_digest

__all__ = ["GONE_AFTER_S", "fleet_status", "replica_detail"]

# A registered replica unreachable and silent this long has left the fleet (killed, scaled
# in): listed as gone, not waited for.
GONE_AFTER_S: Final = 10.0
_MAX_ANSWER_BYTES: Final = 1 << 20


def replica_detail(health_url: str, timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The ``fleet_state`` field of a launcher's ``/healthz`` (None when it cannot answer)."""
    url = health_url if "://" in health_url else f"http://{health_url}"
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=timeout_s) as response:
            body = response.read(_MAX_ANSWER_BYTES)
    except urllib.error.HTTPError as exc:  # 503 while not ready: the detail is still there
        body = exc.read(_MAX_ANSWER_BYTES)
    except (urllib.error.URLError, OSError):
        return None
    try:
        detail = json.loads(body).get("fleet_state")
    except (ValueError, AttributeError):
        return None
    return detail if isinstance(detail, dict) else {"status": "not_following_a_store"}


def _entry_point_problems(detail: dict[str, Any], routing: str) -> list[str]:
    """Where a replica's entry points read other routing than ``routing`` (the digest of the
    document's; "" for the initial routing: no document)."""
    entry_points = detail.get("entry_points")
    if not isinstance(entry_points, dict) or not entry_points:
        return ["no entry point reports its routing"]
    problems = []
    for model, instances in sorted(entry_points.items()):
        for instance in instances if isinstance(instances, list) else []:
            if not isinstance(instance, dict):
                continue
            if instance.get("error"):
                problems.append(f"{model} pid {instance.get('pid')}: {instance['error']}")
            elif instance.get("routing") != routing:
                routing_in_force = instance.get("routing") or "the initial routing"
                problems.append(
                    f"{model} pid {instance.get('pid')} routes by revision "
                    f"{instance.get('revision')} (routing {routing_in_force})"
                )
    return problems


def fleet_status(
    store: StateStore,
    signed: SignedState | None,
    extra: list[str],
    timeout_s: float = 2.0,
) -> list[dict[str, Any]]:
    """Every replica found (registered or named) and how it stands against ``signed`` (the
    stored revision; None: none stored), its entry points included."""
    revision = None if signed is None else signed.state.revision
    routing = "" if signed is None else routing_digest(signed.state.routing)
    reports: dict[str, ReplicaReport | None] = {r.health_url: r for r in store.replicas()}
    for url in extra:
        reports.setdefault(url if "://" in url else f"http://{url}", None)
    found = []
    for url, report in sorted(reports.items()):
        detail = replica_detail(url, timeout_s)
        entry: dict[str, Any] = {"health_url": url}
        if report is not None:
            entry["replica"] = report.replica
        if detail is None:
            silent = None if report is None else time.time() - report.seen
            gone = silent is not None and silent > GONE_AFTER_S
            entry["state"] = "gone" if gone else "unreachable"
            found.append(entry)
            continue
        served = detail.get("revision")
        problems = _entry_point_problems(detail, routing)
        entry.update(
            revision=served,
            digest=detail.get("digest"),
            status=detail.get("status"),
            refused=detail.get("refused"),
            entry_points=detail.get("entry_points"),
            entry_point_problems=problems,
        )
        if served != revision:
            entry["state"] = "refusing" if detail.get("refused") else "behind"
        else:
            entry["state"] = "entry_points_differ" if problems else "current"
        found.append(entry)
    return found
