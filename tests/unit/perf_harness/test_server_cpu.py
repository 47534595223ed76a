"""perf.server_cpu: a server's CPU split between its own process and its models' stubs,
read from a real process tree (this test's process and two children it starts)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from perf.server_cpu import OTHER_STUBS, TRITONSERVER, cpu_by_part, server_cpu_s

# Burns 0.3 s of CPU after its start, then waits to be ended: its times stay readable.
_BURN = (
    "import time\n"
    "end = time.process_time() + 0.3\n"
    "while time.process_time() < end: pass\n"
    "time.sleep(60)"
)


def _child(name: str) -> subprocess.Popen[bytes]:
    """A child whose command line names a model instance, as a backend stub's does."""
    return subprocess.Popen([sys.executable, "-c", _BURN, name])


def test_each_stubs_cpu_goes_to_the_model_its_command_line_names() -> None:
    here: Any = SimpleNamespace(process=SimpleNamespace(pid=os.getpid()))
    children = [_child("dispatch_fused_0_1"), _child("feature_encoder_0_0")]
    try:
        deadline = time.monotonic() + 60
        while any(sum(psutil.Process(c.pid).cpu_times()[:2]) < 0.3 for c in children):
            assert time.monotonic() < deadline, "the children did not burn their CPU"
            time.sleep(0.05)
        parts = cpu_by_part(here, ("dispatch_fused", "dispatch_floor"))
        assert set(parts) == {TRITONSERVER, OTHER_STUBS, "dispatch_fused", "dispatch_floor"}
        assert parts["dispatch_fused"] >= 0.3
        assert parts["dispatch_floor"] == 0.0
        assert parts[OTHER_STUBS] >= 0.3  # the encoder's stub serves neither
        assert parts[TRITONSERVER] > 0.0  # this process itself
        assert server_cpu_s(here) >= sum(parts.values()) - 1e-9  # the same tree, read later
    finally:
        for child in children:
            child.kill()
            child.wait()


def test_a_server_that_is_not_running_is_said_so() -> None:
    with pytest.raises(RuntimeError, match="not running"):
        cpu_by_part(SimpleNamespace(process=None), ())  # type: ignore[arg-type]
