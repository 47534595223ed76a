"""Warmup data for the Python models, so a model reports ready only once it has served.

Triton's `model_warmup` needs real inputs for our models (random bytes would be rejected
by validation), read as raw files from `<model>/warmup/`. They are made from one
deterministic simulator window and committed; a unit test checks they are current.
Run `python -m dispatch_service.ops.warmup` after changing the contract or the encoder (and
`make configs`, which declares the in-process routing models' sample in their configs).
"""

from __future__ import annotations

import argparse
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import DECISION_RECORD_INPUTS, ENCODER_INPUTS, STACKING_INPUTS
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import model_layout
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline
from dispatch_service.routing.settings import IN_PROCESS_ROUTING_MODELS

__all__ = [
    "WARMUP_MODELS",
    "WARMUP_ORDERS",
    "WARMUP_RIDERS",
    "WARMUP_SEED",
    "entry_point_warmup",
    "main",
    "raw_bytes",
    "warmup_tensors",
    "warmup_window",
    "write_warmup",
]

WARMUP_SEED = 11
WARMUP_ORDERS = 64
WARMUP_RIDERS = 200
WARMUP_MODELS = ("feature_encoder", "topk_resolver", *IN_PROCESS_ROUTING_MODELS)


def raw_bytes(array: NDArray[Any]) -> bytes:
    """Triton's raw tensor layout: row-major values; BYTES as 4-byte length + bytes each."""
    if array.dtype.kind == "O":
        out = bytearray()
        for item in array.reshape(-1).tolist():
            value = item.encode() if isinstance(item, str) else bytes(item)
            out += struct.pack("<I", len(value)) + value
        return bytes(out)
    return np.ascontiguousarray(array).tobytes()


def warmup_window() -> dict[str, NDArray[Any]]:
    """The wire tensors of the one simulated window every warm-up sample is made from."""
    rng = np.random.default_rng(WARMUP_SEED)
    return window_to_wire(generate_window(rng, WARMUP_ORDERS, WARMUP_RIDERS))


def entry_point_warmup(window: Mapping[str, NDArray[Any]] | None = None) -> dict[str, NDArray[Any]]:
    """The sample of the in-process routing models, and of feature_encoder: the window as a
    client sends it (the optional tag and weights left out)."""
    window = warmup_window() if window is None else window
    return {spec.name: window[spec.name] for spec in ENCODER_INPUTS if spec.name in window}


def warmup_tensors(repository: Path = MODEL_REPOSITORY) -> dict[str, dict[str, NDArray[Any]]]:
    """Per model, the tensors of one simulated window at each model's inputs (contract v2,
    without the batch dimension: each warmup sample is a batch of 1)."""
    window = warmup_window()
    pipeline = DispatchPipeline.from_repository(repository)
    encoded = pipeline.encoder.run(window)
    scored = pipeline.model.run(encoded)
    available: Mapping[str, NDArray[Any]] = {**window, **encoded, **scored}
    # Without the stacking inputs: a stack-aware warm-up would make BLS calls of a
    # dispatch_model that may still be loading; the resolution itself is the same code. Nor
    # the decision records' inputs: a warm-up is no decision (and records none).
    left_out = {spec.name for spec in (*STACKING_INPUTS, *DECISION_RECORD_INPUTS)}
    resolver = [n for n in pipeline.resolver.input_names if n in available and n not in left_out]
    sample = entry_point_warmup(window)
    return {
        "feature_encoder": sample,
        "topk_resolver": {n: available[n] for n in resolver},
        # The in-process routing models take the window as feature_encoder does; their
        # configs are rendered with this sample (`ops.entry_point_configs`).
        **{name: sample for name in IN_PROCESS_ROUTING_MODELS},
    }


def write_warmup(repository: Path = MODEL_REPOSITORY) -> list[Path]:
    written = []
    for model, tensors in warmup_tensors(repository).items():
        folder = model_layout(repository, model).warmup
        folder.mkdir(exist_ok=True)
        for name, array in tensors.items():
            path = folder / name
            path.write_bytes(raw_bytes(array))
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repository", type=Path, default=MODEL_REPOSITORY)
    args = parser.parse_args(argv)
    for path in write_warmup(args.repository):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
