"""Write ``drift_reference.json`` into committed dispatch_model version folders without
retraining (`training.drift_reference`; the training export writes it with the model):

    python -m dispatch_service.offline.training.drift_reference_cli --version 1 --version 2
    python -m dispatch_service.offline.training.drift_reference_cli --version 1 --check

The training windows are regenerated from the version's card (seed, window count and sizes,
cities: the same `build_dataset` stream, checked against the card's pair count).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import (
    DRIFT_REFERENCE_FILE,
    ONNX_FILE,
    SCORING_MODEL,
    model_layout,
)
from dispatch_service.offline.training.config import TrainConfig
from dispatch_service.offline.training.data import Dataset
from dispatch_service.offline.training.drift_reference import (
    build_reference,
    config_from_card,
    reference_datasets,
    write_reference,
)

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch_service.offline.training.drift_reference",
        description="Write drift_reference.json into dispatch_model version folders from "
        "their training data (no retraining).",
    )
    parser.add_argument(
        "--version", type=int, action="append", required=True, help="a version (repeatable)"
    )
    parser.add_argument("--repository", type=Path, default=MODEL_REPOSITORY)
    parser.add_argument(
        "--check",
        action="store_true",
        help="compare with the committed file byte for byte (exit 1 on a difference)",
    )
    args = parser.parse_args(argv)
    layout = model_layout(args.repository, SCORING_MODEL)
    cache: dict[TrainConfig, dict[str, tuple[Dataset, bool]]] = {}
    failed = 0
    for version in args.version:
        folder = layout.version(version)
        if not (folder / ONNX_FILE).is_file():
            parser.error(f"--version {version}: no {ONNX_FILE} in {folder}")
        config = config_from_card(folder)
        if config not in cache:
            cache[config] = reference_datasets(config)
            pairs = sum(data.pairs for data, trained in cache[config].values() if trained)
            card_pairs = json.loads((folder / "model_card.json").read_text())["data"]
            if pairs != card_pairs["train_pairs"]:
                print(
                    f"version {version}: regenerated {pairs} training pairs, the card says "
                    f"{card_pairs['train_pairs']}: not the version's training data",
                    file=sys.stderr,
                )
                return 1
        reference = build_reference(
            cache[config], (folder / ONNX_FILE).read_bytes(), version=version
        )
        if args.check:
            committed = folder / DRIFT_REFERENCE_FILE
            before = committed.read_bytes() if committed.is_file() else b""
            with tempfile.TemporaryDirectory() as scratch:
                fresh = write_reference(Path(scratch), reference, config).read_bytes()
            same = before == fresh
            failed += not same
            print(f"{committed}: {'reproduced byte for byte' if same else 'DIFFERS'}")
            continue
        print(f"wrote {write_reference(folder, reference, config)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
