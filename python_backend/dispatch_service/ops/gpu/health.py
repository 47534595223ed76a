"""Per-GPU health from readings: the consecutive-sample rule, hysteresis, a state machine.

    HEALTHY --over--> SUSPECT --over x trip_samples in a row--> UNHEALTHY
       ^                 |not over (count back to 0)               | clear
       +-----------------+                                         v
       +------------ clear for restore_after_s ------------- RECOVERING --not clear--> UNHEALTHY

A sample is *over* threshold for any reason in `Reason`. An unhealthy GPU is *clear* only
under the stricter recovery thresholds (thresholds minus the margins), with no new ECC error,
a working context and a readable device, so a GPU hovering at the limit does not flap. HEALTHY
and SUSPECT GPUs serve traffic; UNHEALTHY and RECOVERING ones do not.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum

from dispatch_service.ops.gpu.sampling import GpuSample
from dispatch_service.ops.gpu.settings import GpuMonitorSettings

__all__ = [
    "GpuHealth",
    "HealthState",
    "HealthTracker",
    "Reason",
    "describe",
    "over_threshold",
]


class HealthState(IntEnum):
    """Exported as the value of dispatch_gpu_health_state."""

    HEALTHY = 0
    SUSPECT = 1  # over threshold, fewer than trip_samples times in a row
    UNHEALTHY = 2
    RECOVERING = 3  # clear again, waiting restore_after_s before serving

    @property
    def serving(self) -> bool:
        return self in (HealthState.HEALTHY, HealthState.SUSPECT)


class Reason(StrEnum):
    """Why a sample is over threshold (label ``reason`` of the metrics)."""

    THERMAL_THROTTLE = "thermal_throttle"  # utilisation, memory and temperature together
    ECC_ERRORS = "ecc_errors"  # uncorrected ECC count rose since the last sample
    CONTEXT_FAILURE = "context_failure"  # no CUDA context could be created
    NVML_ERROR = "nvml_error"  # NVML could not read the device


def _above(value: float | None, limit: float) -> bool:
    return value is not None and value > limit


def over_threshold(
    sample: GpuSample,
    previous_ecc: int | None,
    settings: GpuMonitorSettings,
    margin_percent: float = 0.0,
    margin_c: float = 0.0,
) -> frozenset[Reason]:
    """The reasons this sample is over threshold (empty: it is not). With margins, the
    stricter test an unhealthy GPU must pass to count as clear."""
    reasons: set[Reason] = set()
    if sample.error is not None:
        reasons.add(Reason.NVML_ERROR)
    if (
        _above(sample.utilization_percent, settings.utilization_percent - margin_percent)
        and _above(sample.memory_percent, settings.memory_percent - margin_percent)
        and _above(sample.temperature_c, settings.temperature_c - margin_c)
    ):
        reasons.add(Reason.THERMAL_THROTTLE)
    if (
        sample.ecc_uncorrected is not None
        and previous_ecc is not None
        and sample.ecc_uncorrected > previous_ecc
    ):
        reasons.add(Reason.ECC_ERRORS)
    if sample.context_ok is False:
        reasons.add(Reason.CONTEXT_FAILURE)
    return frozenset(reasons)


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's state after its latest sample."""

    index: int
    uuid: str = ""
    state: HealthState = HealthState.HEALTHY
    reasons: frozenset[Reason] = frozenset()  # of the latest sample
    trip_reasons: frozenset[Reason] = frozenset()  # what made it unhealthy (until healthy)
    consecutive_over: int = 0  # samples over threshold in a row
    samples_over_total: int = 0
    samples_total: int = 0
    clear_since: float | None = None  # RECOVERING: when the clear run began
    last: GpuSample | None = field(default=None, compare=False)

    @property
    def serving(self) -> bool:
        return self.state.serving


class HealthTracker:
    """Feeds each GPU's samples through the state machine; keeps one `GpuHealth` per GPU."""

    def __init__(self, settings: GpuMonitorSettings) -> None:
        self.settings = settings
        self._gpus: dict[int, GpuHealth] = {}

    @property
    def gpus(self) -> tuple[GpuHealth, ...]:
        return tuple(self._gpus[i] for i in sorted(self._gpus))

    def serving(self) -> frozenset[int]:
        return frozenset(g.index for g in self._gpus.values() if g.serving)

    def update(self, samples: Iterable[GpuSample], now: float) -> tuple[GpuHealth, ...]:
        """Apply one round of samples taken at `now` (seconds, monotonic)."""
        for sample in samples:
            before = self._gpus.get(sample.index, GpuHealth(sample.index, sample.uuid))
            self._gpus[sample.index] = self._step(before, sample, now)
        return self.gpus

    def _step(self, gpu: GpuHealth, sample: GpuSample, now: float) -> GpuHealth:
        s = self.settings
        previous_ecc = gpu.last.ecc_uncorrected if gpu.last is not None else None
        reasons = over_threshold(sample, previous_ecc, s)
        counted = replace(
            gpu,
            uuid=sample.uuid or gpu.uuid,
            reasons=reasons,
            consecutive_over=gpu.consecutive_over + 1 if reasons else 0,
            samples_over_total=gpu.samples_over_total + (1 if reasons else 0),
            samples_total=gpu.samples_total + 1,
            last=sample,
        )
        if gpu.state in (HealthState.HEALTHY, HealthState.SUSPECT):
            if counted.consecutive_over >= s.trip_samples:
                return replace(counted, state=HealthState.UNHEALTHY, trip_reasons=reasons)
            state = HealthState.SUSPECT if reasons else HealthState.HEALTHY
            return replace(counted, state=state)
        strict = over_threshold(
            sample, previous_ecc, s, s.recovery_margin_percent, s.recovery_margin_c
        )
        if strict:  # not clear: (back to) unhealthy, the clear run starts over
            trip = gpu.trip_reasons | reasons
            return replace(
                counted, state=HealthState.UNHEALTHY, clear_since=None, trip_reasons=trip
            )
        since = gpu.clear_since if gpu.state is HealthState.RECOVERING else now
        assert since is not None
        if now - since >= s.restore_after_s:
            return replace(
                counted, state=HealthState.HEALTHY, clear_since=None, trip_reasons=frozenset()
            )
        return replace(counted, state=HealthState.RECOVERING, clear_since=since)


def describe(gpus: Sequence[GpuHealth]) -> list[dict[str, object]]:
    """A JSON-able summary for logs."""
    return [
        {
            "gpu": g.index,
            "uuid": g.uuid,
            "state": g.state.name.lower(),
            "reasons": sorted(r.value for r in g.reasons),
            "trip_reasons": sorted(r.value for r in g.trip_reasons),
            "consecutive_over": g.consecutive_over,
        }
        for g in gpus
    ]
