"""`dispatch-client`: send a window JSON file to the server and print the result JSON.

    dispatch-client [--url URL] [--protocol http|grpc|grpc-shm] [--model NAME] [--timeout S]
                    [--weights L,O,C] [--version-tag TAG] [--request-id ID]
                    [--deadline-ms MS] [--priority LEVEL] [--priority-map FILE]
                    [--priority-lane MODEL] [--retries N] [FILE|-]
    dispatch-client --version
    dispatch-client report-outcomes [--url URL] [--key-file FILE] [FILE|-]   (`outcomes_cli`)

``--url`` takes ``host:port``, ``http://host:port`` (the same) or ``https://host:port``
(TLS; the server's certificate is checked against the system's CA roots); the port is
required (``127.0.0.1`` alone is refused, exit 2). ``grpc-shm`` is
gRPC with the tensors in system shared memory (server on the same host, no TLS); its regions
are sized for the window read and released before the command exits, also on Ctrl-C or
SIGTERM. Registering them needs the server's shared-memory key: the environment variable
``DISPATCH_SHM_KEY``, or ``DISPATCH_SHM_KEY_FILE`` naming a file (mode 0600) that holds it
(`make serve` prints where it wrote one).

Every optional input of the contract can be sent: in the document (``objective_weights``,
``model_version_tag``; see `window_json`) or with an option, which wins over the document.
Options for the deadline and priority inputs join `OPTIONAL_INPUT_OPTIONS` once the
contract has them.

Each request carries a request id (Triton's request ``id``): ``--request-id`` or a fresh
one. The server's rejection log lines carry it, and an error line ends with it. A refusal
without work (queue full, deadline expired, no connection) is sent again under the same id
after a jittered backoff, ``--retries`` times (`dispatch_client.retry`); the error line then
says how many times it was sent.

The result goes to stdout; every failure is one line ``error: ...`` on stderr, so scripts
can log it as is. Exit codes, one rule whoever finds the fault:

- 0 success;
- 2 the input is invalid: usage, an unreadable file, bad JSON or a bad field found here, or
  a request the server refused as invalid (HTTP 400, gRPC INVALID_ARGUMENT, e.g. a latitude
  of 95); sending it again will fail again;
- 1 the server failed or could not be reached (unknown or unloaded model, internal error,
  queue full, timeout, connection refused); the same input may succeed later.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NoReturn

from dispatch_client.client import DEFAULT_MODEL_NAME, DispatchClient
from dispatch_client.connect import ProtocolName, make_transport
from dispatch_client.errors import DispatchError, DispatchServerError, WindowJSONError, one_line
from dispatch_client.keys import KeyFileError, read_key_file
from dispatch_client.outcomes_cli import REPORT_OUTCOMES_COMMAND, report_outcomes_main
from dispatch_client.priority import PriorityMap, check_deadline_ms, check_priority
from dispatch_client.retry import DEFAULT_RETRY, MAX_ATTEMPTS
from dispatch_client.shm import ShmCapacity
from dispatch_client.transport import (
    DEFAULT_GRPC_URL,
    DEFAULT_HTTP_URL,
    DEFAULT_TIMEOUT_S,
    Transport,
)
from dispatch_client.window_json import window_document, window_from_dict
from dispatch_contract import DEFAULT_OBJECTIVE_WEIGHTS, PRIORITY_LANE_MODEL_NAME
from dispatch_contract.version import add_version_argument

__all__ = [
    "EXIT_INPUT",
    "EXIT_OK",
    "EXIT_SERVER",
    "OPTIONAL_INPUT_OPTIONS",
    "InputOption",
    "TransportFactory",
    "exit_code_for",
    "main",
]

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


def _numbers(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated numbers, got {text!r}") from None


def _request_id(text: str) -> str:
    if not text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(f"must be printable, non-empty text, got {text!r}")
    return text


@dataclass(frozen=True)
class InputOption:
    """A command-line option that sets one optional top-level key of the window document."""

    flag: str
    key: str  # the window document's key (`window_json.OPTIONAL_INPUT_KEYS`)
    metavar: str
    help: str
    convert: Callable[[str], Any]


OPTIONAL_INPUT_OPTIONS: tuple[InputOption, ...] = (
    InputOption(
        "--weights",
        "objective_weights",
        "L,O,C",
        "objective weights latency,on-time,cost, e.g. 0.45,0.35,0.2 (default: the document's "
        f"objective_weights, else the server's {','.join(map(str, DEFAULT_OBJECTIVE_WEIGHTS))})",
        _numbers,
    ),
    InputOption(
        "--version-tag",
        "model_version_tag",
        "TAG",
        "force the dispatch_model version: stable, canary or a version number (default: the "
        "document's model_version_tag, else the router picks per user)",
        str,
    ),
    # Deadline and priority are request options, not window tensors: --deadline-ms,
    # --priority and --priority-map below.
)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dispatch-client",
        description="Send a dispatch window (JSON) to the Triton 'dispatch' model and print "
        "the Top-K riders and the assignment per order as JSON.",
        epilog="Exit codes: 0 success; 2 invalid input, found here or refused by the server "
        "as invalid (HTTP 400, gRPC INVALID_ARGUMENT); 1 the server failed or could not be "
        "reached. Errors are one line on stderr, ending with the request id once sent.",
    )
    add_version_argument(parser)
    parser.add_argument(
        "--url",
        help=f"server host:port, http://host:port or https://host:port (TLS, certificate "
        f"checked against the system's CA roots) (default: {DEFAULT_HTTP_URL} for http, "
        f"{DEFAULT_GRPC_URL} for grpc and grpc-shm)",
    )
    parser.add_argument(
        "--protocol",
        choices=("http", "grpc", "grpc-shm"),
        default="http",
        help="grpc-shm: gRPC with tensors in system shared memory, server on this host "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL_NAME,
        help="entry point: dispatch or dispatch_fused; level-1 windows go to --priority-lane "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="give up on the server after this long (default: %(default)g)",
    )
    for option in OPTIONAL_INPUT_OPTIONS:
        parser.add_argument(
            option.flag,
            type=option.convert,
            metavar=option.metavar,
            help=option.help,
            dest=option.key,
        )
    parser.add_argument(
        "--request-id",
        type=_request_id,
        metavar="ID",
        help="request id sent to the server (default: a fresh 32-hex-digit id)",
    )
    parser.add_argument(
        "--deadline-ms",
        type=float,
        metavar="MS",
        help="longest the window may wait in the server's queue before it is refused "
        "(0 < MS <= 60000; default: the model's own timeout)",
    )
    parser.add_argument(
        "--priority",
        type=int,
        metavar="LEVEL",
        help="1 priority orders / premium, 2 standard, 3 bulk re-dispatch "
        "(default: from --priority-map, else the model's default 2)",
    )
    parser.add_argument(
        "--priority-map",
        metavar="FILE",
        help='tenant-to-level JSON, e.g. {"default": 2, "tenants": {"premium-co": 1}}',
    )
    parser.add_argument(
        "--priority-lane",
        default=PRIORITY_LANE_MODEL_NAME,
        metavar="MODEL",
        help="where a level-1 window goes instead of --model ('' for --model; "
        "default: %(default)s)",
    )
    parser.add_argument(
        "--priority-key-file",
        metavar="FILE",
        help="the server's priority key (mode 0600), which level 1 needs (else "
        "$DISPATCH_PRIORITY_KEY, else the file named by $DISPATCH_PRIORITY_KEY_FILE; "
        "without it a level-1 window goes out at level 2)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=DEFAULT_RETRY.attempts - 1,
        metavar="N",
        help="times a refusal without work (queue full, deadline expired, no connection) is "
        f"sent again after a jittered backoff, 0..{MAX_ATTEMPTS - 1} "
        f"(default: {DEFAULT_RETRY.attempts - 1})",
    )
    parser.add_argument(
        "file",
        nargs="?",
        default="-",
        metavar="FILE",
        help="window JSON file; '-' reads stdin (default: -)",
    )
    return parser


def exit_code_for(error: DispatchError) -> int:
    """2 when the server refused the input as invalid, 1 for any other server failure."""
    if isinstance(error, DispatchServerError) and error.invalid_input:
        return EXIT_INPUT
    return EXIT_SERVER


def _fail(message: str, code: int, request_id: str | None = None) -> int:
    suffix = f" (request id {request_id})" if request_id else ""
    print(f"error: {one_line(message)}{suffix}", file=sys.stderr)
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
    """Run the CLI; returns the exit code. `transport_factory` lets tests skip the network.
    ``dispatch-client report-outcomes ...`` is `outcomes_cli`'s."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [REPORT_OUTCOMES_COMMAND]:
        return report_outcomes_main(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except _UsageError as exc:
        return _fail(f"{exc} (see dispatch-client --help)", EXIT_INPUT)
    except SystemExit as exc:  # --help printed its text and asked to exit
        return exc.code if isinstance(exc.code, int) else EXIT_OK

    try:
        deadline_ms = check_deadline_ms(args.deadline_ms)
        priority = None if args.priority is None else check_priority(args.priority)
        priorities = None if args.priority_map is None else PriorityMap.from_file(args.priority_map)
    except ValueError as exc:
        option = "--deadline-ms" if "deadline" in str(exc) else "--priority"
        if args.priority_map is not None and str(exc).startswith("priority map"):
            option = "--priority-map"
        return _fail(f"{option}: {exc}", EXIT_INPUT)
    if not 0 <= args.retries < MAX_ATTEMPTS:  # RetryPolicy's own bound, counted in retries
        return _fail(
            f"--retries: must be within 0..{MAX_ATTEMPTS - 1}, got {args.retries}", EXIT_INPUT
        )
    retry = replace(DEFAULT_RETRY, attempts=args.retries + 1)

    source = "<stdin>" if args.file == "-" else args.file
    given = {o.key: o.flag for o in OPTIONAL_INPUT_OPTIONS if getattr(args, o.key) is not None}
    try:
        document = window_document(_read(args.file))
        if isinstance(document, dict):
            document.update({key: getattr(args, key) for key in given})
        window = window_from_dict(document)
    except OSError as exc:
        return _fail(f"cannot read {source}: {exc.strerror or exc}", EXIT_INPUT)
    except WindowJSONError as exc:
        key = exc.path.split("[")[0].split(".")[0]
        return _fail(f"{given.get(key, source)}: {exc}", EXIT_INPUT)

    def default_factory(protocol: ProtocolName, url: str | None, timeout_s: float) -> Transport:
        capacity = ShmCapacity.for_window(window) if protocol == "grpc-shm" else None
        return make_transport(protocol, url, timeout_s=timeout_s, shm_capacity=capacity)

    try:
        priority_key = (
            None if args.priority_key_file is None else read_key_file(Path(args.priority_key_file))
        )
    except KeyFileError as exc:
        return _fail(f"--priority-key-file: {exc}", EXIT_INPUT)
    factory = transport_factory or default_factory
    try:
        transport = factory(args.protocol, args.url, args.timeout)
    except KeyFileError as exc:  # DISPATCH_SHM_KEY_FILE names a file that cannot be used
        return _fail(str(exc), EXIT_INPUT)
    except ValueError as exc:  # a malformed --url
        return _fail(f"--url: {exc}", EXIT_INPUT)
    except DispatchError as exc:  # grpc-shm registers its regions up front
        return _fail(exc.message, exit_code_for(exc))
    except KeyboardInterrupt:
        return _fail("interrupted", 130)

    try:
        with DispatchClient(
            transport,
            model_name=args.model,
            deadline_ms=deadline_ms,
            priority=priority,
            priorities=priorities,
            retry=retry,
            priority_lane=args.priority_lane or None,
            priority_key=priority_key,
        ) as client:
            result = client.dispatch(window, request_id=args.request_id)
    except DispatchError as exc:
        tries = f" (sent {exc.attempts} times)" if exc.attempts > 1 else ""
        return _fail(exc.message + tries, exit_code_for(exc), exc.request_id)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as exc:  # the one-line promise holds even for our own bugs
        return _fail(f"unexpected {type(exc).__name__}: {exc}", EXIT_SERVER)

    print(json.dumps(result.to_json_dict(), indent=2))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
