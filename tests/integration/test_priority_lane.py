"""The priority lane: `DispatchClient` sends level-1 windows to `dispatch_priority`, whose own
stubs run at the server's CPU priority, above `dispatch_fused`'s (docs/operations.md)."""

from __future__ import annotations

import os

from dispatch_client import DispatchClient
from dispatch_service.ops.server import TritonServer
from dispatch_service.ops.stubs import stub_models
from triton_helpers import model_count, settled_count, sim_window

LANE = "dispatch_priority"
FUSED = "dispatch_fused"


SUCCESS = "nv_inference_request_success"


def test_level_1_windows_go_to_the_lane_and_the_others_to_the_entry_point_wiring(
    triton: TritonServer,
) -> None:
    """Which model answers each level (the answers themselves: test_routing_parity)."""
    window = sim_window(11, 6, 40)
    before = {model: model_count(triton.metrics_url, SUCCESS, model) for model in (LANE, FUSED)}
    answers = {}
    for level in (1, 2, 3):
        with DispatchClient.grpc(
            triton.grpc_url,
            model_name="dispatch_fused",
            priority=level,
            priority_key=triton.priority_key,
        ) as client:
            answers[level] = client.dispatch(window).orders
    for model, answered in ((LANE, 1), (FUSED, 2)):
        after = settled_count(triton.metrics_url, SUCCESS, model, at_least=before[model] + answered)
        assert after - before[model] == answered, model
    assert answers[1] == answers[2] == answers[3]


def test_the_lanes_stubs_run_at_the_servers_priority_and_dispatch_fused_s_below(
    triton: TritonServer,
) -> None:
    assert triton.process is not None
    server_nice = os.getpriority(os.PRIO_PROCESS, triton.process.pid)
    models = stub_models(triton.process.pid)
    nice = {
        model: sorted(
            os.getpriority(os.PRIO_PROCESS, pid) for pid, m in models.items() if m == model
        )
        for model in (LANE, "dispatch_fused")
    }
    assert nice[LANE] == [server_nice] * 2
    assert nice["dispatch_fused"] == [max(server_nice, 10)] * 4
