"""docs/runbook.md's fixes, done as written against a real launcher, scraped by a real
Prometheus as compose's Prometheus does (jobs `dispatch-launcher` and `triton`).

Each test raises an alert's condition, reads it through the alert's own expression
(deploy/prometheus/alerts.yml, its `for` left out), applies the entry's **Do** and sees the
expression come back empty. The fleet and routing entries are tested with the fleet
(test_fleet.py, test_lifecycle.py). The launcher is verified (`--trusted-keys`) and restarts
a dead server (`--on-dead restart`), as in the images.
"""

from __future__ import annotations

import io
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from launcher_helpers import Launcher, free_port, signed_repository, status
from patience import patience, wait_for
from prometheus_helpers import Prometheus, alert_expr, running_prometheus

from dispatch_service.core.repository_layout import ENCODER_MODEL, model_layout
from dispatch_service.ops import admin
from dispatch_service.ops.server import Ports
from dispatch_service.ops.stubs import stub_versions


@dataclass
class Served:
    folder: Path
    repository: Path
    trusted: Path
    ports: Ports
    health_port: int
    launchers: list[Launcher] = field(default_factory=list)

    @property
    def launcher(self) -> Launcher:
        return self.launchers[-1]

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.health_port}"

    def start(self) -> None:
        """The launcher as the images run it, on this module's ports (what a process manager
        does when it restarts one)."""
        launcher = Launcher(
            self.ports,
            self.folder / "server.log",
            self.folder / "keys",
            *("--health-port", str(self.health_port)),
            *("--model-repository", str(self.repository)),
            *("--trusted-keys", str(self.trusted)),
            *("--on-dead", "restart"),
        )
        self.launchers.append(launcher)
        assert launcher.read_until("ready:", patience(240)), "\n".join(launcher.lines)
        # its later events are read too, so a full pipe never blocks it
        threading.Thread(target=launcher.read_until, args=("\0", 3600), daemon=True).start()

    def tritonserver(self) -> int:
        (pid,) = self.launcher.children("tritonserver")
        return pid


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("runbook")
    repository, trusted, _ = signed_repository(folder)
    running = Served(folder, repository, trusted, Ports.free(), free_port())
    running.start()
    try:
        yield running
    finally:
        running.launcher.stop()


@pytest.fixture(scope="module")
def prometheus(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    targets = {
        "dispatch-launcher": f"{served.health_url}/metrics",
        "triton": f"http://127.0.0.1:{served.ports.metrics}/metrics",
    }
    with running_prometheus(tmp_path_factory.mktemp("prometheus"), targets) as server:
        wait_for(lambda: server.value("up") == 2.0, "both ports scraped", 45, 0.25)
        yield server


def firing(prometheus: Prometheus, alert: str) -> list[dict[str, str]]:
    """The series for which ``alert``'s condition holds now (their labels)."""
    return [sample["metric"] for sample in prometheus.query(alert_expr(alert))]


def wait_until_clear(prometheus: Prometheus, *alerts: str, within_s: float = 120) -> None:
    for alert in alerts:
        wait_for(lambda a=alert: not firing(prometheus, a), f"{alert} clear", within_s, 0.5)  # type: ignore[misc]


def test_model_unhealed_clears_once_the_changed_signed_file_is_restored(
    served: Served, prometheus: Prometheus
) -> None:
    """DispatchModelUnhealed (and DispatchNotReady meanwhile): a stub died and its model's
    files changed since they were signed, so the reload is refused. **Do**: restore the
    changed signed files (`dispatch-admin verify` names them)."""
    wait_until_clear(prometheus, "DispatchModelUnhealed", "DispatchNotReady")
    model_py = model_layout(served.repository, ENCODER_MODEL).python_model(1)
    signed = model_py.read_bytes()  # the release's copy
    model_py.write_bytes(signed + b"\n# changed after signing\n")
    stubs = [
        pid
        for pid, (name, _) in stub_versions(served.tritonserver()).items()
        if name == ENCODER_MODEL
    ]
    os.kill(stubs[0], signal.SIGKILL)
    wait_for(
        lambda: (
            [s.get("model") for s in firing(prometheus, "DispatchModelUnhealed")] == [ENCODER_MODEL]
        ),
        "DispatchModelUnhealed's condition for feature_encoder",
        90,
        0.5,
    )
    assert firing(prometheus, "DispatchNotReady")
    # The runbook's check names the file ...
    out = io.StringIO()
    code = admin.main(
        ["verify", "--trusted-keys", str(served.trusted), str(served.repository)], out
    )
    assert code == 1
    named = [line for line in out.getvalue().splitlines() if ENCODER_MODEL in line]
    assert named and "model.py" in " ".join(named), out.getvalue()
    # ... and its fix: the signed file back. The launcher's next retry heals the model.
    model_py.write_bytes(signed)
    wait_until_clear(prometheus, "DispatchModelUnhealed", "DispatchNotReady")
    assert status(f"{served.health_url}/readyz") == 200


def test_triton_down_clears_on_the_launchers_restart(
    served: Served, prometheus: Prometheus
) -> None:
    """DispatchTritonDown: Triton crashed (here SIGKILL, as the OOM killer sends). **Do**:
    the launcher's restart (`--on-dead restart`, the images' policy) clears it; the restart
    raises DispatchServerRestarts (which clears 30 minutes later, by its window)."""
    wait_until_clear(prometheus, "DispatchTritonDown", "DispatchNotReady")
    os.kill(served.tritonserver(), signal.SIGKILL)
    wait_for(
        lambda: firing(prometheus, "DispatchTritonDown"), "DispatchTritonDown's condition", 30, 0.25
    )
    wait_until_clear(prometheus, "DispatchTritonDown", "DispatchNotReady", within_s=240)
    assert status(f"{served.health_url}/readyz") == 200
    wait_for(
        lambda: firing(prometheus, "DispatchServerRestarts"),
        "DispatchServerRestarts's condition after the restart",
        30,
        0.5,
    )


def test_launcher_down_clears_when_the_process_manager_restarts_it(
    served: Served, prometheus: Prometheus
) -> None:
    """DispatchLauncherDown: the launcher and its server are gone. **Do**: let the process
    manager restart it (here: the same command line again)."""
    wait_until_clear(prometheus, "DispatchLauncherDown")
    assert served.launcher.stop() == 0  # drained and stopped
    wait_for(
        lambda: firing(prometheus, "DispatchLauncherDown"),
        "DispatchLauncherDown's condition",
        30,
        0.25,
    )
    served.start()
    wait_until_clear(prometheus, "DispatchLauncherDown", "DispatchTritonDown", "DispatchNotReady")
