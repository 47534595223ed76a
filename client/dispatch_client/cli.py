"""`dispatch-client`: send a window JSON file to the server and print the result JSON.

    dispatch-client [--url URL] [--protocol http|grpc|grpc-shm] [--model NAME] [--timeout S]
                    [FILE|-]

``grpc-shm`` is gRPC with the tensors in system shared memory (server on the same host);
its regions are sized for the window read and released before the command exits, also on
Ctrl-C or SIGTERM.

The result goes to stdout; every failure is one line ``error: ...`` on stderr, so scripts
can log it as is. Exit codes: 0 success, 2 bad input (usage, unreadable file, bad JSON or
field), 1 the server refused the request or could not be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import NoReturn

from dispatch_client.client import DEFAULT_MODEL_NAME, DispatchClient
from dispatch_client.connect import ProtocolName, make_transport
from dispatch_client.errors import DispatchError, WindowJSONError, one_line
from dispatch_client.shm import ShmCapacity
from dispatch_client.transport import DEFAULT_TIMEOUT_S, Transport
from dispatch_client.window_json import window_from_json

__all__ = ["EXIT_INPUT", "EXIT_OK", "EXIT_SERVER", "TransportFactory", "main"]

EXIT_OK = 0
EXIT_SERVER = 1
EXIT_INPUT = 2

TransportFactory = Callable[[ProtocolName, str | None, float], Transport]
"""(protocol, url or None for the protocol's default, timeout in seconds) -> Transport."""


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    # argparse prints usage plus a message and exits; we want one line and a return code.
    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dispatch-client",
        description="Send a dispatch window (JSON) to the Triton 'dispatch' model and print "
        "the Top-K riders and the assignment per order as JSON.",
    )
    parser.add_argument(
        "--url",
        help="server host:port (default localhost:8000 for http, localhost:8001 for grpc "
        "and grpc-shm)",
    )
    parser.add_argument(
        "--protocol",
        choices=("http", "grpc", "grpc-shm"),
        default="http",
        help="grpc-shm: gRPC with tensors in system shared memory, server on this host",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL_NAME, help="model name (%(default)s)")
    parser.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="give up on the server after this long (%(default)g)",
    )
    parser.add_argument(
        "file", nargs="?", default="-", metavar="FILE", help="window JSON file; '-' reads stdin"
    )
    return parser


def _fail(message: str, code: int) -> int:
    print(f"error: {one_line(message)}", file=sys.stderr)
    return code


def _read(path: str) -> bytes:
    if path == "-":
        stream = sys.stdin
        # A real stdin has a byte layer; a test's StringIO does not.
        buffer = getattr(stream, "buffer", None)
        return buffer.read() if buffer is not None else stream.read().encode("utf-8")
    with open(path, "rb") as handle:
        return handle.read()


def main(
    argv: list[str] | None = None, *, transport_factory: TransportFactory | None = None
) -> int:
    """Run the CLI; returns the exit code. `transport_factory` lets tests skip the network."""
    try:
        args = _parser().parse_args(argv)
    except _UsageError as exc:
        return _fail(f"{exc} (see dispatch-client --help)", EXIT_INPUT)
    except SystemExit as exc:  # --help printed its text and asked to exit
        return exc.code if isinstance(exc.code, int) else EXIT_OK

    source = "<stdin>" if args.file == "-" else args.file
    try:
        window = window_from_json(_read(args.file))
    except OSError as exc:
        return _fail(f"cannot read {source}: {exc.strerror or exc}", EXIT_INPUT)
    except WindowJSONError as exc:
        return _fail(f"{source}: {exc}", EXIT_INPUT)

    def default_factory(protocol: ProtocolName, url: str | None, timeout_s: float) -> Transport:
        capacity = ShmCapacity.for_window(window) if protocol == "grpc-shm" else None
        return make_transport(protocol, url, timeout_s=timeout_s, shm_capacity=capacity)

    factory = transport_factory or default_factory
    try:
        transport = factory(args.protocol, args.url, args.timeout)
    except ValueError as exc:  # a malformed --url
        return _fail(f"--url: {exc}", EXIT_INPUT)
    except DispatchError as exc:  # grpc-shm registers its regions up front
        return _fail(exc.message, EXIT_SERVER)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)

    try:
        with DispatchClient(transport, model_name=args.model) as client:
            result = client.dispatch(window)
    except DispatchError as exc:
        return _fail(exc.message, EXIT_SERVER)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as exc:  # the one-line promise holds even for our own bugs
        return _fail(f"unexpected {type(exc).__name__}: {exc}", EXIT_SERVER)

    print(json.dumps(result.to_json_dict(), indent=2))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
