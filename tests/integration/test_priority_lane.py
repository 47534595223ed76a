"""The priority lane: `DispatchClient` sends level-1 windows to `dispatch_priority`, whose own
stubs run at the server's CPU priority, above `dispatch_fused`'s, and under the launcher
every other stub runs SCHED_BATCH, the lane's not, after a start, a heal and a restart
(docs/operations.md)."""

from __future__ import annotations

import os
import signal
from collections import Counter
from functools import partial
from pathlib import Path

from launcher_helpers import Launcher
from patience import patience, wait_for

from dispatch_client import DispatchClient
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.ops.server import Ports, TritonServer
from dispatch_service.ops.stubs import instance_count, stub_models, stub_versions
from dispatch_service.ops.verified_load import repository_models
from triton_helpers import metric_series, sim_window

LANE = "dispatch_priority"
FUSED = "dispatch_fused"


def successes(triton: TritonServer, model: str) -> float:
    series = metric_series(triton.metrics_url, "nv_inference_request_success")
    return sum(value for labels, value in series if labels.get("model") == model)


def test_level_1_windows_go_to_the_lane_and_the_others_to_the_entry_point_wiring(
    triton: TritonServer,
) -> None:
    """Which model answers each level (the answers themselves: test_routing_parity)."""
    window = sim_window(11, 6, 40)
    before = {model: successes(triton, model) for model in (LANE, "dispatch_fused")}
    answers = {}
    for level in (1, 2, 3):
        with DispatchClient.grpc(
            triton.grpc_url,
            model_name="dispatch_fused",
            priority=level,
            priority_key=triton.priority_key,
        ) as client:
            answers[level] = client.dispatch(window).orders
    assert successes(triton, LANE) - before[LANE] == 1
    assert successes(triton, "dispatch_fused") - before["dispatch_fused"] == 2
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


def thread_policies(pid: int) -> set[int]:
    """The scheduling policies of ``pid``'s threads, read from /proc (field 41 of each
    thread's stat: 0 SCHED_OTHER, 3 SCHED_BATCH); empty once it has ended."""
    found = set()
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        found.add(int(stat[stat.rfind(")") + 2 :].split()[38]))
    return found


def configured_instances() -> Counter[tuple[str, str]]:
    """(model, version) -> stubs, for every served version of every Python model."""
    wanted: Counter[tuple[str, str]] = Counter()
    for name, entry in repository_models(MODEL_REPOSITORY, "cpu").items():
        if entry.config.get("backend") == "python":
            for version in entry.served:
                wanted[(name, str(version))] = instance_count(entry.config)
    return wanted


def scheduled(triton: int) -> bool:
    """Every thread of the lane's stubs SCHED_OTHER, of every other stub SCHED_BATCH."""
    return all(
        thread_policies(pid) == {os.SCHED_OTHER if model == LANE else os.SCHED_BATCH}
        for pid, model in stub_models(triton).items()
    )


def the_server(launcher: Launcher) -> int | None:
    found = launcher.children("tritonserver")
    return found[0] if len(found) == 1 else None


def test_the_launcher_runs_every_stub_but_the_lanes_sched_batch_after_start_heal_restart(
    tmp_path: Path,
) -> None:
    launcher = Launcher(Ports.free(), tmp_path / "server.log", tmp_path / "keys")
    wanted = configured_instances()
    try:
        assert launcher.read_until("ready:", patience(240)), launcher.lines
        launcher.keep_reading()
        triton = the_server(launcher)
        assert triton is not None
        assert Counter(stub_versions(triton).values()) == wanted
        wait_for(partial(scheduled, triton), "stubs scheduled after the start", 60, 0.25)

        # A stub killed: its model is reloaded, new stubs beside the old ones (2.51 leaves
        # them running until the launcher's restart for leaks).
        before = {pid for pid, m in stub_models(triton).items() if m == FUSED}
        os.kill(min(before), signal.SIGKILL)

        def healed() -> bool:
            new = [p for p, m in stub_models(triton).items() if m == FUSED and p not in before]
            return len(new) >= wanted[(FUSED, "1")] and scheduled(triton)

        wait_for(healed, "stubs scheduled after a heal", 120, 0.25)
        assert any('"stub_died"' in line for line in launcher.lines)

        # Triton killed: restarted on first instances, the others added once it serves.
        os.kill(triton, signal.SIGKILL)

        def restarted() -> bool:
            server = the_server(launcher)
            return (
                server not in (None, triton)
                and Counter(stub_versions(server).values()) == wanted
                and scheduled(server)
            )

        wait_for(restarted, "stubs scheduled after a restart", 240, 0.5)
    finally:
        launcher.stop()
