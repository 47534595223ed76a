"""``--version`` on the launcher and `dispatch-admin` (the client's: tests/unit/client):
the product version, not argparse's abbreviation of a longer option."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pytest

from dispatch_contract.version import product_version
from dispatch_service.ops import admin, server_cli


@pytest.mark.parametrize(
    ("build", "name"),
    [(server_cli.build_parser, "dispatch_service.ops.server"), (admin.build_parser, None)],
)
def test_version_prints_the_product_version(
    build: Callable[[], argparse.ArgumentParser],
    name: str | None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build()
    with pytest.raises(SystemExit) as done:
        parser.parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"{name or parser.prog} {product_version()}\n"
