"""ONNX Runtime on the CPU for the `cpu` profile's dispatch_model (Python backend).

The `gpu` profile runs the same file in Triton's native onnxruntime backend instead. Where
that backend is missing (the embedded Triton), `execution_provider: "cuda"` runs ONNX
Runtime's CUDA EP inside this Python-backend model (needs onnxruntime-gpu); it never falls
back to the CPU quietly: a session that did not get the CUDA EP fails the model load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
from numpy.typing import NDArray

from dispatch_contract import MODEL_INPUTS, MODEL_OUTPUTS, NUM_PAIR_FEATURES
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.core.repository_layout import ONNX_FILE
from dispatch_service.core.signing import TrustedKeys, read_verified

__all__ = [
    "MODEL_FILE",
    "OnnxScorer",
    "OrtSettings",
    "check_providers",
    "execution_providers",
    "session_options",
    "version_scorer",
]

MODEL_FILE = ONNX_FILE

_OPT_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True)
class OrtSettings:
    """Thread counts are explicit: each Triton instance is its own process, and on a small
    host several processes share the cores, so one intra-op thread avoids oversubscription."""

    intra_op_num_threads: int = 1
    inter_op_num_threads: int = 1
    graph_optimization_level: str = "all"
    execution_provider: str = "cpu"  # or "cuda" (onnxruntime-gpu, CUDA EP, no CPU fallback)
    cuda_device_id: int = 0  # set from a KIND_GPU instance's device by the adapter

    def __post_init__(self) -> None:
        if self.graph_optimization_level not in _OPT_LEVELS:
            raise ValueError(
                f"graph_optimization_level must be one of {', '.join(_OPT_LEVELS)}, "
                f"got {self.graph_optimization_level!r}"
            )
        if self.intra_op_num_threads < 0 or self.inter_op_num_threads < 0:
            raise ValueError("thread counts must be >= 0 (0 lets ONNX Runtime choose)")
        if self.execution_provider not in _PROVIDERS:
            raise ValueError(
                f"execution_provider must be one of {', '.join(_PROVIDERS)}, "
                f"got {self.execution_provider!r}"
            )
        if self.cuda_device_id < 0:
            raise ValueError("cuda_device_id must be >= 0")


_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def execution_providers(settings: OrtSettings) -> list[str | tuple[str, dict[str, str]]]:
    """The providers to ask for; for CUDA a grow-as-needed arena (no power-of-two jumps).

    Raises RuntimeError when this onnxruntime build lacks the provider (CPU-only wheel).
    """
    wanted = _PROVIDERS[settings.execution_provider]
    available = ort.get_available_providers()
    if wanted not in available:
        raise RuntimeError(
            f"execution_provider {settings.execution_provider!r} needs {wanted}, which this "
            f"onnxruntime lacks (available: {', '.join(available)}); install onnxruntime-gpu"
        )
    if settings.execution_provider == "cpu":
        return [wanted]
    options = {
        "device_id": str(settings.cuda_device_id),
        "arena_extend_strategy": "kSameAsRequested",
    }
    return [(wanted, options)]


def check_providers(session: ort.InferenceSession, settings: OrtSettings) -> None:
    """Fail when ONNX Runtime quietly dropped the requested provider (e.g. CUDA libs missing)."""
    wanted = _PROVIDERS[settings.execution_provider]
    active = session.get_providers()
    if not active or active[0] != wanted:
        raise RuntimeError(
            f"ONNX Runtime did not enable {wanted} (active: {', '.join(active)}); "
            "refusing to run on another device"
        )


def session_options(settings: OrtSettings) -> ort.SessionOptions:
    """The ONNX Runtime session options the served model runs with (also used to profile it)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_num_threads
    options.inter_op_num_threads = settings.inter_op_num_threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = _OPT_LEVELS[settings.graph_optimization_level]
    return options


class OnnxScorer:
    """Scores pair features with one ONNX model file; checks the file against the contract."""

    def __init__(
        self,
        model_path: str | Path,
        settings: OrtSettings | None = None,
        model_bytes: bytes | None = None,
    ) -> None:
        """``model_bytes``: the file's content, already read and verified (`signing`); the
        session is built from them, so what runs is what was verified. ``model_path`` then
        only names the model in errors."""
        settings = settings or OrtSettings()
        options = session_options(settings)
        self.session = ort.InferenceSession(
            str(model_path) if model_bytes is None else model_bytes,
            sess_options=options,
            providers=execution_providers(settings),
        )
        check_providers(self.session, settings)
        inputs = self.session.get_inputs()
        outputs = self.session.get_outputs()
        expected_in, expected_out = MODEL_INPUTS[0], MODEL_OUTPUTS[0]
        if [i.name for i in inputs] != [expected_in.name] or list(inputs[0].shape[1:]) != [
            NUM_PAIR_FEATURES
        ]:
            raise ValueError(
                f"{model_path}: expected one input {expected_in.name} [batch, {NUM_PAIR_FEATURES}],"
                f" found {[(i.name, i.shape) for i in inputs]}"
            )
        width = expected_out.dims[1]
        if [o.name for o in outputs] != [expected_out.name] or list(outputs[0].shape[1:]) != [
            width
        ]:
            raise ValueError(
                f"{model_path}: expected one output {expected_out.name} [batch, {width}], "
                f"found {[(o.name, o.shape) for o in outputs]}"
            )
        if inputs[0].type != "tensor(float)" or outputs[0].type != "tensor(float)":
            raise ValueError(f"{model_path}: input and output must be float32 tensors")

    def check(self, pair_features: NDArray[np.float32]) -> None:
        """Reject features the model cannot score, naming the tensor and the rule."""
        if pair_features.ndim != 2 or pair_features.shape[1] != NUM_PAIR_FEATURES:
            raise DispatchInputError(
                "PAIR_FEATURES",
                f"must have shape [*, {NUM_PAIR_FEATURES}], got {pair_features.shape}",
                "shape",
            )
        if pair_features.dtype != np.float32:
            raise DispatchInputError(
                "PAIR_FEATURES", f"must be FP32, got {pair_features.dtype}", "dtype"
            )
        if not np.isfinite(pair_features).all():
            raise DispatchInputError(
                "PAIR_FEATURES", "must be finite, got NaN or infinity", "not_finite"
            )

    def score(self, pair_features: NDArray[np.float32]) -> NDArray[np.float32]:
        """[P, F] features -> [P, 3] objectives (ETA minutes, on-time probability, cost)."""
        self.check(pair_features)
        return self.infer(pair_features)

    def infer(self, pair_features: NDArray[np.float32]) -> NDArray[np.float32]:
        """`score` without the checks, for features already checked."""
        if pair_features.shape[0] == 0:
            return np.zeros((0, MODEL_OUTPUTS[0].dims[1]), dtype=np.float32)
        result = self.session.run([MODEL_OUTPUTS[0].name], {MODEL_INPUTS[0].name: pair_features})[0]
        return np.asarray(result, dtype=np.float32)


def version_scorer(
    version_dir: Path, settings: OrtSettings | None = None, trusted: TrustedKeys | None = None
) -> OnnxScorer:
    """A version folder's model.onnx as a scorer.

    With ``trusted`` keys (verification configured), the folder must verify and the session
    is built from the verified bytes; a refusal raises SigningError. Every model that reads
    these files loads them here, so no load path (a plain repository load included) runs
    weights that did not verify.
    """
    path = version_dir / MODEL_FILE
    if trusted is None:
        return OnnxScorer(path, settings)
    return OnnxScorer(path, settings, read_verified(version_dir, MODEL_FILE, trusted))
