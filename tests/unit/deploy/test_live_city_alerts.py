"""The quality alerts on series recorded from real live-city runs (`make live-city-alerts`
with LIVE_CITY_SERIES_DIR=tests/unit/deploy/data: tritonserver, the outcome service, the
simulator's truth): Chengdu's world changes at simulated minute 60 (speeds -30 %, or a
railway the registry does not list) and its calibration or ETA-bias alert fires within 105
minutes; Shanghai's never does, nor Chengdu's before the change."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.unit.deploy.live_city_cases import promtool_case

DATA = Path(__file__).resolve().parent / "data"
PROMTOOL = shutil.which("promtool")
CHANGE_MINUTE = 60
STATED_MINUTES = 105


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
@pytest.mark.parametrize("scenario", ["speeds", "barrier"])
def test_the_changed_citys_quality_alerts_fire_and_no_other_citys(
    tmp_path: Path, scenario: str
) -> None:
    series = json.loads((DATA / f"live_city_{scenario}.json").read_text())
    steps = len(series[0]["values"].split())
    cities = {s["series"].split('city="')[1].split('"')[0] for s in series}
    assert cities == {"shanghai", "chengdu"}
    case = tmp_path / "case.test.yml"
    case.write_text(
        promtool_case(
            series,
            city="chengdu",
            expected="DispatchCalibrationDecay|DispatchEtaBias",
            change_minute=CHANGE_MINUTE,
            stated_minutes=STATED_MINUTES,
            end_minute=steps - 1,
        )
    )
    done = subprocess.run(
        [str(PROMTOOL), "test", "rules", str(case)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-1000:]


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
def test_the_case_fails_when_the_alert_comes_too_late(tmp_path: Path) -> None:
    """The same recorded run judged with a deadline before the alert can fire fails."""
    series = json.loads((DATA / "live_city_speeds.json").read_text())
    case = tmp_path / "case.test.yml"
    case.write_text(
        promtool_case(
            series,
            city="chengdu",
            expected="DispatchCalibrationDecay|DispatchEtaBias",
            change_minute=CHANGE_MINUTE,
            stated_minutes=5,
            end_minute=len(series[0]["values"].split()) - 1,
        )
    )
    done = subprocess.run(
        [str(PROMTOOL), "test", "rules", str(case)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # The alert did fire, after the deadline: the first check reads 0, not 1.
    assert done.returncode != 0 and "got: {} 0E+00" in done.stdout + done.stderr
