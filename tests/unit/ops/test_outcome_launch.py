"""The launcher's outcome options: the store handed to the stubs, the outcome key (created
private in the key folder, never printed), the limits, and --no-outcomes."""

from __future__ import annotations

import argparse
import io
import stat
from pathlib import Path

import pytest

from dispatch_contract.outcomes import OUTCOME_KEY_ENV
from dispatch_service.ops.keys import OUTCOME_KEY_FILE, AccessKeys
from dispatch_service.ops.outcome_launch import outcome_service_from_args, outcome_store_from_args
from dispatch_service.ops.server_cli import build_parser, options_from_args


def args_for(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def test_the_key_is_created_private_and_only_its_path_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(OUTCOME_KEY_ENV, raising=False)
    monkeypatch.delenv(f"{OUTCOME_KEY_ENV}_FILE", raising=False)
    args = args_for("--key-dir", str(tmp_path / "keys"), "--outcome-store", str(tmp_path / "o.db"))
    out = io.StringIO()
    service = outcome_service_from_args(args, out)
    assert service is not None
    key_file = tmp_path / "keys" / OUTCOME_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    key = key_file.read_text().strip()
    assert str(key_file) in out.getvalue() and key not in out.getvalue()
    again = outcome_service_from_args(args, io.StringIO())  # the same key next time
    assert again is not None and again._key == key.encode()


def test_a_given_key_and_limits(tmp_path: Path) -> None:
    args = args_for(
        "--key-dir", str(tmp_path / "keys"), "--outcome-key", "given-key",
        "--outcome-retention-days", "2", "--outcome-max-decisions", "500",
    )  # fmt: skip
    service = outcome_service_from_args(args, io.StringIO())
    assert service is not None
    assert service.limits.retention_s == 2 * 86_400 and service.limits.max_decisions == 500
    assert not (tmp_path / "keys" / OUTCOME_KEY_FILE).exists()


def test_bad_limits_are_refused(tmp_path: Path) -> None:
    args = args_for(
        "--key-dir", str(tmp_path), "--outcome-key", "k", "--outcome-max-decisions", "0"
    )
    with pytest.raises(ValueError, match="max_decisions"):
        outcome_service_from_args(args, io.StringIO())


def test_the_stubs_get_an_absolute_store_or_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert outcome_store_from_args(args_for("--outcome-store", "o.sqlite3")) == str(
        tmp_path / "o.sqlite3"
    )
    url = "postgresql://dispatch@db:5432/outcomes"
    assert outcome_store_from_args(args_for("--outcome-store", url)) == url
    assert outcome_store_from_args(args_for("--no-outcomes")) is None
    assert outcome_service_from_args(args_for("--no-outcomes"), io.StringIO()) is None
    options = options_from_args(args_for("--outcome-store", url), AccessKeys())
    assert options.outcome_store == url
