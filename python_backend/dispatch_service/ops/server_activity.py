"""Triton's request counters and gauges, read from its Prometheus endpoint: what the
supervisor's drain waits on and what tells a server shedding load from a hung one."""

from __future__ import annotations

import re
import urllib.request

from dispatch_service.routing.settings import IN_PROCESS_ROUTING_MODELS

__all__ = [
    "ENTRY_MODELS",
    "GATE_MODELS",
    "drain_activity",
    "triton_activity",
    "triton_successes",
]

_SAMPLE = re.compile(
    r"^(nv_inference_pending_request_count|nv_inference_request_success|"
    r"nv_inference_request_failure)\{([^}]*)\}\s+([0-9.eE+-]+)$",
    re.M,
)

_MODEL_LABEL = re.compile(r'model="([^"]*)"')


def _samples(metrics_url: str, timeout_s: float) -> list[tuple[str, str, float]]:
    """(metric, model, value) of Triton's request counters and gauges."""
    with urllib.request.urlopen(metrics_url, timeout=timeout_s) as response:
        text = response.read().decode(errors="replace")
    samples = []
    for name, labels, value in _SAMPLE.findall(text):
        model = _MODEL_LABEL.search(labels)
        samples.append((name, model.group(1) if model else "", float(value)))
    return samples


def triton_activity(metrics_url: str, timeout_s: float = 2.0) -> tuple[float, float]:
    """(pending requests, completed requests) summed over models from Triton's metrics."""
    pending = done = 0.0
    for name, _, value in _samples(metrics_url, timeout_s):
        if name == "nv_inference_pending_request_count":
            pending += float(value)
        else:
            done += float(value)
    return pending, done


# The models that hold the drain gate (`serving.drain`): Triton counts each request they
# refuse as a success of theirs (the Python backend answered it), so their counters move
# under refused traffic; an ensemble counts the refusal as its failure.
GATE_MODELS = frozenset({"feature_encoder", *IN_PROCESS_ROUTING_MODELS})

# Where windows enter the server: their pending gauges also count the requests the gate
# refuses; the models behind them see accepted work only.
ENTRY_MODELS = GATE_MODELS | {"dispatch", "dispatch_features"}


def drain_activity(metrics_url: str, timeout_s: float = 2.0) -> tuple[float, float]:
    """(pending requests in the models behind the entry points, successful requests of all
    but the gate models): what a drain with the gate closed waits on. Refused requests move
    neither; a window accepted before the gate closed moves both until it is answered."""
    pending = done = 0.0
    for name, model, value in _samples(metrics_url, timeout_s):
        if name == "nv_inference_pending_request_count" and model not in ENTRY_MODELS:
            pending += value
        elif name == "nv_inference_request_success" and model not in GATE_MODELS:
            done += value
    return pending, done


def triton_successes(metrics_url: str, timeout_s: float = 2.0) -> dict[str, float]:
    """Successful requests per model (all versions) from Triton's metrics."""
    successes: dict[str, float] = {}
    for name, model, value in _samples(metrics_url, timeout_s):
        if name == "nv_inference_request_success":
            successes[model] = successes.get(model, 0.0) + value
    return successes
