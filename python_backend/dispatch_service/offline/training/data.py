"""Training data: simulated windows, encoded as served, labelled with one noisy outcome."""

from __future__ import annotations

from collections.abc import Sequence
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
    cities: tuple[str, ...]  # the registry ids the windows were drawn in
    pair_city: NDArray[np.int64]  # [n] each pair's city, an index into ``cities``

    @property
    def pairs(self) -> int:
        return int(self.features.shape[0])

    def of_city(self, city: str) -> Dataset:
        """The pairs drawn in one city (``windows`` then counts that city's windows)."""
        number = self.cities.index(city)
        rows = self.pair_city == number
        return Dataset(
            features=self.features[rows],
            eta_minutes=self.eta_minutes[rows],
            on_time=self.on_time[rows],
            cost_cny=self.cost_cny[rows],
            expected=self.expected[rows],
            windows=len(range(number, self.windows, len(self.cities))),
            cities=(city,),
            pair_city=np.zeros(int(rows.sum()), dtype=np.int64),
        )


def build_dataset(
    rng: np.random.Generator,
    windows: int,
    *,
    orders_range: tuple[int, int],
    riders_range: tuple[int, int],
    encoder: EncoderSettings,
    cities: Sequence[str],
) -> Dataset:
    """Simulate, encode and label ``windows`` windows, each in one of ``cities`` (registry
    ids) drawn in turn (one Python iteration per window)."""
    worlds = simulator.city_worlds()
    chosen = [worlds[name] for name in cities]
    feats: list[F32] = []
    labels: list[tuple[F64, F64, F64]] = []
    expected: list[F64] = []
    pair_city: list[NDArray[np.int64]] = []
    for number in range(windows):
        city = chosen[number % len(chosen)]
        num_orders = int(rng.integers(orders_range[0], orders_range[1] + 1))
        num_riders = int(rng.integers(riders_range[0], riders_range[1] + 1))
        window = simulator.generate_window(rng, num_orders, num_riders, config=city)
        encoded = encode_window(window, city.map, encoder)
        candidates = encoded.candidate_rider_index
        flat = candidates.reshape(-1)
        valid = np.flatnonzero(flat >= 0)
        orders = valid // candidates.shape[1]
        riders = flat[valid]
        minutes, on_time, cost = simulator.sample_outcome(window, orders, riders, rng, city)
        feats.append(encoded.pair_features[valid])
        pair_city.append(np.full(valid.size, number % len(chosen), dtype=np.int64))
        labels.append((minutes, on_time.astype(np.float64), cost))
        expected.append(np.stack(simulator.expected_outcome(window, orders, riders, city), axis=1))
    return Dataset(
        features=np.concatenate(feats).astype(np.float32),
        eta_minutes=np.concatenate([lab[0] for lab in labels]),
        on_time=np.concatenate([lab[1] for lab in labels]),
        cost_cny=np.concatenate([lab[2] for lab in labels]),
        expected=np.concatenate(expected),
        windows=windows,
        cities=tuple(cities),
        pair_city=np.concatenate(pair_city),
    )
