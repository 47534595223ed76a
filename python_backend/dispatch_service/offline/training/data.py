"""Training data: simulated windows, encoded as served, labelled with one noisy outcome."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dispatch_service.domain.features import EncoderSettings, encode_window
from dispatch_service.offline import simulator

__all__ = [
    "F32",
    "F64",
    "Dataset",
    "build_dataset",
]

F32 = NDArray[np.float32]
F64 = NDArray[np.float64]


@dataclass(frozen=True)
class Dataset:
    """Pair features and their noisy labels (ETA minutes, on time 0/1, cost CNY)."""

    features: F32
    eta_minutes: F64
    on_time: F64
    cost_cny: F64
    expected: F64  # [n, 3] the simulator's noise-free expectation, for the card only
    windows: int

    @property
    def pairs(self) -> int:
        return int(self.features.shape[0])


def build_dataset(
    rng: np.random.Generator,
    windows: int,
    orders_range: tuple[int, int],
    riders_range: tuple[int, int],
    encoder: EncoderSettings,
    city: simulator.CityConfig = simulator.DEFAULT_CITY,
) -> Dataset:
    """Simulate, encode and label ``windows`` windows (one Python iteration per window)."""
    feats: list[F32] = []
    labels: list[tuple[F64, F64, F64]] = []
    expected: list[F64] = []
    for _ in range(windows):
        num_orders = int(rng.integers(orders_range[0], orders_range[1] + 1))
        num_riders = int(rng.integers(riders_range[0], riders_range[1] + 1))
        window = simulator.generate_window(rng, num_orders, num_riders, config=city)
        encoded = encode_window(window, encoder)
        candidates = encoded.candidate_rider_index
        flat = candidates.reshape(-1)
        valid = np.flatnonzero(flat >= 0)
        orders = valid // candidates.shape[1]
        riders = flat[valid]
        minutes, on_time, cost = simulator.sample_outcome(window, orders, riders, rng, city)
        feats.append(encoded.pair_features[valid])
        labels.append((minutes, on_time.astype(np.float64), cost))
        expected.append(np.stack(simulator.expected_outcome(window, orders, riders, city), axis=1))
    return Dataset(
        features=np.concatenate(feats).astype(np.float32),
        eta_minutes=np.concatenate([lab[0] for lab in labels]),
        on_time=np.concatenate([lab[1] for lab in labels]),
        cost_cny=np.concatenate([lab[2] for lab in labels]),
        expected=np.concatenate(expected),
        windows=windows,
    )
