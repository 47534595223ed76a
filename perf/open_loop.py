"""An open-loop load generator that proves it kept its schedule, and a probe outside it.

Open loop: request i is due at `start + i / rate`, whatever the server answered before; a
refused or slow request does not slow the arrivals (a closed loop would). Each send records
its lag behind the time it was due; when the lag's p99 exceeds `LAG_LIMIT_MS` the generator,
not the server, set the pace, and the run is INVALID (`lag_verdict`). Latency is timed from
the send.

The probe (`probe_process`) is one caller in its own process at a low fixed rate
(`PROBE_RATE_PER_S`), one request at a time: what a well-behaved client sees while the
generator overloads the server. It times refusals (how long a queue-full or UNAVAILABLE
answer takes) and accepted answers, and keeps running after the burst, so `recovery_s` can
read how long after the burst's last send the first answer in normal time came back.

Clocks: every timestamp is `time.monotonic()` (CLOCK_MONOTONIC, the same in every process
on the host), so the probe's and the generator's timelines compare directly.

The generator sends each window's `ModelInferRequest` serialized once before the burst
(`wire_request`) over a raw gRPC method, with the garbage collector paused: a send costs no
protobuf work in Python, so one core keeps the schedule at rates a tritonclient call per
send could not (its send lag is still measured and judged).
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
from numpy.typing import NDArray
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, np_to_triton_dtype, serialize_byte_tensor

from dispatch_contract import DISPATCH_ENSEMBLE_OUTPUTS, PRIORITY_LANE_MODEL_NAME, batched
from dispatch_contract.keys import PRIORITY_KEY_ENV, PRIORITY_KEY_HEADER
from perf.overload import grpc_inputs, refusal_reason
from perf.windows import SIZES, simulated_windows

__all__ = [
    "LAG_LIMIT_MS",
    "NORMAL_FACTOR",
    "NORMAL_FLOOR_MS",
    "PROBE_RATE_PER_S",
    "Send",
    "lag_verdict",
    "normal_latency_ms",
    "open_loop",
    "percentile",
    "probe_process",
    "recovery_s",
    "sends_summary",
    "wire_request",
]

# KServe's inference method on Triton's gRPC port, called with bytes in and bytes out.
MODEL_INFER_METHOD: Final = "/inference.GRPCInferenceService/ModelInfer"
LAG_LIMIT_MS: Final = 5.0  # send-lag p99 above this: the generator fell behind, run INVALID
PROBE_RATE_PER_S: Final = 20.0
# "Normal" latency for recovery: at most this many times the probe's unloaded p99, and never
# below NORMAL_FLOOR_MS (a 2 ms unloaded p99 would otherwise call 4.1 ms abnormal).
NORMAL_FACTOR: Final = 2.0
NORMAL_FLOOR_MS: Final = 5.0


@dataclass(frozen=True)
class Send:
    """One request: when it was due and sent (monotonic s), how long its answer took."""

    due: float
    sent: float
    latency_ms: float
    accepted: bool
    reason: str = ""  # a refusal's: "queue full", "deadline" or "other"

    @property
    def lag_ms(self) -> float:
        return max(0.0, (self.sent - self.due) * 1000.0)

    @property
    def answered(self) -> float:
        return self.sent + self.latency_ms / 1000.0


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def lag_verdict(lags_ms: Sequence[float], limit_ms: float = LAG_LIMIT_MS) -> dict[str, Any]:
    """Send-lag p50/p99 and whether the generator kept its schedule (p99 <= `limit_ms`)."""
    p99 = percentile(lags_ms, 99)
    return {
        "send_lag_p50_ms": percentile(lags_ms, 50),
        "send_lag_p99_ms": p99,
        "lag_limit_ms": limit_ms,
        "valid": p99 is not None and p99 <= limit_ms,
    }


def sends_summary(sends: Sequence[Send], seconds: float) -> dict[str, Any]:
    """Counts and latencies of a list of sends (accepted, refused, refused as queue full)."""
    accepted = [s.latency_ms for s in sends if s.accepted]
    refused = [s for s in sends if not s.accepted]
    reasons: dict[str, int] = {}
    for send in refused:
        reasons[send.reason or "other"] = reasons.get(send.reason or "other", 0) + 1
    full = [s.latency_ms for s in refused if s.reason == "queue full"]
    return {
        "sent": len(sends),
        "accepted": len(accepted),
        "refused": len(refused),
        "accepted_per_s": len(accepted) / seconds if seconds > 0 else None,
        "accepted_p50_ms": percentile(accepted, 50),
        "accepted_p99_ms": percentile(accepted, 99),
        "refusal_p50_ms": percentile([s.latency_ms for s in refused], 50),
        "refusal_p99_ms": percentile([s.latency_ms for s in refused], 99),
        "queue_full_refusal_p99_ms": percentile(full, 99),
        "refusal_reasons": dict(sorted(reasons.items())),
    }


def normal_latency_ms(unloaded_p99_ms: float | None) -> float | None:
    """The latency the probe counts as normal again after a burst."""
    if unloaded_p99_ms is None:
        return None
    return max(NORMAL_FACTOR * unloaded_p99_ms, NORMAL_FLOOR_MS)


def recovery_s(probe: Sequence[Send], burst_end: float, normal_ms: float) -> float | None:
    """Seconds from the burst's last send to the first answer the probe got, for a request
    sent at or after that moment, that was accepted in at most `normal_ms`; None when the
    probe never saw one (not recovered while it watched)."""
    after = sorted((s for s in probe if s.sent >= burst_end), key=lambda s: s.sent)
    for send in after:
        if send.accepted and send.latency_ms <= normal_ms:
            return send.answered - burst_end
    return None


def _outputs() -> list[grpcclient.InferRequestedOutput]:
    return [grpcclient.InferRequestedOutput(spec.name) for spec in DISPATCH_ENSEMBLE_OUTPUTS]


def _refused(exc: InferenceServerException) -> str:
    return refusal_reason(str(exc))


def wire_request(model: str, window: Mapping[str, NDArray[Any]], *, level: int) -> bytes:
    """One window's serialized `ModelInferRequest` (batched, every output asked for, at
    priority `level`; 0: the model's default)."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, array in batched(window).items():
        request.inputs.add(
            name=name, datatype=np_to_triton_dtype(array.dtype), shape=list(array.shape)
        )
        if array.dtype == np.object_:
            content = serialize_byte_tensor(array)  # one bytes object, in an object array
            request.raw_input_contents.append(content.item() if content.size else b"")
        else:
            request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    for spec in DISPATCH_ENSEMBLE_OUTPUTS:
        request.outputs.add(name=spec.name)
    if level:
        request.parameters["priority"].uint64_param = level
    return bytes(request.SerializeToString())


async def _open_loop(
    url: str, model: str, rate: float, seconds: float, *, level: int, start: float
) -> tuple[list[Send], float]:
    payloads = [wire_request(model, w, level=level) for w in simulated_windows(SIZES["small"], ())]
    channel = grpc.aio.insecure_channel(url)
    infer = channel.unary_unary(MODEL_INFER_METHOD)  # no (de)serializers: bytes both ways
    sends: list[Send] = []
    pending: set[asyncio.Task[None]] = set()

    async def one(index: int, due: float) -> None:
        sent, reason = time.monotonic(), ""
        try:
            await infer(payloads[index % len(payloads)], timeout=60)
        except grpc.aio.AioRpcError as exc:
            reason = refusal_reason(exc.details() or "")
        latency = (time.monotonic() - sent) * 1000.0
        sends.append(Send(due, sent, latency, not reason, reason))

    gc.disable()
    try:
        await infer(payloads[0], timeout=60)  # connect; not measured
        last = start
        for index in range(max(1, round(rate * seconds))):
            due = start + index / rate
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            task = asyncio.create_task(one(index, due))
            pending.add(task)
            task.add_done_callback(pending.discard)
            last = due
        await asyncio.sleep(0)  # let the last task send before the burst is called over
        burst_end = max(last, time.monotonic())
        if pending:
            await asyncio.gather(*pending)
    finally:
        gc.enable()
        await channel.close()
    return sends, burst_end


def open_loop(
    url: str, model: str, rate: float, seconds: float, *, level: int, start: float
) -> tuple[list[Send], float]:
    """Send `rate` requests/s for `seconds` from monotonic time `start` at priority `level`
    (0: the model's default); every send, and the monotonic time of the burst's end."""
    if rate <= 0 or seconds <= 0:
        raise ValueError("rate and seconds must be positive")
    return asyncio.run(_open_loop(url, model, rate, seconds, level=level, start=start))


def probe_process(
    url: str, model: str, level: int, commands: Any, answers: Any, *, rate: float = PROBE_RATE_PER_S
) -> None:
    """Target of the probe's own process: says "ready", waits for (start, stop) in monotonic
    time, then sends one window at a time on a `rate`/s schedule (a slow answer delays the
    next send; missed slots are skipped, not caught up) and puts back (level, its `Send`s)."""
    client = grpcclient.InferenceServerClient(url)
    inputs = grpc_inputs(simulated_windows(SIZES["small"], ())[0])
    outputs = _outputs()
    # The priority lane serves only windows sent with the server's priority key.
    key = os.environ.get(PRIORITY_KEY_ENV, "")
    headers = {PRIORITY_KEY_HEADER: key} if key and model == PRIORITY_LANE_MODEL_NAME else None
    client.infer(model, inputs, outputs=outputs, headers=headers)  # connect; not measured
    answers.put("ready")
    start, stop = commands.get(timeout=120)
    sends: list[Send] = []
    try:
        due = start
        while due < stop:
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            sent, reason = time.monotonic(), ""
            try:
                client.infer(
                    model,
                    inputs,
                    outputs=outputs,
                    priority=level,
                    client_timeout=60,
                    headers=headers,
                )
            except InferenceServerException as exc:
                reason = _refused(exc)
            latency = (time.monotonic() - sent) * 1000.0
            sends.append(Send(due, sent, latency, not reason, reason))
            due += 1.0 / rate
            while due < time.monotonic():  # skip the slots a slow answer used up
                due += 1.0 / rate
    finally:
        client.close()
        answers.put((level, sends))
