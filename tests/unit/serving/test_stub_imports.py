"""What a step model's stub imports: its own step's modules, not the other steps'.

Every stub pays its imports at each server start and restart, so a step's `model.py` plus
the step its adapter loads must leave the other steps' heavy dependencies unloaded (SciPy's
graph matching, geocoding, shapely, ONNX Runtime, the fused pipeline).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import model_layout

# In a fresh interpreter: Triton's `triton_python_backend_utils` stood in by an empty module
# (the adapters only use it in `initialize`), the model's `model.py` imported as the stub
# does, then the step module its adapter's `from_triton` imports; prints which of the
# named modules are loaded.
PROBE = """
import importlib, importlib.util, json, sys, types
model_py, step_module, watched = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
spec = importlib.util.spec_from_file_location("model", model_py)
spec.loader.exec_module(importlib.util.module_from_spec(spec))
importlib.import_module(step_module)
print(json.dumps(sorted(name for name in watched if name in sys.modules)))
"""

ENCODER_STEP = "dispatch_service.pipeline.encoder_step"
RESOLVER_STEP = "dispatch_service.pipeline.resolver_step"
MODEL_STEP = "dispatch_service.pipeline.model_step"
FUSED = "dispatch_service.pipeline.fused"
GEOCODING = "dispatch_service.geocoding.chain"


def loaded_by_stub(model: str, step_module: str, watched: list[str]) -> list[str]:
    """Which of ``watched`` the model's stub has loaded once its step module is imported."""
    model_py = model_layout(MODEL_REPOSITORY, model).python_model(1)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(model_py), step_module, json.dumps(watched)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize(
    ("model", "step_module", "needed", "not_needed"),
    [
        (
            "feature_encoder",
            ENCODER_STEP,
            [GEOCODING, "scipy.sparse.csgraph", "shapely"],
            ["onnxruntime", RESOLVER_STEP, MODEL_STEP, FUSED],
        ),
        (
            "topk_resolver",
            RESOLVER_STEP,
            ["scipy.sparse.csgraph"],
            ["onnxruntime", "shapely", GEOCODING, ENCODER_STEP, MODEL_STEP, FUSED],
        ),
        (
            "dispatch_model",
            MODEL_STEP,
            ["onnxruntime"],
            ["scipy", "shapely", GEOCODING, ENCODER_STEP, RESOLVER_STEP, FUSED],
        ),
    ],
)
def test_a_step_stub_loads_its_own_steps_modules_only(
    model: str, step_module: str, needed: list[str], not_needed: list[str]
) -> None:
    assert loaded_by_stub(model, step_module, needed + not_needed) == sorted(needed)
