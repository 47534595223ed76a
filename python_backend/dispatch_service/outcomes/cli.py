"""``dispatch-admin quality``: the live quality figures (`quality`) read from the store.

    dispatch-admin quality [--store PATH|URL] [--hours H] [--json]

Reads the decisions with an outcome received in the last ``--hours`` (default 24) straight
from the store (the launcher's SQLite file, or the fleet's PostgreSQL), and prints one line
per model version x city x fallback level: deliveries, ETA MAE and bias (minutes), Brier
score, ECE, late rate, mean delivery minutes and predicted cost. ``--json`` prints the rows
as ``GET /v1/quality`` answers them. Exit 1 when the store cannot be read.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Final, TextIO

from dispatch_service.outcomes.quality import QualityFigures, QualityKey, live_quality
from dispatch_service.outcomes.service import quality_json
from dispatch_service.outcomes.sql_store import open_store
from dispatch_service.outcomes.store import DEFAULT_STORE_PATH, OUTCOME_STORE_ENV, StoreError

__all__ = ["add_quality_command", "cmd_quality", "quality_table"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1

CommandFactory = Callable[[str, str], argparse.ArgumentParser]


def add_quality_command(command: CommandFactory) -> None:
    """``quality`` on the admin CLI (``command`` makes a subcommand's parser)."""
    quality = command(
        "quality", "live quality per model version x city x fallback level, from outcomes"
    )
    quality.add_argument(
        "--store",
        default=os.environ.get(OUTCOME_STORE_ENV) or str(DEFAULT_STORE_PATH),
        help=f"the outcome store: an SQLite file or a postgresql:// URL (env {OUTCOME_STORE_ENV})",
    )
    quality.add_argument(
        "--hours", type=float, default=24.0, help="outcomes received in the last H hours"
    )
    quality.add_argument("--json", action="store_true", help="JSON rows instead of a table")
    quality.set_defaults(handler=cmd_quality)


def cmd_quality(args: argparse.Namespace, out: TextIO) -> int:
    since = time.time() - args.hours * 3600.0
    try:
        store = open_store(args.store)
        try:
            figures = live_quality(store.joined(since=since))
        finally:
            store.close()
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps({"since": since, "quality": quality_json(figures)}, indent=2), file=out)
    else:
        print(quality_table(figures), file=out)
    return EXIT_OK


def _number(value: float, digits: int) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def quality_table(figures: dict[QualityKey, QualityFigures]) -> str:
    """The figures as an aligned text table (one row per key)."""
    header = (
        "version", "city", "level", "deliveries", "cancelled", "reassigned", "eta_mae",
        "eta_bias", "brier", "ece", "late_rate", "minutes", "cost",
    )  # fmt: skip
    rows = [header]
    for key, f in figures.items():
        rows.append(
            (
                str(key.model_version),
                key.city or "-",
                str(key.fallback_level),
                str(f.deliveries),
                str(f.cancelled),
                str(f.reassigned),
                _number(f.eta_mae, 2),
                _number(f.eta_bias, 2),
                _number(f.brier, 4),
                _number(f.ece, 4),
                _number(f.late_rate, 3),
                _number(f.delivery_minutes, 1),
                _number(f.cost, 2),
            )
        )
    if len(rows) == 1:
        return "no outcomes in the period"
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows
    )
