"""Every alert's runbook fix is performed by one integration test.

An integration test that raises an alert's condition on a real server, applies the fix its
docs/runbook.md entry gives and sees the condition clear claims the alert with
``@pytest.mark.runbook_fix("DispatchX", ...)`` (the marker is registered in pyproject.toml).
This test reads the claims from the integration tests' source, so a new alert without a fix
test fails here. An alert whose condition cannot be raised on the test machine is listed in
`NOT_RAISED_HERE` with the reason; its expression is covered by its `promtool test rules`
case only (tests/unit/deploy/test_alerts.py), and the runbook says so.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
INTEGRATION = ROOT / "tests" / "integration"
RUNBOOK = ROOT / "docs" / "runbook.md"
MARKER = "runbook_fix"

# Alert -> why no integration test raises its condition (the one place that says so).
_HOUR_OF_TRAFFIC = (
    "PSI over an hour of at least 5,000 scored pairs, which clears only as that hour moves on: "
    "raised on a real server by test_live_city's scenarios (make live-city-alerts, minutes "
    "each) and read there with promtool; the fix is not performed"
)
_HOUR_OF_OUTCOMES = (
    "at least 1,000 deliveries in the outcome service's last hour, a figure that clears only "
    "as that hour moves on: raised on a real server by test_live_city's scenarios (make "
    "live-city-alerts, minutes each) and read there with promtool; the fix is not performed"
)
NOT_RAISED_HERE: dict[str, str] = {
    "DispatchGpuUnhealthy": "needs a GPU: the test machine has none (NVML finds no device)",
    "DispatchDeviceFallback": "needs a GPU: the test machine has none (NVML finds no device)",
    "DispatchFeatureDrift": _HOUR_OF_TRAFFIC,
    "DispatchPredictionDrift": _HOUR_OF_TRAFFIC,
    "DispatchCalibrationDecay": _HOUR_OF_OUTCOMES,
    "DispatchEtaBias": _HOUR_OF_OUTCOMES,
}


def alerts() -> list[str]:
    document = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [
        str(rule["alert"])
        for group in document["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def _is_marker(node: ast.expr) -> bool:
    """``pytest.mark.runbook_fix`` (the decorator's callee)."""
    return (
        isinstance(node, ast.Attribute)
        and node.attr == MARKER
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
    )


def claims(folder: Path = INTEGRATION) -> dict[str, list[str]]:
    """Alert -> the tests ("module::function") whose runbook_fix marker names it."""
    found: dict[str, list[str]] = {}
    for path in sorted(folder.glob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            for decorator in node.decorator_list:
                if not (isinstance(decorator, ast.Call) and _is_marker(decorator.func)):
                    continue
                assert decorator.args and not decorator.keywords, (path, node.name)
                for arg in decorator.args:
                    assert isinstance(arg, ast.Constant) and isinstance(arg.value, str), (
                        f"{path.name}::{node.name}: name each alert as a string literal"
                    )
                    found.setdefault(arg.value, []).append(f"{path.name}::{node.name}")
    return found


def test_the_claims_are_read_from_decorators(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\n"
        '@pytest.mark.runbook_fix("A", "B")\ndef test_one():\n    pass\n\n'
        '@pytest.mark.integration\n@pytest.mark.runbook_fix("C")\ndef test_two():\n    pass\n\n'
        "def test_three():\n    pass\n"
    )
    assert claims(tmp_path) == {
        "A": ["test_x.py::test_one"],
        "B": ["test_x.py::test_one"],
        "C": ["test_x.py::test_two"],
    }


def test_every_alert_has_one_fix_test_or_a_stated_reason() -> None:
    names = alerts()
    claimed = claims()
    unknown = sorted(set(claimed) - set(names))
    assert not unknown, f"runbook_fix names no alert of alerts.yml: {unknown}"
    twice = {name: tests for name, tests in claimed.items() if len(tests) > 1}
    assert not twice, f"claimed by more than one test: {twice}"
    both = sorted(set(claimed) & set(NOT_RAISED_HERE))
    assert not both, f"claimed and listed as not raised here: {both}"
    assert set(NOT_RAISED_HERE) <= set(names), sorted(set(NOT_RAISED_HERE) - set(names))
    missing = [n for n in names if n not in claimed and n not in NOT_RAISED_HERE]
    assert not missing, (
        f"no integration test performs the runbook fix of {missing}: mark the test that "
        f'raises the condition, applies the fix and sees it clear with @pytest.mark.{MARKER}("...")'
    )


def test_the_runbook_names_the_alerts_whose_fix_no_test_performs() -> None:
    """Its opening says which fixes the tests perform and which only promtool covers."""
    intro = RUNBOOK.read_text(encoding="utf-8").split("\n## ", 1)[0]
    for name in NOT_RAISED_HERE:
        assert re.search(rf"\b{name}\b", intro), f"the runbook's opening does not name {name}"
