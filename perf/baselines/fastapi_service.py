"""What a team would otherwise build: FastAPI + uvicorn + ONNX Runtime, one process per core.

NOT part of the product: a reference point for the benchmark only. It does exactly the
server's work with the same library (`DispatchPipeline`: validation, features, the same
ONNX model with the same ORT settings, Top-K and assignment) behind a plain web framework.

Endpoints (loopback only):
- `GET /health`: 200 once the worker's pipeline is loaded.
- `POST /dispatch`: body = the client's window JSON (`dispatch_client.window_json`, the
  schema `dispatch-client` reads); answer = `DispatchResult.to_json_dict()` (per order: its
  Top-K riders and the assigned one) as JSON.
- `POST /dispatch/arrays`: body = `{"tensors": {NAME: {"dtype", "shape", "b64" | "text"}}}`
  holding one window's contract v2 tensors (ORDER_FIELDS, RIDER_FIELDS, ... without the
  batch dimension; see `perf.bodies.encode_arrays`: numbers as base64 raw little-endian,
  ids as strings); answer = the resolver's v2 output tensors in the same form.
Bad input is answered 400 with the library's message.

Handlers are `async def` and run the pipeline inline: the work is CPU-bound, a worker
serves one window at a time, and the event loop avoids a thread-pool hop per request.

Run: `python -m perf.baselines.fastapi_service --port 8100 --workers 2` (model configuration
from `model_repository/`, or from the folder named by DISPATCH_BASELINE_MODEL_REPOSITORY).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from numpy.typing import NDArray

from dispatch_client.client import parse_dispatch_outputs
from dispatch_client.errors import WindowJSONError
from dispatch_client.window_json import window_from_json
from dispatch_contract import RESOLVER_OUTPUTS, pack_window
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from perf.bodies import decode_arrays, encode_arrays

__all__ = [
    "REPOSITORY_ENV",
    "app",
    "arrays_answer",
    "dispatch",
    "dispatch_arrays",
    "health",
    "lifespan",
    "main",
]

REPOSITORY_ENV = "DISPATCH_BASELINE_MODEL_REPOSITORY"
_state: dict[str, DispatchPipeline] = {}


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    # The benchmark points this at the repository the Triton server under test ran.
    repository = Path(os.environ.get(REPOSITORY_ENV, str(MODEL_REPOSITORY)))
    pipeline = DispatchPipeline.from_repository(repository)
    _state["pipeline"] = pipeline
    yield
    _state.clear()


app = FastAPI(title="dispatch baseline (FastAPI)", lifespan=lifespan)


def _json(document: Any, status: int = 200) -> Response:
    return Response(
        json.dumps(document, separators=(",", ":")).encode(),
        status_code=status,
        media_type="application/json",
    )


def _run(tensors: dict[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
    return _state["pipeline"].run(tensors)


@app.get("/health")
async def health() -> Response:
    return _json({"ready": "pipeline" in _state}, 200 if "pipeline" in _state else 503)


@app.post("/dispatch")
async def dispatch(request: Request) -> Response:
    try:
        tensors = pack_window(window_from_json(await request.body()))
        outputs = _run(tensors)
    except (WindowJSONError, DispatchInputError) as exc:
        return _json({"error": str(exc)}, 400)
    answer = parse_dispatch_outputs(tensors["ORDER_IDS"], outputs, tensors["RIDER_IDS"])
    return _json(answer.to_json_dict())


def arrays_answer(body: bytes) -> tuple[dict[str, Any], int]:
    """The `/dispatch/arrays` answer and status: the resolver's v2 outputs (no routing
    here, so not ORDER_MODEL_VERSION / ORDER_FALLBACK_LEVEL), or the library's error."""
    try:
        tensors = decode_arrays(json.loads(body))
        outputs = _run(tensors)
    except (ValueError, DispatchInputError) as exc:  # JSONDecodeError is a ValueError
        return {"error": str(exc)}, 400
    return encode_arrays({spec.name: outputs[spec.name] for spec in RESOLVER_OUTPUTS}), 200


@app.post("/dispatch/arrays")
async def dispatch_arrays(request: Request) -> Response:
    return _json(*arrays_answer(await request.body()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="FastAPI dispatch baseline (benchmark only)")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    uvicorn.run(
        "perf.baselines.fastapi_service:app",
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        log_level="warning",
        access_log=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
