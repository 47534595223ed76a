"""Default locations in a source checkout (the editable install); tools take overrides."""

from pathlib import Path

__all__ = [
    "MODEL_REPOSITORY",
    "REPO_ROOT",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
