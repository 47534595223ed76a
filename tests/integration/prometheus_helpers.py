"""A real Prometheus for the integration tests (the Debian package `make setup` installs):
started on a free loopback port with the scrape jobs given, queried through its HTTP API,
stopped on exit (test_metrics_prometheus.py, test_runbook_fixes.py, test_fleet.py)."""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from patience import wait_for

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; the result vector (metric labels and value)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        answer = _get_json(url)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def value(self, promql: str) -> float:
        """Sum of an instant query's samples; 0 when there are none (not yet created)."""
        return sum(float(sample["value"][1]) for sample in self.query(promql))

    def by_labels(self, promql: str, *labels: str) -> dict[tuple[str, ...], float]:
        return {
            tuple(sample["metric"].get(label, "") for label in labels): float(sample["value"][1])
            for sample in self.query(promql)
        }

    def names(self) -> set[str]:
        answer = _get_json(f"{self.url}/api/v1/label/__name__/values")
        return set(answer["data"])

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])


def alert_expr(name: str, window_s: float | None = None) -> str:
    """The expression of alert ``name`` as deploy/prometheus/alerts.yml has it (its `for`
    left out: a test reads whether the condition holds now).

    With ``window_s`` every range selector (``[5m]``, ``[30m]``) reads the last ``window_s``
    seconds instead: the same condition over a window that starts after a fix (or at a
    burst), which the alert's own window reaches once it has moved past the fix.
    """
    document = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    rules = [rule for group in document["groups"] for rule in group["rules"]]
    (expr,) = [str(rule["expr"]) for rule in rules if rule.get("alert") == name]
    if window_s is None:
        return expr
    return re.sub(r"\[\d+[smhd]\]", f"[{math.ceil(window_s)}s]", expr)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_prometheus(
    work: Path, targets: dict[str, str], scrape_s: float = 1.0
) -> Iterator[Prometheus]:
    """Prometheus scraping each ``targets`` job (job name -> a /metrics URL) every
    ``scrape_s``; ready when it answers."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(
            "prometheus is not installed (Debian package `prometheus`): run `make setup`",
            pytrace=False,
        )
    jobs = []
    for job, url in targets.items():
        target = urllib.parse.urlsplit(url)
        jobs.append(
            {
                "job_name": job,
                "metrics_path": target.path,
                "static_configs": [{"targets": [target.netloc]}],
            }
        )
    config = work / "prometheus.yml"
    config.write_text(  # JSON is YAML
        json.dumps(
            {
                "global": {"scrape_interval": f"{scrape_s:.0f}s", "scrape_timeout": "1s"},
                "scrape_configs": jobs,
            }
        )
    )
    port = _free_port()
    log = work / "prometheus.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={work / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:

        def ready() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"prometheus exited:\n{server.log_tail()}")
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        wait_for(ready, "prometheus ready", 45.0, 0.25)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)
