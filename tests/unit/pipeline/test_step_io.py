"""Behaviour of dispatch_service.pipeline.step_io: what every step shares."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.pipeline.step_io import required


def test_a_required_input_is_returned_or_refused_by_name() -> None:
    value = np.arange(3)
    assert required({"X": value}, "X") is value
    with pytest.raises(DispatchInputError) as caught:
        required({"X": None}, "X")
    assert (caught.value.tensor, caught.value.code) == ("X", "missing")
