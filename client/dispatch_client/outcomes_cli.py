"""``dispatch-client report-outcomes``: send outcome records (a JSON file) to the launcher.

    dispatch-client report-outcomes [--url URL] [--key-file FILE] [--timeout S] [FILE|-]

The file holds ``{"outcomes": [...]}`` in the wire format (`dispatch_contract.outcomes`),
or a plain list of records; any number of them (sent as several reports when large). The
key: ``--key-file``, else ``DISPATCH_OUTCOME_KEY``, else the file named by
``DISPATCH_OUTCOME_KEY_FILE``. Prints ``{"stored", "duplicates", "refused"}`` as JSON.

Exit codes: 0 every record stored (or already stored); 2 the input could not be read, or
some records were refused (each named in the output); 1 the server refused the whole
report (a wrong key, the store unavailable) or could not be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Final

from dispatch_client.errors import DispatchConnectionError, DispatchServerError, one_line
from dispatch_client.keys import KeyFileError, read_key_file
from dispatch_client.outcomes import DEFAULT_OUTCOMES_URL, report_outcomes
from dispatch_contract.version import host_port_argument

__all__ = ["REPORT_OUTCOMES_COMMAND", "report_outcomes_main"]

REPORT_OUTCOMES_COMMAND: Final = "report-outcomes"
EXIT_OK: Final = 0
EXIT_SERVER: Final = 1
EXIT_INPUT: Final = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"dispatch-client {REPORT_OUTCOMES_COMMAND}",
        description="Report what became of decided orders (the launcher's POST /v1/outcomes).",
    )
    parser.add_argument(
        "--url",
        default=DEFAULT_OUTCOMES_URL,
        type=host_port_argument,
        help="the launcher's HTTP service (default %(default)s)",
    )
    parser.add_argument("--key-file", type=Path, default=None, help="the outcome key (mode 0600)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per report")
    parser.add_argument("file", nargs="?", default="-", help="JSON records ('-': stdin)")
    return parser


def _records(text: bytes) -> list[Any]:
    document = json.loads(text)
    if isinstance(document, dict) and set(document) == {"outcomes"}:
        document = document["outcomes"]
    if not isinstance(document, list):
        raise ValueError('expected {"outcomes": [...]} or a list of records')
    return document


def report_outcomes_main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    try:
        raw = sys.stdin.buffer.read() if args.file == "-" else Path(args.file).read_bytes()
        records = _records(raw)
        key = None if args.key_file is None else read_key_file(args.key_file)
    except (OSError, ValueError, KeyFileError) as exc:  # JSONDecodeError is a ValueError
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_INPUT
    try:
        receipt = report_outcomes(records, url=args.url, key=key, timeout_s=args.timeout)
    except (DispatchServerError, DispatchConnectionError) as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_SERVER
    print(json.dumps(receipt.to_json_dict(), indent=2))
    return EXIT_INPUT if receipt.refused else EXIT_OK
