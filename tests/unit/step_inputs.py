"""Inputs the pipeline step tests share: simulator windows on the wire, random pair
features, a small hand-made resolver window, and the committed scoring model."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from dispatch_contract import NUM_PAIR_FEATURES
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout
from dispatch_service.domain.window_wire import window_to_wire
from dispatch_service.offline.simulator import generate_window

__all__ = ["COMMITTED_MODEL", "Tensors", "features", "resolver_inputs", "window_tensors"]

Tensors = dict[str, NDArray[Any] | None]

COMMITTED_MODEL = model_layout(MODEL_REPOSITORY, SCORING_MODEL).onnx(1)


def window_tensors(orders: int = 5, riders: int = 12, seed: int = 0) -> Tensors:
    window = generate_window(np.random.default_rng(seed), orders, riders)
    return dict(window_to_wire(window))


def features(rows: int, seed: int = 0) -> NDArray[np.float32]:
    return np.random.default_rng(seed).normal(size=(rows, NUM_PAIR_FEATURES)).astype(np.float32)


def resolver_inputs() -> Tensors:
    """3 orders x 4 candidates over 6 riders; order 2 has a single candidate."""
    candidates = np.array([[0, 1, 2, 3], [2, 3, 4, -1], [5, -1, -1, -1]], dtype=np.int32)
    rng = np.random.default_rng(1)
    pairs = candidates.size
    objectives = np.stack(
        [rng.uniform(10, 50, pairs), rng.uniform(0.2, 0.95, pairs), rng.uniform(3, 15, pairs)],
        axis=1,
    ).astype(np.float32)
    return {
        "PAIR_OBJECTIVES": objectives,
        "CANDIDATE_RIDER_INDEX": candidates,
        "RIDER_IDS": np.array([f"r{i}".encode() for i in range(6)], dtype=object),
        # RIDER_FIELD_COLUMNS: lat, lon, load 0, capacity 2, vehicle, equipment
        "RIDER_FIELDS": np.tile([31.2, 121.4, 0.0, 2.0, 0.0, 0.0], (6, 1)),
    }
