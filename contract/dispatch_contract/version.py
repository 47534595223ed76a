"""The product's version and the ``host:port`` rule that every command-line tool applies to
its ``--url`` (the contract is the one package that the server, the client and the admin
tools all install).

The version has one source, the repository's ``VERSION`` file: the three distributions read
it at build time (``[tool.setuptools.dynamic]``) and the images are tagged with it, so the
installed distribution's metadata is what this module reports.
"""

from __future__ import annotations

import argparse
import re
from functools import cache
from importlib import metadata
from typing import Final

__all__ = [
    "DISTRIBUTION",
    "URL_SCHEMES",
    "UrlError",
    "add_version_argument",
    "host_port_argument",
    "product_version",
    "split_address",
    "split_host_port",
]

DISTRIBUTION: Final = "dispatch-contract"
URL_SCHEMES: Final = ("http://", "https://")
# A host (a name, IPv4, or [IPv6]), ":" and a port: what every --url and --replica is.
_HOST_PORT: Final = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})")


@cache
def product_version() -> str:
    """The installed version (``0+unknown`` where the distribution is not installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


def add_version_argument(parser: argparse.ArgumentParser, name: str = "%(prog)s") -> None:
    """``--version``: print ``name`` and the product version and exit (also keeps argparse
    from reading ``--version`` as an abbreviation of a longer option)."""
    parser.add_argument("--version", action="version", version=f"{name} {product_version()}")


class UrlError(ValueError):
    """An address that is not ``host:port``."""


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); anything else (no port, as in ``127.0.0.1``, a port
    outside 1-65535, a scheme or a path) raises `UrlError`."""
    match = _HOST_PORT.fullmatch(address.strip())
    port = 0 if match is None else int(match.group("port"))
    if match is None or not 0 < port < 65536:
        raise UrlError(f"expected host:port with a port in 1-65535, got {address!r}")
    return match.group("host"), port


def split_address(text: str) -> tuple[str, bool]:
    """``host:port``, ``http://host:port`` (the same) or ``https://host:port`` -> (host:port,
    TLS?); a trailing slash is dropped; anything else raises `UrlError`."""
    address, tls = text.strip(), False
    for scheme in URL_SCHEMES:
        if address.lower().startswith(scheme):
            address, tls = address[len(scheme) :].rstrip("/"), scheme == "https://"
            break
    split_host_port(address)
    return address, tls


def host_port_argument(text: str) -> str:
    """An argparse ``type`` for an address option (`split_address`'s forms), kept as given;
    anything else is a usage error naming the rule (exit 2)."""
    try:
        split_address(text)
    except UrlError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
