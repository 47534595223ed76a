"""Training data: simulated windows, encoded as served, labelled with one noisy outcome."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from dispatch_service.domain.features import EncoderSettings, encode_window
from dispatch_service.offline import simulator
from dispatch_service.offline.training.config import MapVariants

__all__ = [
    "F32",
    "F64",
    "Dataset",
    "build_dataset",
    "build_variant_dataset",
    "concatenated",
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
    return _simulated(
        rng,
        windows,
        lambda number: chosen[number % len(chosen)],
        orders_range=orders_range,
        riders_range=riders_range,
        encoder=encoder,
        cities=cities,
    )


def build_variant_dataset(
    rng: np.random.Generator,
    variants: MapVariants,
    *,
    orders_range: tuple[int, int],
    riders_range: tuple[int, int],
    encoder: EncoderSettings,
    cities: Sequence[str],
) -> Dataset:
    """``variants.windows`` windows, each in `simulator.entry_world` of one of ``cities``'
    registry entries (in turn) with a road circuity and a speed factor drawn from ``rng``
    (`MapVariants`); ``pair_city`` names the entry each was built from."""
    entries = [simulator.city_worlds()[name].map for name in cities]

    def world(number: int) -> simulator.CityConfig:
        entry = entries[number % len(entries)]
        circuity = float(rng.uniform(*variants.road_circuity))
        scale = float(rng.uniform(*variants.speed_scale))
        varied = dataclasses.replace(
            entry, road_circuity=circuity, speeds_kmh=entry.speeds_kmh * scale
        )
        return simulator.entry_world(varied)

    return _simulated(
        rng,
        variants.windows,
        world,
        orders_range=orders_range,
        riders_range=riders_range,
        encoder=encoder,
        cities=cities,
    )


def _simulated(
    rng: np.random.Generator,
    windows: int,
    world_of: Callable[[int], simulator.CityConfig],
    *,
    orders_range: tuple[int, int],
    riders_range: tuple[int, int],
    encoder: EncoderSettings,
    cities: Sequence[str],
) -> Dataset:
    """``windows`` windows, window ``number`` in ``world_of(number)``, a world of
    ``cities[number % len(cities)]``'s."""
    feats: list[F32] = []
    labels: list[tuple[F64, F64, F64]] = []
    expected: list[F64] = []
    pair_city: list[NDArray[np.int64]] = []
    for number in range(windows):
        city = world_of(number)
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
        pair_city.append(np.full(valid.size, number % len(cities), dtype=np.int64))
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


def concatenated(first: Dataset, second: Dataset) -> Dataset:
    """The pairs of ``first`` then ``second``, over the same ``cities``."""
    if first.cities != second.cities:
        raise ValueError(f"datasets over {first.cities} and {second.cities} do not concatenate")
    return Dataset(
        features=np.concatenate((first.features, second.features)),
        eta_minutes=np.concatenate((first.eta_minutes, second.eta_minutes)),
        on_time=np.concatenate((first.on_time, second.on_time)),
        cost_cny=np.concatenate((first.cost_cny, second.cost_cny)),
        expected=np.concatenate((first.expected, second.expected)),
        windows=first.windows + second.windows,
        cities=first.cities,
        pair_city=np.concatenate((first.pair_city, second.pair_city)),
    )
