"""The servers a benchmark measures: this checkout's Triton and the FastAPI baseline.

Each is a context manager on free loopback ports, stopped on exit.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import TracebackType

from dispatch_service.core.paths import REPO_ROOT
from dispatch_service.ops.child_process import ChildService
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from perf.levels import Endpoints
from perf.pa import PerfAnalyzer

__all__ = [
    "FastApiSession",
    "TritonSession",
]


# ---- servers ---------------------------------------------------------------------------------


class TritonSession:
    """This checkout's tritonserver on free loopback ports, stopped on exit."""

    def __init__(self, repository: Path, log_path: Path) -> None:
        runtime = TritonRuntime.from_venv()
        # perf_analyzer registers its regions without the shm key (its -H is HTTP only):
        # the shared-memory group stays open on this loopback-only measurement server.
        options = ServerOptions(
            model_repository=repository, ports=Ports.free(), unlocked_groups=("shared-memory",)
        )
        self.server = TritonServer(runtime, options, log_path)
        self.pa = PerfAnalyzer.from_venv()

    def __enter__(self) -> TritonSession:
        self.server.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.stop()

    @property
    def http_base(self) -> str:
        return f"http://{self.server.http_url}"

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints(grpc=self.server.grpc_url, http=self.server.http_url)


class FastApiSession(ChildService):
    """The FastAPI baseline under uvicorn (own process group), stopped on exit."""

    def __init__(self, repository: Path, log_path: Path, workers: int = 2) -> None:
        super().__init__(log_path, "FastAPI baseline")
        self.port = Ports.free().http
        self.repository = repository
        self.workers = workers

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> FastApiSession:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        env["DISPATCH_BASELINE_MODEL_REPOSITORY"] = str(self.repository)
        command = [
            sys.executable,
            "-m",
            "perf.baselines.fastapi_service",
            "--port",
            str(self.port),
            "--workers",
            str(self.workers),
        ]
        self.spawn(command, env, cwd=REPO_ROOT)
        self.wait_http_ok(f"{self.base}/health", timeout_s=120)
        return self
