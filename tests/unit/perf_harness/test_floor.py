"""The floor model is dispatch_fused's contract with no work behind it."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from dispatch_service.core.repository_layout import FUSED_MODEL, model_layout
from perf.floor import FLOOR_MODEL, floor_repository


def _config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_the_floor_model_declares_the_fused_contract_and_batching(tmp_path: Path) -> None:
    repository = floor_repository(tmp_path / "repo")
    floor = _config(model_layout(repository, FLOOR_MODEL).config)
    fused = _config(model_layout(repository, FUSED_MODEL).config)
    assert floor.name == FLOOR_MODEL
    assert list(floor.input) == list(fused.input)
    assert list(floor.output) == list(fused.output)
    assert floor.dynamic_batching == fused.dynamic_batching
    assert floor.max_batch_size == fused.max_batch_size
    assert list(floor.instance_group) == list(fused.instance_group)
    assert not floor.parameters and not floor.model_warmup
    source = model_layout(repository, FLOOR_MODEL).python_model(1).read_text()
    compile(source, "model.py", "exec")
    assert "dispatch_service" not in source  # no library, no work
