"""The committed warmup files are current and are inputs the models accept."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from dispatch_service.core.model_config import read_model_config
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import model_layout
from dispatch_service.ops.warmup import WARMUP_MODELS, raw_bytes, warmup_tensors
from dispatch_service.pipeline.dispatch_pipeline import DispatchPipeline


def test_committed_warmup_files_match_a_fresh_generation() -> None:
    for model, tensors in warmup_tensors().items():
        for name, array in tensors.items():
            path = model_layout(MODEL_REPOSITORY, model).warmup / name
            assert path.read_bytes() == raw_bytes(array), f"{path} is stale: run make warmup"


def test_configs_declare_every_warmup_file_with_its_shape() -> None:
    for model, tensors in warmup_tensors().items():
        config = read_model_config(model_layout(MODEL_REPOSITORY, model).config)
        (sample,) = config.model_warmup
        assert sample.batch_size == 1  # 0 makes Triton skip the sample
        declared = {name: tuple(spec.dims) for name, spec in sample.inputs.items()}
        assert declared == {name: array.shape for name, array in tensors.items()}
        for name, spec in sample.inputs.items():
            assert spec.input_data_file == name


def test_warmup_inputs_are_served_by_the_steps_without_error() -> None:
    tensors = warmup_tensors()
    pipeline = DispatchPipeline.from_repository()
    encoded = pipeline.encoder.run(tensors["feature_encoder"])
    assert encoded["PAIR_FEATURES"].shape[0] > 0
    resolved = pipeline.resolver.run(tensors["topk_resolver"])
    assert (resolved["ASSIGNED_RIDER_INDEX"] >= 0).any()
    assert set(tensors) == set(WARMUP_MODELS)


def test_raw_bytes_uses_tritons_length_prefixed_layout(tmp_path: Path) -> None:
    ids = np.array([b"ab", b"", "c"], dtype=object)
    assert (
        raw_bytes(ids)
        == struct.pack("<I", 2) + b"ab" + struct.pack("<I", 0) + struct.pack("<I", 1) + b"c"
    )
    numbers = np.array([[1.5, 2.0]], dtype=np.float64)
    assert raw_bytes(numbers) == numbers.tobytes()
