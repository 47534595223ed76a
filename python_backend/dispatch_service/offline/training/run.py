"""One training run end to end: data, fit, ONNX export and checks, files and card."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dispatch_contract import FEATURE_LAYOUT_VERSION, OBJECTIVES, PAIR_FEATURE_NAMES
from dispatch_service.core.paths import REPO_ROOT
from dispatch_service.core.repository_layout import ONNX_FILE
from dispatch_service.domain.cities import default_registry
from dispatch_service.offline.training.card import layout, write_card
from dispatch_service.offline.training.config import (
    LOG_FEATURES,
    STREAM_HOLDOUT,
    STREAM_TRAIN,
    STREAM_VARIANTS,
    TrainConfig,
)
from dispatch_service.offline.training.data import (
    build_dataset,
    build_variant_dataset,
    concatenated,
)
from dispatch_service.offline.training.drift_reference import (
    build_reference,
    reference_datasets,
    write_reference,
)
from dispatch_service.offline.training.export import (
    IR_VERSION,
    OPSET,
    max_relative_difference,
    ort_predict,
    to_onnx,
)
from dispatch_service.offline.training.metrics import holdout_metrics, paired_differences
from dispatch_service.offline.training.mlp import MLP, fit

__all__ = [
    "TrainResult",
    "display_path",
    "train_and_export",
]


@dataclass(frozen=True)
class TrainResult:
    model: MLP
    model_path: Path
    card: dict[str, Any]
    seconds: dict[str, float]  # measured run times: printed, never written into the card


def train_and_export(
    config: TrainConfig,
    out_dir: Path,
    *,
    command: str = "",
    log: bool = False,
    version: int = 1,
    reference: Path | None = None,
) -> TrainResult:
    """Simulate, train, check and write model.onnx, feature_layout.json, the drift reference
    and the card.

    ``reference``: a served version's folder; its model.onnx is scored on the same held-out
    pairs and the card compares the two.
    """
    started = time.perf_counter()
    train = build_dataset(
        np.random.default_rng([config.seed, STREAM_TRAIN]),
        config.windows,
        orders_range=config.orders_range,
        riders_range=config.riders_range,
        encoder=config.encoder,
        cities=config.cities,
    )
    variants = config.map_variants
    fitted_on = train
    if variants.windows:
        fitted_on = concatenated(
            train,
            build_variant_dataset(
                np.random.default_rng([config.seed, STREAM_VARIANTS]),
                variants,
                orders_range=config.orders_range,
                riders_range=config.riders_range,
                encoder=config.encoder,
                cities=config.cities,
            ),
        )
    # Held out: windows of every registered city, those never trained on included.
    holdout = build_dataset(
        np.random.default_rng([config.seed, STREAM_HOLDOUT]),
        config.holdout_windows,
        orders_range=config.orders_range,
        riders_range=config.riders_range,
        encoder=config.encoder,
        cities=default_registry().ids,
    )
    if log:
        print(
            f"data: {fitted_on.pairs} training pairs, {holdout.pairs} held-out pairs "
            f"({time.perf_counter() - started:.1f} s)",
            flush=True,
        )
    model, report = fit(fitted_on, config, log=log)
    onnx_model = to_onnx(model, doc=f"dispatch MLP, seed {config.seed}")
    model_bytes = onnx_model.SerializeToString()
    numpy_out = model.predict(holdout.features)
    ort_out = ort_predict(model_bytes, holdout.features)
    max_diff = max_relative_difference(ort_out, numpy_out)
    if max_diff > 1e-5:
        raise RuntimeError(f"onnxruntime and numpy disagree (max relative diff {max_diff:.3g})")

    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = out_dir / ONNX_FILE
    model_path.write_bytes(model_bytes)
    (out_dir / "feature_layout.json").write_text(
        json.dumps(layout(config.encoder), indent=2) + "\n"
    )
    # The deciles live traffic is compared with (`pipeline.drift`), from the same data.
    drift = build_reference(reference_datasets(config, train), model_bytes, version=version)
    write_reference(out_dir, drift, config)

    card: dict[str, Any] = {
        "model": "dispatch_model",
        "seed": config.seed,
        "command": command,
        "feature_layout_version": FEATURE_LAYOUT_VERSION,
        "features": list(PAIR_FEATURE_NAMES),
        "objectives": list(OBJECTIVES),
        "data": {
            "train_windows": train.windows,
            "train_pairs": train.pairs,
            "holdout_windows": holdout.windows,
            "holdout_pairs": holdout.pairs,
            "orders_range": list(config.orders_range),
            "riders_range": list(config.riders_range),
            "label": "one noisy realisation per pair (simulator.sample_outcome)",
            "cities": list(config.cities),
            **(
                {
                    "map_variant_windows": variants.windows,
                    "map_variant_pairs": fitted_on.pairs - train.pairs,
                    "map_variant_road_circuity": list(variants.road_circuity),
                    "map_variant_speed_scale": list(variants.speed_scale),
                }
                if variants.windows
                else {}
            ),
        },
        "architecture": {
            "layers": [int(model.feature_mean.size), *config.hidden, len(OBJECTIVES)],
            "activation": "relu",
            "parameters": model.parameter_count,
            "epochs": config.epochs,
            "batch_size": config.batch_size,
            "learning_rate": config.learning_rate,
            "final_learning_rate": config.final_learning_rate,
            "final_train_loss": report.final_loss,
            "derived_features": [name for name, _ in LOG_FEATURES] if config.log_features else [],
        },
        "onnx": {
            "opset": OPSET,
            "ir_version": IR_VERSION,
            "bytes": len(model_bytes),
            "max_rel_diff_vs_numpy": max_diff,
        },
        "holdout": holdout_metrics(numpy_out.astype(np.float64), holdout),
        "holdout_by_city": {
            city: {
                "trained": city in config.cities,
                "pairs": holdout.of_city(city).pairs,
                **holdout_metrics(
                    numpy_out[holdout.pair_city == number].astype(np.float64),
                    holdout.of_city(city),
                ),
            }
            for number, city in enumerate(holdout.cities)
            if (holdout.pair_city == number).any()
        },
        "noise_floor": holdout_metrics(holdout.expected, holdout),
    }
    card["version"] = version
    if reference is not None:
        reference_out = ort_predict((reference / ONNX_FILE).read_bytes(), holdout.features)
        card["comparison"] = {
            "reference_label": f"version {reference.name}",
            "reference_model": display_path(reference / ONNX_FILE),
            "holdout": holdout_metrics(reference_out.astype(np.float64), holdout),
            "paired": paired_differences(
                numpy_out.astype(np.float64), reference_out.astype(np.float64), holdout
            ),
        }
    write_card(out_dir, card)
    seconds = {"train": report.seconds, "wall": time.perf_counter() - started}
    return TrainResult(model=model, model_path=model_path, card=card, seconds=seconds)


def display_path(path: Path) -> str:
    """A path relative to the checkout where it lies inside it (cards stay machine-neutral)."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)
