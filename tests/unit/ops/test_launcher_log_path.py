"""The launcher's default log file (dispatch_service.ops.server_cli.default_log_path): one per
local server, so two replicas on one host never write into one file (they interleaved lines
and NUL bytes in a shared `.triton/server.log`)."""

from __future__ import annotations

from pathlib import Path

from dispatch_service.core.paths import REPO_ROOT
from dispatch_service.ops.server_cli import build_parser, default_log_path


def test_replicas_on_other_ports_log_to_other_files() -> None:
    first, second = default_log_path(8000), default_log_path(9000)
    assert first != second
    assert first == REPO_ROOT / ".triton" / "server-8000.log"
    assert first.parent == second.parent


def test_the_parser_leaves_the_default_to_the_port_and_keeps_an_explicit_log(
    tmp_path: Path,
) -> None:
    assert build_parser().parse_args([]).log is None  # main fills in default_log_path
    chosen = tmp_path / "mine.log"
    assert build_parser().parse_args(["--log", str(chosen)]).log == chosen
