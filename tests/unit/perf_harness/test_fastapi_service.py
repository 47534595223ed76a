"""The FastAPI baseline's arrays endpoint: every resolver output, or a 400 naming the tensor."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import numpy as np
import pytest

from dispatch_contract import RESOLVER_OUTPUTS
from perf.baselines import fastapi_service
from perf.bodies import decode_arrays, encode_arrays
from perf.windows import SIZES, simulated_windows


@pytest.fixture(scope="module")
def loaded() -> Iterator[None]:
    """The app's lifespan: the pipeline loaded from the repository, as uvicorn would."""
    context = fastapi_service.lifespan(fastapi_service.app)
    asyncio.run(context.__aenter__())
    try:
        yield
    finally:
        asyncio.run(context.__aexit__(None, None, None))


def test_a_window_is_answered_with_the_resolver_outputs(loaded: None) -> None:
    window = simulated_windows(SIZES["small"])[0]
    body, status = fastapi_service.arrays_answer(json.dumps(encode_arrays(window)).encode())
    assert status == 200, body
    answer = decode_arrays(body)
    assert sorted(answer) == sorted(spec.name for spec in RESOLVER_OUTPUTS)
    assert answer["ASSIGNED_RIDER_INDEX"].shape == window["ORDER_IDS"].shape
    riders = window["RIDER_IDS"].shape[0]
    assert np.all((answer["TOPK_RIDER_INDEX"] >= -1) & (answer["TOPK_RIDER_INDEX"] < riders))


def test_a_bad_window_is_a_400_that_names_the_tensor(loaded: None) -> None:
    window = dict(simulated_windows(SIZES["small"])[0])
    del window["RIDER_FIELDS"]
    body, status = fastapi_service.arrays_answer(json.dumps(encode_arrays(window)).encode())
    assert status == 400
    assert "RIDER_FIELDS" in body["error"]
    body, status = fastapi_service.arrays_answer(b"{not json")
    assert status == 400
