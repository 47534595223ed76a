"""The floor model is dispatch_fused's contract with no work behind it."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from perf.floor import FLOOR_MODEL, floor_repository


def _config(path: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


def test_the_floor_model_declares_the_fused_contract_and_batching(tmp_path: Path) -> None:
    repository = floor_repository(tmp_path / "repo")
    floor = _config(repository / FLOOR_MODEL / "config.pbtxt")
    fused = _config(repository / "dispatch_fused" / "config.pbtxt")
    assert floor.name == FLOOR_MODEL
    assert list(floor.input) == list(fused.input)
    assert list(floor.output) == list(fused.output)
    assert floor.dynamic_batching == fused.dynamic_batching
    assert floor.max_batch_size == fused.max_batch_size
    assert list(floor.instance_group) == list(fused.instance_group)
    assert not floor.parameters and not floor.model_warmup
    source = (repository / FLOOR_MODEL / "1" / "model.py").read_text()
    compile(source, "model.py", "exec")
    assert "dispatch_service" not in source  # no library, no work
