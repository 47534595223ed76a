"""`promtool test rules` cases over series recorded from a live-city run (offline.live_city):
the changed city's alerts fire in time, no quality alert fires elsewhere or before the change.

Used by tests/integration/test_live_city.py on the series of its own runs and by
test_live_city_alerts.py on the quality series recorded from such runs
(tests/unit/deploy/data/live_city_*.json).
"""

from __future__ import annotations

from typing import Any

import yaml

from dispatch_service.core.paths import REPO_ROOT

ALERT_RULES = REPO_ROOT / "deploy" / "prometheus" / "alerts.yml"
QUALITY_ALERTS = (
    "DispatchFeatureDrift",
    "DispatchPredictionDrift",
    "DispatchCalibrationDecay",
    "DispatchEtaBias",
)


def promtool_case(
    series: list[dict[str, Any]],
    *,
    city: str,
    expected: str,
    change_minute: int,
    stated_minutes: int,
    end_minute: int,
) -> str:
    """The case file: by ``change_minute + stated_minutes`` one of the ``expected`` alerts
    (a regex of names) fires for ``city``; at no time does a quality alert fire for another
    city, nor for ``city`` before ``change_minute``. One input step a simulated minute."""
    quality = "|".join(QUALITY_ALERTS)
    firing = 'ALERTS{alertstate="firing",alertname=~"%s",city%s"%s"}'
    deadline = (change_minute + stated_minutes) * 60
    checks = [
        {
            "expr": f"min(min_over_time(timestamp({firing % (expected, '=', city)})"
            f"[{end_minute}m:1m])) <= bool {deadline}",
            "eval_time": f"{end_minute}m",
            "exp_samples": [{"labels": "{}", "value": 1}],
        },
        {
            "expr": f"count_over_time({firing % (quality, '!=', city)}[{end_minute}m])",
            "eval_time": f"{end_minute}m",
            "exp_samples": [],
        },
        {
            "expr": f"count_over_time({firing % (quality, '=', city)}[{change_minute}m])",
            "eval_time": f"{change_minute}m",
            "exp_samples": [],
        },
    ]
    case = {
        "rule_files": [str(ALERT_RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": checks}],
    }
    return yaml.safe_dump(case, sort_keys=False)
