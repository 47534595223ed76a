"""The drift reference a version ships: built from its training data, per registered city,
covered by the version's signature."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import (
    DRIFT_REFERENCE_FILE,
    ONNX_FILE,
    SCORING_MODEL,
    model_layout,
)
from dispatch_service.core.signing import SigningError, TrustedKeys, sign_version
from dispatch_service.domain.cities import default_registry
from dispatch_service.offline.training.config import TrainConfig
from dispatch_service.offline.training.data import Dataset
from dispatch_service.offline.training.drift_reference import (
    build_reference,
    config_from_card,
    reference_datasets,
    write_reference,
)
from dispatch_service.pipeline.drift import DRIFT_QUANTITIES, read_reference

TINY = TrainConfig(seed=3, windows=6)
COMMITTED = model_layout(MODEL_REPOSITORY, SCORING_MODEL)


@pytest.fixture(scope="module")
def tiny_datasets() -> dict[str, tuple[Dataset, bool]]:
    return reference_datasets(TINY)


def test_every_registered_city_gets_deciles_of_its_pairs_and_predictions(
    tmp_path: Path, tiny_datasets: dict[str, tuple[Dataset, bool]]
) -> None:
    model = (COMMITTED.version(1) / ONNX_FILE).read_bytes()
    reference = build_reference(tiny_datasets, model, version=1)
    assert set(reference.cities) == set(default_registry().ids)
    for city, ref in reference.cities.items():
        assert ref.trained == (city in TINY.cities)
        data, _ = tiny_datasets[city]
        assert ref.pairs == data.pairs
        assert set(ref.quantities) <= set(DRIFT_QUANTITIES)
        assert {"pickup_distance_km", "eta_minutes", "ontime_probability"} <= set(ref.quantities)
        for bins in ref.quantities.values():
            assert sum(bins.shares) == pytest.approx(1.0, abs=1e-4)
    # The pickup distance column's own deciles, computed here with numpy.
    data, _ = tiny_datasets["shanghai"]
    column = data.features[:, 0].astype(np.float64)
    expected = sorted({float(f"{q:.6g}") for q in np.quantile(column, np.arange(1, 10) / 10)})
    assert list(reference.cities["shanghai"].quantities["pickup_distance_km"].edges) == expected
    # Written and read back: the same reference; the same data twice, the same bytes.
    first = write_reference(tmp_path, reference, TINY).read_bytes()
    assert read_reference(tmp_path) == reference
    again = build_reference(reference_datasets(TINY), model, version=1)
    assert write_reference(tmp_path, again, TINY).read_bytes() == first


@pytest.mark.parametrize("version", [1, 2])
def test_the_committed_references_come_from_the_versions_training_data(version: int) -> None:
    folder = COMMITTED.version(version)
    reference = read_reference(folder)
    card = json.loads((folder / "model_card.json").read_text())
    config = config_from_card(folder)
    assert reference.version == version
    assert set(reference.cities) == set(default_registry().ids)
    trained = {city for city, ref in reference.cities.items() if ref.trained}
    assert trained == set(card["data"]["cities"]) == set(config.cities)
    # The trained cities' pairs are the card's training pairs, every one of them.
    assert sum(reference.cities[city].pairs for city in trained) == card["data"]["train_pairs"]


def test_the_reference_is_signed_with_its_version(tmp_path: Path) -> None:
    folder = tmp_path / "1"
    shutil.copytree(COMMITTED.version(1), folder, ignore=shutil.ignore_patterns("__pycache__"))
    key = Ed25519PrivateKey.generate()
    manifest = sign_version(folder, key)
    assert DRIFT_REFERENCE_FILE in manifest.files
    trusted = TrustedKeys.from_public_keys(key.public_key())
    assert read_reference(folder, trusted).version == 1
    with (folder / DRIFT_REFERENCE_FILE).open("a") as changed:
        changed.write(" ")
    with pytest.raises(SigningError, match=r"drift_reference\.json"):
        read_reference(folder, trusted)
