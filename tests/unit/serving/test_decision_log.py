"""Decision records from the Triton adapters (`serving.decision_log`), with the stand-in
pb_utils and a real SQLite store: the resolver records what it answered, under the
request's id, and never the launcher's probes nor windows without an id; a window whose
records cannot be built is counted, never raised into the request."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatch_contract import batched
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.outcomes.records import DecisionId
from dispatch_service.outcomes.sql_store import open_store
from dispatch_service.outcomes.store import OUTCOME_STORE_ENV
from dispatch_service.outcomes.writer import DecisionWriter, WriterCounts
from dispatch_service.pipeline.steps import DispatchModelStep, FeatureEncoderStep
from dispatch_service.serving.decision_log import decision_writer, log_decision
from dispatch_service.serving.probe import PROBE_PARAMETER
from dispatch_service.serving.step_adapters import TritonResolverAdapter
from pb_stand_in import FakePbUtils, FakeRequest

COMMITTED_MODEL = model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(1)


def resolver(tmp_path: Path) -> TritonResolverAdapter:
    config = {"name": "topk_resolver", "parameters": {}}
    args = {
        "model_config": json.dumps(config),
        "model_name": "topk_resolver",
        "model_repository": str(tmp_path),
        "model_version": "1",
        "model_instance_name": "topk_resolver_0_0",
    }
    return TritonResolverAdapter.from_triton(FakePbUtils(), args)


def resolver_inputs(seed: int) -> dict[str, Any]:
    """What `dispatch` hands its resolver for one simulated window (no stacking inputs)."""
    window = dict(window_to_wire(generate_window(np.random.default_rng(seed), 8, 6)))
    encoded = FeatureEncoderStep().run(window)
    scored = DispatchModelStep(COMMITTED_MODEL).run(encoded)
    orders = len(window["ORDER_IDS"])
    return {
        **{name: window[name] for name in ("ORDER_IDS", "ORDER_TEXT", "RIDER_IDS", "RIDER_FIELDS")},
        "WINDOW_FIELDS": window["WINDOW_FIELDS"],
        "ORDER_FIELDS": window["ORDER_FIELDS"],
        "CANDIDATE_RIDER_INDEX": encoded["CANDIDATE_RIDER_INDEX"],
        "WINDOW_CITY": encoded["WINDOW_CITY"],
        **scored,
        "ORDER_MODEL_VERSION": np.ones(orders, dtype=np.int32),
        "ORDER_FALLBACK_LEVEL": np.zeros(orders, dtype=np.int32),
    }


def test_the_resolver_records_each_answered_window_once(tmp_path: Path) -> None:
    adapter = resolver(tmp_path)
    path = tmp_path / "o.sqlite3"
    adapter.decisions = DecisionWriter(lambda: open_store(path))
    inputs = resolver_inputs(3)
    requests = [
        FakeRequest(batched(inputs), request_id="win-1"),
        FakeRequest(batched(inputs), request_id="probe-1", parameters={PROBE_PARAMETER: True}),
        FakeRequest(batched(inputs), request_id=""),  # no id: its decisions cannot be named
        FakeRequest(batched({**inputs, "WINDOW_FIELDS": None}), request_id="win-2"),
    ]
    responses = adapter.execute(requests)
    assert not any(r.has_error() for r in responses)
    assert adapter.decisions.flush()
    answer = {name: value[0] for name, value in responses[0].outputs().items()}
    adapter.finalize()
    store = open_store(path)
    orders = [o.decode() for o in inputs["ORDER_IDS"]]
    found = store.decisions(
        [DecisionId(rid, o) for rid in ("win-1", "probe-1", "win-2") for o in orders]
    )
    assert set(found) == {DecisionId("win-1", o) for o in orders}
    riders = [r.decode() for r in inputs["RIDER_IDS"]]
    for order, index in zip(orders, answer["ASSIGNED_RIDER_INDEX"].tolist(), strict=True):
        assert found[DecisionId("win-1", order)].assigned_rider == (
            riders[index] if index >= 0 else None
        )
        assert found[DecisionId("win-1", order)].decided_at == float(inputs["WINDOW_FIELDS"][0])
    store.close()


def test_no_store_named_means_no_writer() -> None:
    assert decision_writer(FakePbUtils(), "m", lambda _: None, environ={}) is None
    log_decision(None, FakeRequest({}, request_id="x"), "m", lambda _: None)  # nothing happens


def test_the_writer_comes_from_the_launchers_environment(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    recorded: list[Any] = []
    writer = decision_writer(
        FakePbUtils(), "m", recorded.extend, environ={OUTCOME_STORE_ENV: str(path)}
    )
    assert writer is not None
    writer.close()


def test_a_window_that_cannot_be_built_is_counted_not_raised(tmp_path: Path) -> None:
    writer = DecisionWriter(lambda: open_store(tmp_path / "o.sqlite3"))

    def broken(request_id: str) -> Any:
        raise KeyError("TOPK_RIDER_INDEX")

    log_decision(writer, FakeRequest({}, request_id="x"), "m", broken)
    assert writer.flush()
    writer.close()
    assert writer.counts == WriterCounts(dropped_unreadable=1)


@pytest.mark.parametrize(
    "missing", ["ORDER_IDS", "ORDER_FIELDS", "ORDER_TEXT", "ORDER_MODEL_VERSION"]
)
def test_the_resolver_records_nothing_without_what_a_record_needs(
    tmp_path: Path, missing: str
) -> None:
    adapter = resolver(tmp_path)
    path = tmp_path / "o.sqlite3"
    adapter.decisions = DecisionWriter(lambda: open_store(path))
    inputs = {**resolver_inputs(4), missing: None}
    (response,) = adapter.execute([FakeRequest(batched(inputs), request_id="w")])
    assert not response.has_error()  # the answer itself needs none of them
    assert adapter.decisions.flush()
    counts = adapter.decisions.counts
    adapter.finalize()
    assert counts.written == 0 and counts.dropped_unreadable == 0
