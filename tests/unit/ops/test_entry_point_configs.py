"""dispatch_fused and its priority lane come from one source: the committed files are what
`ops.entry_point_configs` renders, and they differ where the lane is meant to differ only."""

from __future__ import annotations

from pathlib import Path

import pytest

from dispatch_contract import (
    DISPATCH_ENSEMBLE_INPUTS,
    DISPATCH_ENSEMBLE_OUTPUTS,
    PRIORITY_LANE_MODEL_NAME,
)
from dispatch_service.core.model_config import read_model_config
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import FUSED_MODEL, PRIORITY_MODEL, model_layout
from dispatch_service.ops import entry_point_configs
from dispatch_service.ops.entry_point_configs import rendered_files, write_entry_points

RENDERED = rendered_files()


@pytest.mark.parametrize(
    "path", sorted(RENDERED), ids=lambda path: str(path.relative_to(MODEL_REPOSITORY))
)
def test_committed_file_is_what_the_generator_renders(path: Path) -> None:
    assert path.read_text() == RENDERED[path], f"{path} is stale or edited: run make configs"


def test_rendered_configs_parse_and_declare_the_contracts_tensors(tmp_path: Path) -> None:
    """What Triton reads: the contract's tensor names in order (batch dimension left out),
    one config per entry point, each naming its own folder."""
    assert sorted(write_entry_points(tmp_path)) == sorted(rendered_files(tmp_path))
    assert write_entry_points(tmp_path) == []  # nothing changed: nothing written again
    for model in (FUSED_MODEL, PRIORITY_MODEL):
        config = read_model_config(model_layout(tmp_path, model).config)
        assert config.name == model
        assert [t.name for t in config.input] == [s.name for s in DISPATCH_ENSEMBLE_INPUTS]
        assert [t.name for t in config.output] == [s.name for s in DISPATCH_ENSEMBLE_OUTPUTS]
        assert "ORDER_IDS" in config.model_warmup[0].inputs


def test_the_priority_lane_is_dispatch_fused_on_its_own_stubs_at_the_servers_priority() -> None:
    """The lane differs from dispatch_fused only in its name, its instances (one warm and one
    overflow), its stubs' niceness (0, the server's; dispatch_fused's take the default, 10)
    and its level 1 (none): the same tensors, batching, other queues, routing parameters and
    warm-up. Clients name it by the contract's name."""
    assert PRIORITY_LANE_MODEL_NAME == PRIORITY_MODEL
    fused = read_model_config(model_layout(MODEL_REPOSITORY, FUSED_MODEL).config)
    lane = read_model_config(model_layout(MODEL_REPOSITORY, PRIORITY_MODEL).config)
    assert lane.parameters["stub_nice"].string_value == "0"
    assert "stub_nice" not in fused.parameters
    assert [g.count for g in lane.instance_group] == [1, 1]
    assert [g.count for g in fused.instance_group] == [1, 3]
    del lane.parameters["stub_nice"]
    # No level 1 on the lane: a window claiming it is refused by the queue at once.
    no_level_one = lane.dynamic_batching.priority_queue_policy[1]
    assert no_level_one.max_queue_size == 1 and no_level_one.default_timeout_microseconds == 1
    assert not no_level_one.allow_timeout_override
    assert fused.dynamic_batching.priority_queue_policy[1].max_queue_size == 4
    lane.dynamic_batching.priority_queue_policy[1].CopyFrom(
        fused.dynamic_batching.priority_queue_policy[1]
    )
    for config in (fused, lane):
        config.ClearField("name")
        config.ClearField("instance_group")
    assert lane == fused
    fused_warmup = model_layout(MODEL_REPOSITORY, FUSED_MODEL).warmup
    lane_warmup = model_layout(MODEL_REPOSITORY, PRIORITY_MODEL).warmup
    names = sorted(path.name for path in fused_warmup.iterdir())
    assert sorted(path.name for path in lane_warmup.iterdir()) == names
    for name in names:
        assert (lane_warmup / name).read_bytes() == (fused_warmup / name).read_bytes()


def test_main_writes_into_the_repository_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert entry_point_configs.main(["--repository", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(printed) == sorted(str(path) for path in rendered_files(tmp_path))
