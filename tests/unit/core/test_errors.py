"""Behaviour of dispatch_service.core.errors: messages unchanged, a stable rule code for metrics.

Every raise site names its rule code itself; none is recovered from the English message.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from dispatch_service.core.errors import RULE_CODES, DispatchInputError
from dispatch_service.domain.resolver import resolve
from dispatch_service.domain.window import window_from_tensors, window_to_tensors
from dispatch_service.offline.simulator import generate_window

LIBRARY = Path(__file__).resolve().parents[3] / "python_backend" / "dispatch_service"


def test_message_names_tensor_and_rule_and_keeps_the_code() -> None:
    error = DispatchInputError(
        "ORDER_PICKUP", "latitude must be within [-90.0, 90.0] (row 3)", "range"
    )
    assert str(error) == "ORDER_PICKUP: latitude must be within [-90.0, 90.0] (row 3)"
    assert (error.tensor, error.code) == ("ORDER_PICKUP", "range")
    assert isinstance(error, ValueError)


def test_the_code_is_the_raise_sites_and_must_be_known() -> None:
    error = DispatchInputError("X", "is required but missing", code="shape")
    assert error.code == "shape"
    assert str(error) == "X: is required but missing"
    with pytest.raises(ValueError, match="unknown rule code 'bogus'"):
        DispatchInputError("X", "whatever", code="bogus")
    with pytest.raises(TypeError):
        DispatchInputError("X", "whatever")  # type: ignore[call-arg]


def _raise_sites() -> list[tuple[str, ast.Call]]:
    sites = []
    for path in sorted(LIBRARY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "DispatchInputError"
            ):
                sites.append((f"{path.name}:{node.lineno}", node))
    return sites


def _code_of(call: ast.Call) -> object:
    node = call.args[2] if len(call.args) >= 3 else None
    for keyword in call.keywords:
        if keyword.arg == "code":
            node = keyword.value
    return node.value if isinstance(node, ast.Constant) else None


def test_every_library_raise_site_names_a_known_code_literally() -> None:
    sites = _raise_sites()
    assert len(sites) > 50  # the sweep found the library's raise sites
    bad = [where for where, call in sites if _code_of(call) not in RULE_CODES]
    assert not bad, f"pass one of RULE_CODES as a literal code at: {bad}"
    assert "invalid" not in {_code_of(call) for _, call in sites}


def test_codes_of_real_validation_failures() -> None:
    tensors = dict(window_to_tensors(generate_window(np.random.default_rng(0), 3, 5)))
    pickup = np.array(tensors["ORDER_PICKUP"], copy=True)
    pickup[1, 0] = np.nan
    ids = np.array([b"a", b"b", b"a"], dtype=object)
    cases = {
        "not_finite": {"ORDER_PICKUP": pickup},
        "unique": {"ORDER_IDS": ids},
        "dtype": {"RIDER_LOAD": tensors["RIDER_LOAD"].astype(np.int64)},
        "unknown_value": {"COORD_SYSTEM": np.array([b"ED50"], dtype=object)},
    }
    for code, change in cases.items():
        with pytest.raises(DispatchInputError) as caught:
            window_from_tensors({**tensors, **change})
        assert caught.value.code == code, str(caught.value)


def test_codes_of_real_resolver_failures() -> None:
    args = {
        "objectives": np.full((2, 3), 1.0, dtype=np.float32),
        "candidate_rider_index": np.array([[0, 1]], dtype=np.int32),
        "rider_ids": np.array([b"r0", b"r1"], dtype=object),
        "rider_load": np.zeros(2, dtype=np.int32),
        "rider_capacity": np.ones(2, dtype=np.int32),
        "weights": np.array([0.5, 0.3, 0.2]),
    }
    cases = {
        "range": {"candidate_rider_index": np.array([[0, 7]], dtype=np.int32)},
        "unique": {"candidate_rider_index": np.array([[1, 1]], dtype=np.int32)},
        "dtype": {"rider_load": np.zeros(2, dtype=np.float32)},
        "shape": {"rider_capacity": np.ones(3, dtype=np.int32)},
        "not_finite": {"objectives": np.full((2, 3), np.nan, dtype=np.float32)},
    }
    for code, change in cases.items():
        with pytest.raises(DispatchInputError) as caught:
            resolve(**{**args, **change})
        assert caught.value.code == code, str(caught.value)
