"""Stand-in "tritonserver" binaries for the launcher's tests (test_server.py,
test_server_cli.py): small scripts written to tmp_path that fail at once, never become ready,
or answer the readiness probe."""

from __future__ import annotations

import stat
from pathlib import Path

from dispatch_service.ops.server import TritonRuntime

FAKE_READY_SERVER = """\
import http.server, json, os, sys
args = sys.argv[1:]
port = int(next(a for a in args if a.startswith("--http-port=")).split("=", 1)[1])
with open(os.environ["FAKE_TRITON_REPORT"], "w") as report:
    json.dump({"argv": sys.argv, "env": dict(os.environ)}, report)

class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v2/health/ready" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass

print("fake tritonserver listening", flush=True)
http.server.HTTPServer(("127.0.0.1", port), Ready).serve_forever()
"""


def write_script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def make_runtime(root: Path, server_script: str | None = None) -> TritonRuntime:
    """A runtime under ``root``; with a script, every path `check` needs exists."""
    runtime = TritonRuntime(
        tritonserver=root / "site" / "bin" / "tritonserver",
        library_path=root / "site" / "libs",
        backend_dir=root / "backends",
        python_bin_dir=root / "venv" / "bin",
    )
    if server_script is not None:
        write_script(runtime.tritonserver, server_script)
        runtime.library_path.mkdir(parents=True)
        (runtime.backend_dir / "python").mkdir(parents=True)
    return runtime
