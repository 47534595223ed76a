"""dispatch_fused runs the windows of one execute as a batch: the same answers, byte for
byte, as each window sent alone; a bad window gets its own error; one session call per
routed version for the whole batch."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from dispatch_contract import CoordSystem
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.model_config import config_parameters
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import FUSED_MODEL, model_layout
from dispatch_service.domain import geo
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline.fused import FusedDispatch, FusedResult
from dispatch_service.pipeline.onnx_runner import OnnxScorer
from dispatch_service.routing.engine import RouterSettings
from dispatch_service.routing.settings import FusedSettings

Tensors = dict[str, NDArray[Any]]
SHIPPED = FusedSettings.from_parameters(
    config_parameters(model_layout(MODEL_REPOSITORY, FUSED_MODEL).config)
)


@pytest.fixture(scope="module")
def fused() -> FusedDispatch:
    return FusedDispatch.from_repository(MODEL_REPOSITORY, SHIPPED)


def window(seed: int, orders: int, riders: int, coord: CoordSystem, tag: str | None) -> Tensors:
    tensors = dict(window_to_wire(generate_window(np.random.default_rng(seed), orders, riders)))
    if coord is not CoordSystem.WGS84:  # the same places, stated in another datum
        fields = {
            name: np.array(tensors[name], copy=True) for name in ("ORDER_FIELDS", "RIDER_FIELDS")
        }
        for name, firsts in (("ORDER_FIELDS", (0, 2)), ("RIDER_FIELDS", (0,))):
            for first in firsts:
                pair = slice(first, first + 2)
                fields[name][:, pair] = geo.from_wgs84(tensors[name][:, pair], coord)
        tensors.update(fields)
        tensors["WINDOW_FIELDS"] = np.array([tensors["WINDOW_FIELDS"][0], float(coord)])
    if tag is not None:
        tensors["MODEL_VERSION_TAG"] = np.array([tag.encode()], dtype=object)
    return tensors


MIXED = [
    window(1, 1, 20, CoordSystem.WGS84, None),
    window(2, 64, 200, CoordSystem.GCJ02, "canary"),
    window(3, 7, 15, CoordSystem.BD09, "stable"),
    window(4, 3, 2, CoordSystem.WGS84, "2"),  # fewer riders than K
    window(5, 30, 90, CoordSystem.GCJ02, None),
    window(6, 1, 20, CoordSystem.WGS84, "1"),
]


def assert_identical(got: FusedResult, alone: FusedResult) -> None:
    assert got.outputs.keys() == alone.outputs.keys()
    for name, value in alone.outputs.items():
        assert got.outputs[name].dtype == value.dtype, name
        assert got.outputs[name].shape == value.shape, name
        if value.dtype == object:  # WINDOW_CITY: the bytes, not the object pointers
            assert got.outputs[name].tolist() == value.tolist(), name
        else:
            assert got.outputs[name].tobytes() == value.tobytes(), name


@pytest.mark.parametrize(
    "routing",
    [
        RouterSettings(stable_version=1, canary_version=2, canary_percent=0),
        RouterSettings(stable_version=1, canary_version=2, canary_percent=50),
    ],
    ids=["stable-only", "half-canary"],
)
def test_a_batch_answers_byte_for_byte_like_each_window_alone(
    fused: FusedDispatch, routing: RouterSettings
) -> None:
    dispatch = dataclasses.replace(fused, settings=FusedSettings(routing))
    batch = dispatch.run_batch(MIXED)
    for tensors, got in zip(MIXED, batch, strict=True):
        assert isinstance(got, FusedResult), got
        assert_identical(got, dispatch.run(tensors))


def test_one_session_call_per_routed_version_for_the_whole_batch(fused: FusedDispatch) -> None:
    calls: list[tuple[int, int]] = []

    class Counting(OnnxScorer):
        def __init__(self, inner: OnnxScorer, version: int) -> None:
            self.__dict__.update(inner.__dict__)
            self.version = version

        def infer(self, pair_features: NDArray[np.float32]) -> NDArray[np.float32]:
            calls.append((self.version, len(pair_features)))
            return super().infer(pair_features)

    scorers = {v: Counting(s, v) for v, s in fused.scorers.items()}
    dispatch = dataclasses.replace(fused, scorers=scorers)
    plain = [w for w in MIXED if "MODEL_VERSION_TAG" not in w]  # all routed to stable (1)
    results = dispatch.run_batch(plain)
    assert all(isinstance(r, FusedResult) for r in results)
    total = sum(r.encoded["PAIR_FEATURES"].shape[0] for r in results if isinstance(r, FusedResult))
    # One call scores every window's pairs; then each window whose riders can take several
    # new orders re-scores its stacked pairs once (the stack-aware resolution, per window).
    assert calls[0] == (1, total)
    assert [version for version, _ in calls[1:]] == [1] * (len(calls) - 1)
    assert len(calls) - 1 <= len(plain)


def test_a_bad_window_gets_its_own_error_and_the_others_their_answers(
    fused: FusedDispatch,
) -> None:
    bad = dict(MIXED[2])
    bad["RIDER_FIELDS"] = np.array(bad["RIDER_FIELDS"], copy=True)
    bad["RIDER_FIELDS"][0, 3] = 1.5  # capacity must be whole
    tag = dict(MIXED[0], MODEL_VERSION_TAG=np.array([b"blue"], dtype=object))
    # Found at resolution, where the windows where nothing stacks are resolved together.
    weights = dict(MIXED[5], OBJECTIVE_WEIGHTS=np.array([-1.0, 0.5, 0.5], dtype=np.float32))
    batch = [MIXED[0], bad, MIXED[1], tag, MIXED[4], weights, MIXED[5]]
    results = fused.run_batch(batch)
    assert isinstance(results[1], DispatchInputError)
    assert results[1].tensor == "RIDER_FIELDS[capacity]"
    assert isinstance(results[3], DispatchInputError)
    assert results[3].tensor == "MODEL_VERSION_TAG"
    assert isinstance(results[5], DispatchInputError)
    assert results[5].tensor == "OBJECTIVE_WEIGHTS"
    for i in (0, 2, 4, 6):
        result = results[i]
        assert isinstance(result, FusedResult)
        assert_identical(result, fused.run(batch[i]))
    assert fused.run_batch([]) == []


def test_a_few_one_order_windows_are_run_each_alone(
    fused: FusedDispatch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below five one-order windows the shared steps cost more than they save: each window
    is `run` alone, a bad one failing alone; five or more, or any larger window, share."""
    shared: list[int] = []
    step = type(fused.encoder)
    encode_batch = step.encode_batch

    def counting(self: Any, batch: Any) -> Any:
        shared.append(len(batch))
        return encode_batch(self, batch)

    monkeypatch.setattr(step, "encode_batch", counting)
    one_order = [window(seed, 1, 12, CoordSystem.WGS84, None) for seed in range(10, 16)]
    bad = dict(one_order[1], RIDER_FIELDS=np.array(one_order[1]["RIDER_FIELDS"], copy=True))
    bad["RIDER_FIELDS"][0, 3] = 1.5  # capacity must be whole
    few = [one_order[0], bad, one_order[2], one_order[3]]
    results = fused.run_batch(few)
    assert shared == []
    assert isinstance(results[1], DispatchInputError)
    assert results[1].tensor == "RIDER_FIELDS[capacity]"
    for i in (0, 2, 3):
        got = results[i]
        assert isinstance(got, FusedResult)
        assert_identical(got, fused.run(few[i]))
    assert all(isinstance(r, FusedResult) for r in fused.run_batch(one_order[:5]))
    assert all(isinstance(r, FusedResult) for r in fused.run_batch([MIXED[1], one_order[0]]))
    assert shared == [5, 2]
