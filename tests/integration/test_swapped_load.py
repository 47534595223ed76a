"""Checked, then swapped: a writer of the repository without the signing key swaps a model's
code 0-100 ms after a load request, on a verified launcher. The code must never run, on any
load path: the control endpoint's loads, the supervisor's reload after a stub death, and a
restart of the server (`verified_load.RepositoryCopy`: Triton reads the launcher's copy of
the verified bytes).

The changed code creates a marker file when Python imports it; the marker must never exist.
Each path runs ``DISPATCH_SWAP_ATTEMPTS`` attempts (default 2; `make test-hostile` runs 100,
the restart path a tenth of that). The tests share one verified launcher (policy `restart`),
started again where the restart path has given it up.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from launcher_helpers import Launcher, SharedLauncher, signed_repository, status
from patience import wait_for

from dispatch_service.core.repository_layout import ENCODER_MODEL, model_layout
from dispatch_service.ops.model_control import ModelControlError, load_model, with_reload_mark
from dispatch_service.ops.stubs import stub_versions
from dispatch_service.ops.verified_load import read_config

ATTEMPTS = int(os.environ.get("DISPATCH_SWAP_ATTEMPTS", "2"))


class Swapper:
    """Swaps the encoder's model.py for code that leaves a marker, ``delay`` after `arm`."""

    def __init__(self, repository: Path, marker: Path) -> None:
        self.path = model_layout(repository, ENCODER_MODEL).python_model(1)
        self.signed = self.path.read_bytes()
        self.changed = self.signed + f"\nopen({str(marker)!r}, 'w').close()\n".encode()
        self.chance = random.Random(45)
        self.timer: threading.Timer | None = None

    def arm(self) -> float:
        delay = self.chance.uniform(0.0, 0.1)
        self.timer = threading.Timer(delay, self.path.write_bytes, (self.changed,))
        self.timer.start()
        return delay

    def restore(self) -> None:
        if self.timer is not None:
            self.timer.join()
        self.path.write_bytes(self.signed)


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SharedLauncher, Path]]:
    """A launcher verifying a signed copy of the repository; that copy."""
    folder = tmp_path_factory.mktemp("swapped")
    repository, trusted, _ = signed_repository(folder)
    shared = SharedLauncher(
        folder,
        *("--model-repository", str(repository), "--trusted-keys", str(trusted)),
        *("--on-dead", "restart"),
    )
    try:
        yield shared, repository
    finally:
        shared.stop()


def encoder_stubs(launcher: Launcher) -> list[int]:
    return [
        pid
        for server in launcher.children("tritonserver")
        for pid, (name, _) in stub_versions(server).items()
        if name == ENCODER_MODEL
    ]


def test_a_file_swapped_after_a_load_request_never_runs(
    verified: tuple[SharedLauncher, Path], tmp_path: Path
) -> None:
    shared, repository = verified
    marker = tmp_path / "changed-code-ran"
    swapper = Swapper(repository, marker)
    launcher = shared.get()
    url, admin_key = launcher.health_url, launcher.admin_key
    config = read_config(repository / ENCODER_MODEL)
    outcomes = {"control": {"loaded": 0, "refused": 0}, "reload": {"healed": 0, "refused": 0}}
    try:
        # The control endpoint's loads (a reload mark makes Triton start new stubs).
        for _ in range(ATTEMPTS):
            swapper.arm()
            try:
                load_model(url, ENCODER_MODEL, with_reload_mark(config), admin_key)
                outcomes["control"]["loaded"] += 1
            except ModelControlError as exc:
                assert exc.status == 403 and "does not verify" in str(exc), exc
                outcomes["control"]["refused"] += 1
            swapper.restore()
            assert not marker.exists()
        # The supervisor's reload after a stub death.
        for _ in range(ATTEMPTS):
            wait_for(lambda: status(f"{url}/readyz") == 200, "ready before the kill", 120)
            (victim, *_) = sorted(encoder_stubs(launcher), reverse=True)
            os.kill(victim, signal.SIGKILL)
            swapper.arm()
            wait_for(
                lambda victim=victim: (
                    victim not in encoder_stubs(launcher)
                    and (
                        status(f"{url}/readyz") == 200
                        or "feature_encoder" in json.dumps(health_of(url).get("unhealed", {}))
                    )
                ),
                "the reload done or refused",
                120,
            )
            refused = status(f"{url}/readyz") != 200
            outcomes["reload"]["refused" if refused else "healed"] += 1
            swapper.restore()
            wait_for(lambda: status(f"{url}/readyz") == 200, "healed with the signed file", 120)
            assert not marker.exists()
    finally:
        swapper.restore()
    print(f"\n{ATTEMPTS} attempts a path: {outcomes}; changed code ran: {marker.exists()}")
    assert not marker.exists()


def health_of(url: str) -> dict[str, object]:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as response:
            return dict(json.load(response))
    except urllib.error.HTTPError as exc:
        return dict(json.load(exc))
    except (urllib.error.URLError, OSError, ValueError):
        return {}


def test_a_file_swapped_as_the_server_restarts_never_runs(
    verified: tuple[SharedLauncher, Path], tmp_path: Path
) -> None:
    """A restart verifies and copies the repository again; the swap lands 0-100 ms after the
    crash and is undone 0.3 s later, so the restart reads either version of the file: it
    comes back ready, or (the changed file read) the encoder is refused and the launcher
    gives the server up. Either way the changed code never runs."""
    shared, repository = verified
    marker = tmp_path / "changed-code-ran"
    swapper = Swapper(repository, marker)
    launcher = shared.get()
    url = launcher.health_url
    restarted = 0
    try:
        for _ in range(max(1, ATTEMPTS // 10)):
            wait_for(lambda: status(f"{url}/readyz") == 200, "ready before the crash", 240)
            (server,) = launcher.children("tritonserver")
            os.kill(server, signal.SIGKILL)
            delay = swapper.arm()
            threading.Timer(delay + 0.3, swapper.restore).start()
            wait_for(
                lambda server=server: (
                    launcher.process.poll() is not None
                    or (
                        server not in launcher.children("tritonserver")
                        and status(f"{url}/readyz") == 200
                    )
                ),
                "ready after the restart, or given up",
                240,
            )
            assert not marker.exists()
            if launcher.process.poll() is not None:
                break
            restarted += 1
    finally:
        swapper.restore()
    print(f"\nrestarts: {restarted}; changed code ran: {marker.exists()}")
    assert not marker.exists()
