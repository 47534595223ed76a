"""Every address option of the command-line tools takes ``host:port`` and refuses an address
without a port (`127.0.0.1` was taken and sent to port 80), exit 2 naming the rule: the
admin's ``--replica``, the outcome report's ``--url`` (the client's own ``--url`` and the GPU
monitor's: tests/unit/client/test_cli.py, tests/unit/ops/test_gpu_monitor.py)."""

from __future__ import annotations

import io

import pytest

from dispatch_client.outcomes_cli import report_outcomes_main
from dispatch_service.ops import admin


def test_admin_status_refuses_a_replica_without_a_port(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = admin.main(["status", "--replica", "127.0.0.1"], io.StringIO())
    assert code == 2
    assert "--replica: expected host:port" in capsys.readouterr().err  # argparse's usage


def test_the_outcome_report_refuses_a_url_without_a_port(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert report_outcomes_main(["--url", "http://127.0.0.1", "-"]) == 2
    assert "--url: expected host:port" in capsys.readouterr().err
