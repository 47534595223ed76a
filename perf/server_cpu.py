"""What a running tritonserver has spent: CPU seconds of its process tree, whole or split by
who spent them, and the windows a model has answered, so that a level's CPU per window can be
read off two snapshots.

CPU per window is the measure a shared host moves least: throughput swings with other
processes, the CPU a window costs much less (cache and frequency effects only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import psutil

if TYPE_CHECKING:
    from dispatch_service.ops.server import TritonServer

__all__ = ["OTHER_STUBS", "TRITONSERVER", "cpu_by_part", "served", "server_cpu_s"]

TRITONSERVER: Final = "tritonserver"  # the server process itself: front ends, batcher, core
OTHER_STUBS: Final = "other processes"  # children that serve none of the models asked about


def server_cpu_s(server: TritonServer) -> float:
    """CPU seconds (user + system) used so far by the server and its stubs."""
    return sum(cpu_by_part(server, ()).values())


def cpu_by_part(server: TritonServer, models: Sequence[str]) -> dict[str, float]:
    """CPU seconds so far of the server process (`TRITONSERVER`), of each of ``models``'
    backend stubs (a stub's command line names its model instance) and of its other
    children (`OTHER_STUBS`). A model's name must not be a prefix of another's asked for."""
    if server.process is None:
        raise RuntimeError("the server is not running")
    root = psutil.Process(server.process.pid)
    times = root.cpu_times()
    parts = {TRITONSERVER: times.user + times.system, OTHER_STUBS: 0.0}
    parts.update({model: 0.0 for model in models})
    for child in root.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            command = " ".join(child.cmdline())
            times = child.cpu_times()
            owner = next((m for m in models if f"{m}_" in command), OTHER_STUBS)
            parts[owner] += times.user + times.system
    return parts


def served(server: TritonServer, model: str) -> int:
    """Windows ``model`` has answered successfully so far (Triton's statistics)."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        stats = client.get_inference_statistics(model_name=model, as_json=True)
    return sum(int(m["inference_stats"]["success"].get("count", 0)) for m in stats["model_stats"])
