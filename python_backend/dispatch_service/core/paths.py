"""Default locations in a source checkout (the editable install); tools take overrides."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
