"""The launcher's deep-check windows are not user traffic: the models record no metric for them.

The launcher's probe (`ops.health.probe`) sends each window with the request parameter
``dispatch_probe: true``; Triton forwards request parameters to every step of an ensemble,
so `feature_encoder`, the router, `topk_resolver` and `dispatch_fused` all see it and leave
the window out of the project's metrics (`dispatch_encoder_latency_ms`,
`dispatch_router_orders_total`, ...). Triton's own counters (`nv_inference_*`) count every
request of a model and cannot be told apart: the launcher counts its probes
(``dispatch_launcher_probes_total{entry_point}`` on its `/metrics`) for subtracting them.
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["PROBE_PARAMETER", "is_probe"]

PROBE_PARAMETER: Final = "dispatch_probe"


def is_probe(request: Any) -> bool:
    """Whether the request carries the probe mark (a request that cannot say: no)."""
    try:
        text = request.parameters()
    except Exception:
        return False
    if not isinstance(text, str) or PROBE_PARAMETER not in text:
        return False  # the common case: no JSON decoded
    try:
        value = json.loads(text).get(PROBE_PARAMETER)
    except (ValueError, AttributeError):
        return False
    return value is True
