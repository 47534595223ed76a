"""The launcher's part in decision records and outcomes (`dispatch_service.outcomes`).

By default `make serve` records every decision into ``.triton/outcomes.sqlite3`` (no set-up)
and serves ``POST /v1/outcomes`` and ``GET /v1/quality`` on its HTTP service (the health
port), behind the outcome key: ``--outcome-key``, else ``DISPATCH_OUTCOME_KEY``, else the
file named by ``DISPATCH_OUTCOME_KEY_FILE``, else ``KEY_DIR/outcome.key`` (created, mode
0600). A fleet names one PostgreSQL database in ``--outcome-store`` on every replica.
``--no-outcomes`` records nothing and serves neither route.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TextIO

from dispatch_contract.keys import read_key
from dispatch_contract.outcomes import OUTCOME_KEY_ENV, OUTCOME_KEY_HEADER
from dispatch_service.ops.keys import OUTCOME_KEY_FILE, load_or_create_key
from dispatch_service.outcomes.service import OutcomeService
from dispatch_service.outcomes.store import (
    DEFAULT_STORE_PATH,
    OUTCOME_STORE_ENV,
    StoreLimits,
    store_address,
)

__all__ = ["add_outcome_arguments", "outcome_service_from_args", "outcome_store_from_args"]

DAY_S = 86_400.0


def add_outcome_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--outcome-store",
        default=os.environ.get(OUTCOME_STORE_ENV) or str(DEFAULT_STORE_PATH),
        help="where decisions and outcomes are kept: an SQLite file, or a postgresql:// URL "
        f"shared by a fleet (env {OUTCOME_STORE_ENV}; default %(default)s)",
    )
    parser.add_argument(
        "--no-outcomes",
        action="store_true",
        help="record no decisions and serve no /v1/outcomes",
    )
    parser.add_argument(
        "--outcome-key",
        default=None,
        help=f"key for /v1/outcomes and /v1/quality (header {OUTCOME_KEY_HEADER!r}; else "
        f"{OUTCOME_KEY_ENV}, else the file named by {OUTCOME_KEY_ENV}_FILE, else "
        f"KEY_DIR/{OUTCOME_KEY_FILE}, created when missing)",
    )
    parser.add_argument(
        "--outcome-retention-days",
        type=float,
        default=StoreLimits().retention_s / DAY_S,
        help="decisions (and their outcomes) older than this are dropped (default %(default)s)",
    )
    parser.add_argument(
        "--outcome-max-decisions",
        type=int,
        default=StoreLimits().max_decisions,
        help="the store keeps at most this many decisions, the newest (default %(default)s)",
    )


def outcome_store_from_args(args: argparse.Namespace) -> str | None:
    """The store the entry points write to (None: --no-outcomes); a file as an absolute
    path, since the stubs do not run in the launcher's working directory."""
    return None if args.no_outcomes else store_address(args.outcome_store)


def outcome_service_from_args(args: argparse.Namespace, out: TextIO) -> OutcomeService | None:
    """The outcome service the launcher mounts (None: --no-outcomes); says where its key is.

    Raises KeyFileError for an unusable key file, ValueError for bad limits."""
    store = outcome_store_from_args(args)
    if store is None:
        return None
    limits = StoreLimits(
        retention_s=args.outcome_retention_days * DAY_S, max_decisions=args.outcome_max_decisions
    )
    key = read_key(args.outcome_key, OUTCOME_KEY_ENV)
    if not key:
        key, created = load_or_create_key(Path(args.key_dir), OUTCOME_KEY_FILE)
        if created is not None:
            print(f"created key file {created} (mode 0600)", file=out)
        print(
            f"outcome key (POST /v1/outcomes at the launcher's health port; header "
            f"{OUTCOME_KEY_HEADER!r}): {Path(args.key_dir) / OUTCOME_KEY_FILE}  "
            f"-> export {OUTCOME_KEY_ENV}_FILE=...",
            file=out,
        )
    return OutcomeService(store, key, limits=limits)
