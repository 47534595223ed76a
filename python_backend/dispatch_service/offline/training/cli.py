"""``python -m dispatch_service.offline.training``: the command line of a training run."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Final

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import ONNX_FILE, SCORING_MODEL, model_layout
from dispatch_service.offline.training.card import append_policy_evaluation
from dispatch_service.offline.training.config import MapVariants, TrainConfig
from dispatch_service.offline.training.numerics import unpinned_blas
from dispatch_service.offline.training.run import display_path, train_and_export

__all__ = [
    "QUICK",
    "config_from_args",
    "main",
]


def _command(args: argparse.Namespace) -> str:
    parts = [
        ".venv/bin/python",
        "-m",
        "dispatch_service.offline.training",
        "--seed",
        str(args.seed),
    ]
    if args.quick:
        parts.append("--quick")
    for flag in (
        "windows",
        "variant_windows",
        "holdout_windows",
        "epochs",
        "batch_size",
        "eval_windows",
    ):
        value = getattr(args, flag)
        if value is not None:
            parts += ["--" + flag.replace("_", "-"), str(value)]
    if args.hidden is not None:
        parts += ["--hidden", args.hidden]
    if args.log_features:
        parts.append("--log-features")
    if args.version != 1:
        parts += ["--version", str(args.version)]
    if args.compare_with is not None:
        parts += ["--compare-with", display_path(Path(args.compare_with))]
    if args.no_eval:
        parts.append("--no-eval")
    if args.out_dir != str(_version_dir(args.version)):
        parts += ["--out-dir", args.out_dir]
    return " ".join(shlex.quote(p) for p in parts)


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch_service.offline.training",
        description="Train the dispatch MLP on simulated windows and export ONNX + model card.",
    )
    parser.add_argument("--seed", type=int, default=TrainConfig.seed)
    parser.add_argument("--windows", type=int, help=f"training windows ({TrainConfig.windows})")
    parser.add_argument(
        "--variant-windows",
        type=int,
        help="training windows in entry-built worlds of the training cities with their road "
        f"circuity and speeds redrawn (MapVariants; default {MapVariants.windows}, 0: none)",
    )
    parser.add_argument(
        "--holdout-windows", type=int, help=f"held-out windows ({TrainConfig.holdout_windows})"
    )
    parser.add_argument("--epochs", type=int, help=f"epochs ({TrainConfig.epochs})")
    parser.add_argument("--batch-size", type=int, help=f"minibatch ({TrainConfig.batch_size})")
    parser.add_argument("--hidden", help="hidden layer widths, e.g. 128,64")
    parser.add_argument(
        "--log-features",
        action="store_true",
        help="append the LOG_FEATURES columns inside the graph (version 2)",
    )
    parser.add_argument(
        "--version",
        type=int,
        default=1,
        help="the dispatch_model version this run produces (card title, default folder)",
    )
    parser.add_argument(
        "--compare-with",
        help="a served version's folder (e.g. model_repository/dispatch_model/1): score it on "
        "the same held-out pairs and policy windows and compare in the card",
    )
    parser.add_argument(
        "--out-dir",
        help=f"where model.onnx and its card go (default {MODEL_REPOSITORY}/dispatch_model/"
        "<version>)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny data and few epochs: for tests, not serving"
    )
    parser.add_argument(
        "--eval-windows",
        type=int,
        help="policy evaluation windows per regime and city for the card (as make evaluate: "
        "96); the card judges every city in the default and peak regimes",
    )
    parser.add_argument(
        "--no-eval", action="store_true", help="skip the model-vs-nearest-rider evaluation"
    )
    parser.add_argument(
        "--card-only",
        action="store_true",
        help="train nothing: run the card's policy evaluation again for the version folder's "
        "model.onnx and rewrite its card (training sections as they are); what a change of "
        "the default objective or of the report needs, since training reads neither",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="train into a temporary folder and compare every file byte for byte with the "
        "committed version folder (exit 1 on any difference); writes nothing in the repository",
    )
    return parser


def _version_dir(version: int) -> Path:
    return model_layout(MODEL_REPOSITORY, SCORING_MODEL).version(version)


CARD_REGIMES: Final = ("default", "peak")
QUICK: Final = {
    "windows": 24,
    "variant_windows": 12,
    "holdout_windows": 8,
    "epochs": 3,
    "eval_windows": 2,
}


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    base = TrainConfig(seed=args.seed)
    overrides: dict[str, Any] = {}
    if args.quick:
        overrides.update({k: QUICK[k] for k in ("windows", "holdout_windows", "epochs")})
    for name in ("windows", "holdout_windows", "epochs", "batch_size"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    if args.hidden is not None:
        overrides["hidden"] = tuple(int(part) for part in args.hidden.split(",") if part)
    if args.log_features:
        overrides["log_features"] = True
    variants = base.map_variants
    if args.variant_windows is not None:
        variants = replace(variants, windows=args.variant_windows)
    elif args.quick:
        variants = replace(variants, windows=QUICK["variant_windows"])
    config = TrainConfig(
        **{**asdict(base), **overrides, "encoder": base.encoder, "map_variants": variants}
    )
    if config.windows < 1 or config.holdout_windows < 1 or config.epochs < 1:
        raise SystemExit("--windows, --holdout-windows and --epochs must be >= 1")
    if variants.windows < 0:
        raise SystemExit("--variant-windows must be >= 0")
    return config


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.version < 1:
        parser.error("--version must be >= 1")
    if args.check and (args.out_dir is not None or args.quick):
        parser.error("--check compares the version folder itself: no --out-dir or --quick")
    if args.card_only and (args.check or args.no_eval):
        parser.error("--card-only reruns a card's evaluation: no --check or --no-eval")
    if args.out_dir is None:
        if args.quick:
            parser.error("--quick needs --out-dir: a toy model must not replace the served one")
        args.out_dir = str(_version_dir(args.version))
    reference = None if args.compare_with is None else Path(args.compare_with)
    if reference is not None and not (reference / ONNX_FILE).is_file():
        parser.error(f"--compare-with: no {ONNX_FILE} in {reference}")
    config = config_from_args(args)
    unpinned = unpinned_blas()
    if unpinned is not None:  # numpy loaded before `python -m ...training` could pin it
        print(f"training: not bit-reproducible: {unpinned}", file=sys.stderr)
    committed = Path(args.out_dir)
    if args.card_only:
        return _card_only(args, config, committed, reference)
    command = _command(args)
    if args.check:
        with tempfile.TemporaryDirectory(prefix="model-check-") as scratch:
            _train(args, config, Path(scratch), command, reference)
            return _compare(committed, Path(scratch))
    _train(args, config, committed, command, reference)
    return 0


def _compare(committed: Path, fresh: Path) -> int:
    """0 when every file the run wrote equals the committed one byte for byte, else 1."""
    different = [
        path.name
        for path in sorted(fresh.iterdir())
        if not (committed / path.name).is_file()
        or (committed / path.name).read_bytes() != path.read_bytes()
    ]
    if different:
        print(f"model-check: {committed} differs from a fresh run in: {', '.join(different)}")
        return 1
    names = ", ".join(path.name for path in sorted(fresh.iterdir()))
    print(f"model-check: {committed} reproduced byte for byte ({names})")
    return 0


def _card_only(
    args: argparse.Namespace, config: TrainConfig, out_dir: Path, reference: Path | None
) -> int:
    """The card's policy evaluation again, over the folder's model.onnx and card as they are:
    the same bytes a full run writes (its card is rounded the same way), in a fraction of
    the time; `make model-check` confirms it with full runs."""
    path = out_dir / "model_card.json"
    if not path.is_file() or not (out_dir / ONNX_FILE).is_file():
        print(f"--card-only: no {path.name} and {ONNX_FILE} in {out_dir}", file=sys.stderr)
        return 2
    card = json.loads(path.read_text())
    card.pop("policy_evaluation", None)
    started = time.perf_counter()
    _policy_evaluation(args, config, out_dir, card, reference)
    print(f"card evaluation {time.perf_counter() - started:.1f} s (not written into the card)")
    return 0


def _policy_evaluation(
    args: argparse.Namespace,
    config: TrainConfig,
    out_dir: Path,
    card: dict[str, Any],
    reference: Path | None,
) -> None:
    """The card's dispatch-policy section: the version's model (and the reference version)
    against the baselines and the oracle, every city in the default and peak regimes."""
    from dispatch_service.offline.evaluation import card_section
    from dispatch_service.offline.evaluation_policies import MINUTES_ORACLE, default_policies
    from dispatch_service.offline.evaluation_run import EvaluationConfig, evaluate

    eval_windows = args.eval_windows
    if eval_windows is None:
        # The card's tables are `make evaluate`'s, over as many windows per regime.
        eval_windows = QUICK["eval_windows"] if args.quick else EvaluationConfig.windows
    # Every city in the regimes the oracle-gain targets judge; `make evaluate` has all.
    regimes = ("default",) if args.quick else CARD_REGIMES
    models = {"model": out_dir / ONNX_FILE}
    if reference is not None:  # the reference version on the same windows and noise
        models[f"version_{reference.name}"] = reference / ONNX_FILE
    # The card keeps the policies its tables were made with (the committed cards, which
    # `make model-check` reproduces); `make evaluate` adds the delivery-minutes oracle.
    policies = default_policies(models, MODEL_REPOSITORY)
    policies.pop(MINUTES_ORACLE)
    summary = evaluate(policies, EvaluationConfig(windows=eval_windows, regimes=regimes))
    section = card_section(summary, "model", config.cities)
    print(section["markdown"])
    append_policy_evaluation(out_dir, card, section)


def _train(
    args: argparse.Namespace,
    config: TrainConfig,
    out_dir: Path,
    command: str,
    reference: Path | None,
) -> None:
    started = time.perf_counter()
    result = train_and_export(
        config,
        out_dir,
        command=command,
        log=True,
        version=args.version,
        reference=reference,
    )
    card = result.card
    print(f"wrote {result.model_path} ({card['onnx']['bytes']} bytes)")
    print("held-out:", json.dumps(card["holdout"], indent=None))
    if not args.no_eval:
        _policy_evaluation(args, config, out_dir, card, reference)
    host = f"{platform.machine()}, {_cpu_count()} CPUs, Python {platform.python_version()}"
    print(
        f"training {result.seconds['train']:.1f} s, wall time "
        f"{time.perf_counter() - started:.1f} s on {host} (not written into the card)"
    )
