"""The open-loop harness's rules: schedule validity, recovery, core split, queue timeout,
and the generator's requests on the wire."""

from __future__ import annotations

from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from dispatch_contract import DISPATCH_ENSEMBLE_OUTPUTS
from perf.open_loop import (
    LAG_LIMIT_MS,
    Send,
    lag_verdict,
    normal_latency_ms,
    recovery_s,
    sends_summary,
    wire_request,
)
from perf.overload import grpc_inputs
from perf.overload_bench import Probe, probes_of, queue_timeout_ms
from perf.pinning import cpu_list, descendants, split_cores
from perf.windows import SIZES, simulated_windows


def test_a_generator_within_its_lag_limit_is_valid() -> None:
    verdict = lag_verdict([0.1] * 99 + [4.9])
    assert verdict["valid"] is True
    assert verdict["send_lag_p50_ms"] == pytest.approx(0.1)
    assert verdict["lag_limit_ms"] == LAG_LIMIT_MS


def test_a_generator_behind_its_schedule_marks_the_run_invalid() -> None:
    # 2 % of the sends 40 ms late put the p99 past 5 ms: the generator set the pace
    verdict = lag_verdict([0.2] * 98 + [40.0, 40.0])
    assert verdict["valid"] is False
    assert verdict["send_lag_p99_ms"] > LAG_LIMIT_MS


def test_no_sends_is_not_a_valid_run() -> None:
    assert lag_verdict([])["valid"] is False


def test_send_lag_is_measured_from_the_due_time_and_never_negative() -> None:
    assert Send(due=10.0, sent=10.003, latency_ms=1.0, accepted=True).lag_ms == pytest.approx(3.0)
    assert Send(due=10.0, sent=9.999, latency_ms=1.0, accepted=True).lag_ms == 0.0
    assert Send(due=10.0, sent=10.5, latency_ms=250.0, accepted=True).answered == 10.75


def test_sends_summary_separates_accepted_and_refused() -> None:
    sends = [
        Send(0.0, 0.0, 5.0, True),
        Send(0.1, 0.1, 7.0, True),
        Send(0.2, 0.2, 1.0, False, "queue full"),
        Send(0.3, 0.3, 900.0, False, "deadline"),
    ]
    found = sends_summary(sends, seconds=2.0)
    assert (found["sent"], found["accepted"], found["refused"]) == (4, 2, 2)
    assert found["accepted_per_s"] == 1.0
    assert found["queue_full_refusal_p99_ms"] == 1.0  # the deadline refusal is not in it
    assert found["refusal_reasons"] == {"deadline": 1, "queue full": 1}


def test_recovery_is_the_first_normal_answer_after_the_burst() -> None:
    end = 100.0
    probe = [
        Send(99.9, 99.9, 1.0, False, "queue full"),  # during the burst: not counted
        Send(99.95, 99.95, 3.0, True),  # normal, but sent before the end
        Send(100.05, 100.05, 1.0, False, "queue full"),
        Send(100.10, 100.10, 300.0, True),  # accepted, but slow
        Send(100.45, 100.45, 4.0, True),  # the first normal answer
        Send(100.50, 100.50, 3.0, True),
    ]
    assert recovery_s(probe, end, normal_ms=10.0) == pytest.approx(0.454)


def test_no_normal_answer_after_the_burst_is_no_recovery() -> None:
    probe = [Send(100.1, 100.1, 50.0, True), Send(100.2, 100.2, 1.0, False, "queue full")]
    assert recovery_s(probe, 100.0, normal_ms=10.0) is None


def test_normal_latency_is_twice_the_unloaded_p99_with_a_floor() -> None:
    assert normal_latency_ms(8.0) == 16.0
    assert normal_latency_ms(1.0) == 5.0
    assert normal_latency_ms(None) is None


def test_two_cores_put_the_server_on_core_1_and_the_load_on_core_0() -> None:
    split = split_cores([0, 1])
    assert (split.server, split.load, split.pinned) == ((1,), (0,), True)
    assert split.describe() == "server on cores 1, load on cores 0"


def test_larger_hosts_split_in_halves_and_one_core_is_not_pinned() -> None:
    assert split_cores(range(8)).server == (4, 5, 6, 7)
    assert split_cores(range(8)).load == (0, 1, 2, 3)
    assert split_cores([0, 1, 2]).load == (0,)
    assert split_cores([3]).pinned is False
    assert cpu_list([3, 1]) == "1,3"


def test_descendants_follow_parent_links(tmp_path: Path) -> None:
    def process(pid: int, comm: str, ppid: int) -> None:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} ({comm}) S {ppid} 1 1 0\n")

    process(10, "tritonserver", 1)
    process(11, "triton_python_backend_stub", 10)
    process(12, "stub (a) b", 11)  # a name with spaces and parentheses
    process(20, "other", 1)
    (tmp_path / "self").mkdir()
    assert sorted(descendants(10, tmp_path)) == [10, 11, 12]


def test_queue_timeout_is_read_from_the_level_policy_then_the_default() -> None:
    config = {
        "config": {
            "dynamic_batching": {
                "default_queue_policy": {"default_timeout_microseconds": "1000000"},
                "priority_queue_policy": {"3": {"default_timeout_microseconds": "250000"}},
            }
        }
    }
    assert queue_timeout_ms(config, 3) == 250.0
    assert queue_timeout_ms(config, 2) == 1000.0
    assert queue_timeout_ms({"config": {}}, 2) is None


@pytest.mark.parametrize("level", [0, 1, 3])
def test_a_wire_request_is_what_tritonclient_would_send(level: int) -> None:
    """The generator's pre-serialized request against tritonclient's own builder."""
    window = simulated_windows(SIZES["small"], ())[0]
    outputs = [grpcclient.InferRequestedOutput(s.name) for s in DISPATCH_ENSEMBLE_OUTPUTS]
    reference = _get_inference_request(
        model_name="dispatch_fused", inputs=grpc_inputs(window), model_version="",
        request_id="", outputs=outputs, sequence_id=0, sequence_start=False,
        sequence_end=False, priority=level, timeout=None, parameters=None,
    )  # fmt: skip
    ours = service_pb2.ModelInferRequest.FromString(
        wire_request("dispatch_fused", window, level=level)
    )
    assert ours == reference


def test_level_1_is_probed_on_the_lane_and_on_the_bulk_model_itself() -> None:
    assert probes_of("dispatch_fused", "dispatch_priority") == {
        "probe_level_2": Probe("dispatch_fused", 2),
        "probe_level_1": Probe("dispatch_priority", 0),  # the lane at its default level
        "probe_level_1_same_model": Probe("dispatch_fused", 1),
    }
    assert probes_of("dispatch_fused", None) == {
        "probe_level_2": Probe("dispatch_fused", 2),
        "probe_level_1": Probe("dispatch_fused", 1),
    }
