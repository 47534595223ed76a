"""The product version (one source: the repository's VERSION file) and the ``host:port``
rule of every command-line address (dispatch_contract.version)."""

from __future__ import annotations

import argparse
import re
from importlib import metadata
from pathlib import Path

import pytest

from dispatch_contract.version import (
    UrlError,
    add_version_argument,
    host_port_argument,
    product_version,
    split_address,
    split_host_port,
)

ROOT = Path(__file__).resolve().parents[3]


def test_the_changelogs_latest_release_is_the_version_file() -> None:
    """Keep a Changelog: an Unreleased section, then released versions newest first, each
    with its date; the newest is the version the packages and images carry."""
    version = (ROOT / "VERSION").read_text().strip()
    headings = re.findall(
        r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", (ROOT / "CHANGELOG.md").read_text(), re.M
    )
    assert headings[0] == ("Unreleased", "")
    released = headings[1:]
    assert released and all(date for _, date in released)
    assert released[0][0] == version
    numbers = [tuple(int(part) for part in name.split(".")) for name, _ in released]
    assert numbers == sorted(numbers, reverse=True)


def test_the_three_distributions_carry_the_version_file() -> None:
    version = (ROOT / "VERSION").read_text().strip()
    assert version.count(".") == 2 and all(part.isdigit() for part in version.split("."))
    assert product_version() == version
    for distribution in ("dispatch-contract", "dispatch-client", "triton-dispatch"):
        assert metadata.version(distribution) == version
    for linked in ("contract/VERSION", "client/VERSION"):
        assert (ROOT / linked).resolve() == (ROOT / "VERSION").resolve()


def test_version_argument_prints_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="tool")
    add_version_argument(parser)
    parser.add_argument("--version-tag")  # --version is no longer its abbreviation
    with pytest.raises(SystemExit) as done:
        parser.parse_args(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"tool {product_version()}\n"


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:8003", ("127.0.0.1", 8003)),
        ("triton-0.dispatch.svc:8000", ("triton-0.dispatch.svc", 8000)),
        ("[::1]:65535", ("[::1]", 65535)),
        (" localhost:1 ", ("localhost", 1)),
    ],
)
def test_host_port_is_split(address: str, expected: tuple[str, int]) -> None:
    assert split_host_port(address) == expected


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "localhost:", ":8003", "localhost:0", "localhost:65536", "a:b", "h:1/x", ""],
)
def test_anything_else_is_refused_naming_it(address: str) -> None:
    with pytest.raises(UrlError, match="expected host:port") as refused:
        split_host_port(address)
    assert repr(address) in str(refused.value)


@pytest.mark.parametrize("text", ["127.0.0.1:8003", "http://10.0.0.5:8003", "https://a.b:443/"])
def test_the_argument_type_takes_an_address_with_or_without_a_scheme(text: str) -> None:
    assert host_port_argument(text) == text


@pytest.mark.parametrize("text", ["127.0.0.1", "http://127.0.0.1", "ftp://a:1", "a:1/v2"])
def test_the_argument_type_refuses_what_names_no_port(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected host:port"):
        host_port_argument(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("localhost:8000", ("localhost:8000", False)),
        ("HTTP://localhost:8000/", ("localhost:8000", False)),
        ("https://triton.example:443", ("triton.example:443", True)),
    ],
)
def test_an_address_is_split_into_host_port_and_tls(text: str, expected: tuple[str, bool]) -> None:
    assert split_address(text) == expected
