"""At low load one warm instance of a model answers every window.

Each multi-instance model names one instance with `rate_limiter { priority: 1 }` and the
others with a far larger priority, and the launcher runs Triton with
``--rate-limit=execution_count``: a free instance with the fewest executions x priority
takes the next batch. Sequential windows, which never find the warm instance busy, must all
be answered by it. Without the preference Triton hands them to the instances in turn, each
one cold after waiting for the others.

Which instance answered is read from the project's metrics: every stub labels its series
with its own process id (`serving.triton_metrics`). Counters count every window; a
histogram's ``_count`` keeps at most a few values per flush of a stub's metrics thread
(`core.metrics.BackgroundMetrics`), so windows are sent one per flush interval.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import pytest
import tritonclient.grpc as grpcclient
from patience import wait_for

from dispatch_service.core.metrics import ENCODER_LATENCY, FLUSH_INTERVAL_S, RESOLVER_LATENCY
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.ops.server import TritonServer
from dispatch_service.ops.stubs import instance_count
from dispatch_service.ops.verified_load import read_config
from dispatch_service.routing.metrics import ROUTED_ORDERS
from dispatch_service.routing.settings import FUSED_MODEL_NAME
from triton_helpers import infer_grpc, metric_series, sim_window

SEQUENTIAL = 12
PACE_S = 0.06  # longer than a metrics flush interval (50 ms): one window per flush


def answered_by_stub(server: TritonServer, family: str, model: str) -> Counter[str]:
    """Windows counted by each stub (process id) of ``model`` in the series ``family``."""
    counts: Counter[str] = Counter()
    for found, value in metric_series(server.metrics_url, family):
        if found.get("model") == model:
            counts[found["pid"]] += int(value)
    return counts


def settled(read: Callable[[], Counter[str]]) -> Counter[str]:
    """The counts once two reads a few flush intervals apart agree (bounded)."""
    last = read()
    for _ in range(50):
        time.sleep(4 * FLUSH_INTERVAL_S)
        now = read()
        if now == last:
            return now
        last = now
    raise AssertionError(f"the counts never settled: {dict(last)}")


@pytest.mark.parametrize(
    ("entry", "model", "family"),
    [
        (FUSED_MODEL_NAME, FUSED_MODEL_NAME, ROUTED_ORDERS.name),  # one-order windows
        ("dispatch", "dispatch_router", ROUTED_ORDERS.name),
        ("dispatch", "feature_encoder", f"{ENCODER_LATENCY.name}_count"),
        ("dispatch", "topk_resolver", f"{RESOLVER_LATENCY.name}_count"),
    ],
)
def test_sequential_windows_are_all_answered_by_one_warm_instance(
    triton: TritonServer, grpc_client: grpcclient.InferenceServerClient, entry: str, model: str,
    family: str,
) -> None:  # fmt: skip
    instances = instance_count(read_config(MODEL_REPOSITORY / model))
    assert instances > 1, f"{model} runs one instance: nothing to prefer"
    window = sim_window(seed=5, orders=1, riders=20)
    # Instances that never ran score 0 executions whatever their priority: as many windows
    # as there are instances give each its first execution before the count starts.
    start = answered_by_stub(triton, family, model)
    for _ in range(instances):
        infer_grpc(grpc_client, window, model=entry)
        time.sleep(PACE_S)
    wait_for(
        lambda: (answered_by_stub(triton, family, model) - start).total() >= instances,
        f"{model}'s metrics count the warm-up windows",
        within_s=10,
    )
    # The stubs record their metrics a flush interval late: the count starts once every
    # window sent so far (this test's and earlier tests') is in it.
    before = settled(lambda: answered_by_stub(triton, family, model))
    for _ in range(SEQUENTIAL):
        infer_grpc(grpc_client, window, model=entry)
        time.sleep(PACE_S)  # each window finds every instance idle
    wait_for(
        lambda: (answered_by_stub(triton, family, model) - before).total() >= SEQUENTIAL,
        f"{model}'s metrics count the {SEQUENTIAL} windows",
        within_s=10,
    )
    answered = settled(lambda: answered_by_stub(triton, family, model)) - before
    assert answered.total() == SEQUENTIAL
    assert len(answered) == 1, f"{model}: windows answered by stubs {dict(answered)}"
