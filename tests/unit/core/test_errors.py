"""Behaviour of dispatch_service.core.errors: messages unchanged, a stable rule code for metrics."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from dispatch_service.core.errors import RULE_CODES, DispatchInputError, rule_code
from dispatch_service.domain.window import window_from_tensors, window_to_tensors
from dispatch_service.offline.simulator import generate_window

LIBRARY = Path(__file__).resolve().parents[3] / "python_backend" / "dispatch_service"


def test_message_names_tensor_and_rule_and_code_is_derived() -> None:
    error = DispatchInputError("ORDER_PICKUP", "latitude must be within [-90.0, 90.0] (row 3)")
    assert str(error) == "ORDER_PICKUP: latitude must be within [-90.0, 90.0] (row 3)"
    assert (error.tensor, error.code) == ("ORDER_PICKUP", "range")
    assert isinstance(error, ValueError)


def test_an_explicit_code_wins_and_must_be_known() -> None:
    error = DispatchInputError("X", "is required but missing", code="shape")
    assert error.code == "shape"
    assert str(error) == "X: is required but missing"
    with pytest.raises(ValueError, match="unknown rule code 'bogus'"):
        DispatchInputError("X", "whatever", code="bogus")


@pytest.mark.parametrize(
    ("rule", "code"),
    [
        ("is required but missing", "missing"),
        ("must be FP32, got float64", "dtype"),
        ("must be BYTES, got int64", "dtype"),
        ("ids must be bytes or text (row 0)", "dtype"),
        ("must hold bytes, got int (row 2)", "dtype"),
        ("must be numeric", "dtype"),
        ("must be an INT32 [B, N] tensor, got (3,)", "dtype"),
        ("must be ASCII text", "dtype"),
        ("must be 'stable', 'canary' or a version number >= 1", "unknown_value"),
        ("must have 2 dimension(s) [*, 2], got shape (4,)", "shape"),
        ("must have shape [*, 28], got (4, 27)", "shape"),
        ("must have 4 rows like ORDER_IDS, got 3", "shape"),
        ("must have B*N = 2*3 = 6 rows like CANDIDATE_RIDER_INDEX, got 5", "shape"),
        ("must hold between 1 and 1024 entries, got 0", "count"),
        ("must be finite, got NaN or infinity (row 1)", "not_finite"),
        ("must be finite on valid pairs, got NaN or infinity (row 0)", "not_finite"),
        ("longitude must be within [-180.0, 180.0] (row 0)", "range"),
        ("must be >= 0 (row 2)", "range"),
        ("must be within (0, 240] minutes (row 1)", "range"),
        ("must not be more than 300 s after DISPATCH_TIME (row 0)", "range"),
        ("must be a positive unix time in seconds", "range"),
        ("weights must be >= 0 with a positive sum", "range"),
        ("weights must be finite and >= 0 with a positive sum", "range"),
        ("must be -1 or a rider row in [0, 5), got 9 at [0, 1]", "range"),
        ("must lie in [0, 1] where a rider is listed", "range"),
        ("ids must be unique, row 3 repeats row 1", "unique"),
        ("order 2 lists a rider more than once", "unique"),
        ("ids must not be empty (row 0)", "id_length"),
        ("ids must be at most 64 bytes, row 0 has 65", "id_length"),
        ("must be one of WGS84, GCJ02, BD09", "unknown_value"),
        ("only bits 0xf are defined (row 1)", "unknown_value"),
        ("must be 0 (e-bike), 1 (motorbike) or 2 (car) (row 0)", "unknown_value"),
        ("something nobody planned for", "invalid"),
    ],
)
def test_rule_code_of_each_kind_of_message(rule: str, code: str) -> None:
    assert rule_code(rule) == code
    assert code in RULE_CODES


def _rule_template(node: ast.expr) -> str | None:
    """The rule argument's text with each `{...}` replaced by X; None when not a literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            part.value if isinstance(part, ast.Constant) else "X" for part in node.values
        )
    return None


def _raise_sites() -> list[tuple[str, str]]:
    sites = []
    for path in sorted(LIBRARY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "DispatchInputError"
                and len(node.args) == 2
                and not any(keyword.arg == "code" for keyword in node.keywords)
            ):
                continue
            template = _rule_template(node.args[1])
            if template is not None:
                sites.append((f"{path.name}:{node.lineno}", template))
    return sites


def test_every_library_raise_site_without_a_code_maps_to_a_known_rule() -> None:
    sites = _raise_sites()
    assert len(sites) > 30  # the sweep found the library's raise sites
    unmapped = [(where, rule) for where, rule in sites if rule_code(rule) == "invalid"]
    assert not unmapped, f"pass code=... or extend errors._DERIVED_CODES: {unmapped}"


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
