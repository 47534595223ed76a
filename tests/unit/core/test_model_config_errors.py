"""A config.pbtxt that does not parse is reported as one line naming the model, the file and
the place (dispatch_service.core.model_config.ModelConfigError), by the reader, by
`dispatch-admin` and by the launcher before it starts a server on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dispatch_service.core.model_config import (
    ModelConfigError,
    check_repository_configs,
    read_model_config,
)
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import (
    ROUTER_MODEL,
    SCORING_MODEL,
    model_layout,
    models_in,
)
from dispatch_service.ops import admin, server_cli

BROKEN_LINE = "this is { not valid\n"


@pytest.fixture
def broken_repository(tmp_path: Path) -> Path:
    """The committed configs (no model files), dispatch_router's with a line protobuf
    cannot read appended."""
    root = tmp_path / "repo"
    for source in models_in(MODEL_REPOSITORY):
        target = model_layout(root, source.folder.name)
        target.folder.mkdir(parents=True)
        shutil.copy(source.config, target.config)
        if source.profile("gpu").parent.is_dir():
            shutil.copytree(source.profile("gpu").parent, target.profile("gpu").parent)
    config = model_layout(root, ROUTER_MODEL).config
    config.write_text(config.read_text() + BROKEN_LINE)
    return root


def _broken_line_number(repository: Path) -> int:
    return len(model_layout(repository, ROUTER_MODEL).config.read_text().splitlines())


def test_the_reader_names_model_file_line_and_reason(broken_repository: Path) -> None:
    path = model_layout(broken_repository, ROUTER_MODEL).config
    with pytest.raises(ModelConfigError) as caught:
        read_model_config(path)
    line = _broken_line_number(broken_repository)
    assert str(caught.value) == (
        f"model 'dispatch_router': {path} is not a valid model config: line {line}, "
        'column 1: Message type "inference.ModelConfig" has no field named "this".'
    )
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_the_repository_check_reads_what_the_profile_reads(broken_repository: Path) -> None:
    with pytest.raises(ModelConfigError, match="dispatch_router"):
        check_repository_configs(broken_repository, "cpu")
    good = model_layout(broken_repository, ROUTER_MODEL).config
    good.write_text(good.read_text().replace(BROKEN_LINE, ""))
    check_repository_configs(broken_repository, "cpu")  # every file parses
    profile = model_layout(broken_repository, SCORING_MODEL).profile("gpu")
    profile.write_text("max_batch_size: lots\n")
    check_repository_configs(broken_repository, "cpu")  # the cpu profile never reads it
    with pytest.raises(
        ModelConfigError, match=r"^model 'dispatch_model': .*gpu\.pbtxt .*line 1, column 17"
    ):
        check_repository_configs(broken_repository, "gpu")


def test_admin_says_one_line_and_exits_2(
    broken_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    assert admin.main(["keygen", "--out", str(tmp_path / "k"), "--name", "ops"]) == 0
    shutil.copy(tmp_path / "k" / "ops.pub", trusted / "ops.pub")
    capsys.readouterr()
    code = admin.main(["verify", "--trusted-keys", str(trusted), str(broken_repository)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: model 'dispatch_router': "), err


def test_the_launcher_says_one_line_and_starts_nothing(
    broken_repository: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = server_cli.main(
        [
            *("--model-repository", str(broken_repository)),
            *("--key-dir", str(tmp_path / "keys")),
            *("--log", str(tmp_path / "server.log")),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("error: model 'dispatch_router': "), err
    assert not (tmp_path / "server.log").exists()
