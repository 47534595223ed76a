"""A scoring version's drift reference (``drift_reference.json``, `pipeline.drift`): the
deciles of its pair features and predictions per registered city, from its training data.

The training export writes it next to model.onnx (`training.run.train_and_export`);
`offline.training.drift_reference_cli` writes it into committed version folders without
retraining. Each city's reference pairs are scored with the version's model.onnx and cut
into deciles. A registered city the version was not trained on gets windows of its own world
from another stream of the same seed, as many as a trained city had. The file is part of the
version folder, so signing covers it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from dispatch_contract import PAIR_FEATURE_NAMES
from dispatch_service.core.repository_layout import DRIFT_REFERENCE_FILE, SCORING_MODEL
from dispatch_service.domain.cities import default_registry
from dispatch_service.offline.training.config import STREAM_REFERENCE, STREAM_TRAIN, TrainConfig
from dispatch_service.offline.training.data import Dataset, build_dataset
from dispatch_service.offline.training.export import ort_predict
from dispatch_service.pipeline.drift import (
    CALENDAR_FEATURES,
    DRIFT_QUANTITIES,
    CityReference,
    DriftReference,
    QuantityBins,
    quantity_bins,
)

__all__ = [
    "build_reference",
    "config_from_card",
    "reference_datasets",
    "write_reference",
]

_PREDICTION_ROWS = 1 << 18  # rows per ONNX Runtime call (bounded memory)


def reference_datasets(
    config: TrainConfig, train: Dataset | None = None
) -> dict[str, tuple[Dataset, bool]]:
    """Per registered city its reference pairs and whether the version trained on them:
    the training data (``train`` when the caller has it, else regenerated from the seed) and,
    for the other cities, as many windows per city from `STREAM_REFERENCE`."""
    if train is None:
        train = build_dataset(
            np.random.default_rng([config.seed, STREAM_TRAIN]),
            config.windows,
            orders_range=config.orders_range,
            riders_range=config.riders_range,
            encoder=config.encoder,
            cities=config.cities,
        )
    out = {city: (train.of_city(city), True) for city in config.cities}
    others = [city for city in default_registry().ids if city not in config.cities]
    if others:
        per_city = max(1, config.windows // len(config.cities))
        held_out = build_dataset(
            np.random.default_rng([config.seed, STREAM_REFERENCE]),
            per_city * len(others),
            orders_range=config.orders_range,
            riders_range=config.riders_range,
            encoder=config.encoder,
            cities=others,
        )
        out.update({city: (held_out.of_city(city), False) for city in others})
    return out


def _predict(model_bytes: bytes, features: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    parts = [
        ort_predict(model_bytes, features[start : start + _PREDICTION_ROWS])
        for start in range(0, features.shape[0], _PREDICTION_ROWS)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, 3), np.float32)


def build_reference(
    datasets: dict[str, tuple[Dataset, bool]], model_bytes: bytes, *, version: int
) -> DriftReference:
    """The reference of one version: its predictions on every city's reference pairs."""
    columns = [i for i, name in enumerate(PAIR_FEATURE_NAMES) if name not in CALENDAR_FEATURES]
    cities: dict[str, CityReference] = {}
    for city, (data, trained) in datasets.items():
        values = np.concatenate(
            [data.features[:, columns], _predict(model_bytes, data.features)], axis=1
        )
        quantities: dict[str, QuantityBins] = {}
        for column, name in enumerate(DRIFT_QUANTITIES):
            bins = quantity_bins(values[:, column])
            if bins is not None:
                quantities[name] = bins
        cities[city] = CityReference(trained=trained, pairs=data.pairs, quantities=quantities)
    return DriftReference(model=SCORING_MODEL, version=version, cities=cities)


def write_reference(out_dir: Path, reference: DriftReference, config: TrainConfig) -> Path:
    """``drift_reference.json`` in ``out_dir``: only what the seed and the code determine."""
    path = out_dir / DRIFT_REFERENCE_FILE
    provenance = {
        "seed": config.seed,
        "training_windows": config.windows,
        "training_cities": list(config.cities),
        "held_out_windows_per_city": max(1, config.windows // len(config.cities)),
    }
    path.write_text(json.dumps(reference.to_dict(**provenance), indent=1) + "\n")
    return path


def config_from_card(version_dir: Path) -> TrainConfig:
    """The data half of the training configuration a version's model_card.json records."""
    card = json.loads((version_dir / "model_card.json").read_text())
    data = card["data"]
    return replace(
        TrainConfig(),
        seed=int(card["seed"]),
        windows=int(data["train_windows"]),
        orders_range=(int(data["orders_range"][0]), int(data["orders_range"][1])),
        riders_range=(int(data["riders_range"][0]), int(data["riders_range"][1])),
        cities=tuple(data["cities"]),
    )
