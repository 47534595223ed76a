"""`dispatch-admin`: keys, signatures, and the routing of the fleet (one server included).

    dispatch-admin keygen [--out DIR] [--name NAME]       (default ~/keys/ops.key, ops.pub)
    dispatch-admin sign --model M --version N [--key FILE] [--model-repository R]
    dispatch-admin sign-repository [R] [--key FILE]
    dispatch-admin verify [R] --trusted-keys DIR
    dispatch-admin deploy|canary|shadow|promote|rollback|restore|history|status ...

Routing changes one way: each routing command writes the next signed revision of the fleet
state (`fleet_admin`, `fleet_revisions`), which every replica follows, a single `make serve`
included (its store is ``.triton/fleet``). No command reloads a model's config to route.

Secrets enter here and nowhere deeper: the signing key comes from ``--key FILE`` or the
environment variable ``DISPATCH_SIGNING_KEY`` (the PEM text), the trusted keys directory from
``--trusted-keys`` or ``DISPATCH_TRUSTED_KEYS``. The library functions take them as arguments.

Exit codes: 0 done, 1 a check failed or the fleet did not follow, 2 usage (bad arguments, a
key or folder that cannot be read, a stored document that does not verify).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TextIO

from dispatch_contract.version import add_version_argument
from dispatch_service.core.model_config import ModelConfigError
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.signing import (
    TRUSTED_KEYS_ENV,
    Outcome,
    SigningError,
    sign_version,
    write_key_pair,
)
from dispatch_service.ops import fleet_admin, rollout_admin
from dispatch_service.ops.golden import GoldenSettings
from dispatch_service.ops.model_lifecycle import LifecycleError, UsageError, sign_repository
from dispatch_service.ops.verified_load import plan_load
from dispatch_service.outcomes.cli import add_quality_command

__all__ = [
    "DEFAULT_KEY_DIR",
    "DEFAULT_KEY_NAME",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "SIGNING_KEY_ENV",
    "UNSIGNED",
    "build_parser",
    "cmd_keygen",
    "cmd_sign",
    "cmd_sign_repository",
    "cmd_verify",
    "main",
    "plural",
]

SIGNING_KEY_ENV: Final = fleet_admin.SIGNING_KEY_ENV
UNSIGNED: Final = frozenset({Outcome.MISSING_MANIFEST, Outcome.MISSING_SIGNATURE})
DEFAULT_KEY_DIR: Final = "~/keys"  # outside any checkout: a private key never lands in git
DEFAULT_KEY_NAME: Final = "ops"

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2


def plural(count: int, noun: str) -> str:
    """``1 file``, ``2 files``: the CLI's lines are read by people."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def cmd_keygen(args: argparse.Namespace, out: TextIO) -> int:
    directory = Path(args.out).expanduser()
    private_path, public_path = directory / f"{args.name}.key", directory / f"{args.name}.pub"
    try:
        kid = write_key_pair(private_path, public_path)
    except (SigningError, OSError) as exc:
        raise UsageError(str(exc)) from None
    print(f"key id {kid}", file=out)
    print(f"private key {private_path} (mode 0600; never commit it)", file=out)
    print(f"public key  {public_path} (copy it into the trusted keys directory)", file=out)
    return EXIT_OK


def cmd_sign(args: argparse.Namespace, out: TextIO) -> int:
    key = fleet_admin.signing_key(args)
    folder = Path(args.model_repository) / args.model / str(args.version)
    try:
        manifest = sign_version(folder, key)
    except (SigningError, OSError) as exc:
        raise UsageError(str(exc)) from None
    print(
        f"signed {args.model} version {args.version}: {plural(len(manifest.files), 'file')}",
        file=out,
    )
    return EXIT_OK


def cmd_sign_repository(args: argparse.Namespace, out: TextIO) -> int:
    key = fleet_admin.signing_key(args)
    repository = Path(args.repository)
    signed = sign_repository(repository, key)
    for model, version, manifest in signed:
        print(f"signed {model} version {version}: {plural(len(manifest.files), 'file')}", file=out)
    models = len({model for model, _, _ in signed})
    print(
        f"signed {plural(len(signed), 'version folder')} of {plural(models, 'model')} "
        f"in {repository}",
        file=out,
    )
    return EXIT_OK


def cmd_verify(args: argparse.Namespace, out: TextIO) -> int:
    repository = Path(args.repository)
    if not repository.is_dir():
        raise UsageError(f"{repository} is not a folder")
    plan = plan_load(repository, fleet_admin.trusted_keys(args), args.profile)
    for verdict in plan.verifications:
        print(verdict.line(), file=out)
    for name in plan.startup:
        print(f"{name}: loads", file=out)
    for name, versions in plan.restricted.items():
        if name in plan.scoring_versions:
            served = list(plan.scoring_versions[name])
            print(f"{name}: loads, routing over the verified versions {served} only", file=out)
        else:
            print(f"{name}: loads versions {list(versions)} only", file=out)
    for name in plan.deferred:
        print(f"{name}: loads (after the restricted models)", file=out)
    for name, reason in plan.refused.items():
        print(f"{name}: REFUSED: {reason}", file=out)
    unsigned = [v for v in plan.refused_versions if v.outcome in UNSIGNED]
    if unsigned:  # the usual cause on a fresh checkout; tampering is never "fixed" by signing
        print(
            f"{plural(len(unsigned), 'version folder')} unsigned; if their files are the ones "
            f"to trust, sign every loadable folder: dispatch-admin sign-repository "
            f"{repository} --key KEY (or make sign-all KEY=...)",
            file=out,
        )
    return EXIT_FAILED if plan.refused_versions or plan.refused else EXIT_OK


class _HelpWithDefaults(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it has none or says it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        shown = action.option_strings or action.nargs in ("?", "*")
        if (
            shown
            and "%(default)" not in text
            and action.default not in (None, False, argparse.SUPPRESS)
        ):
            text += " (default: %(default)s)"
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dispatch-admin",
        description="Signed models and the fleet's routing: every routing change a signed "
        "revision of the fleet state. Exit codes: 0 done, 1 a check failed or the fleet did "
        "not follow, 2 usage (bad arguments, unreadable keys or folders, a stored document "
        "that does not verify).",
        formatter_class=_HelpWithDefaults,
    )
    add_version_argument(parser)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        made: argparse.ArgumentParser = commands.add_parser(
            name, help=text, description=text, formatter_class=_HelpWithDefaults
        )
        return made

    keygen = command("keygen", "make an Ed25519 key pair (refuses to overwrite one)")
    keygen.add_argument(
        "--out", default=DEFAULT_KEY_DIR, help="folder for NAME.key and NAME.pub (~ expands)"
    )
    keygen.add_argument("--name", default=DEFAULT_KEY_NAME, help="file name stem")
    keygen.set_defaults(handler=cmd_keygen)

    key_help = f"private key PEM file (else the PEM text in env {SIGNING_KEY_ENV})"
    sign = command("sign", "sign one model version folder")
    sign.add_argument("--model", required=True, help="model folder name, e.g. dispatch_model")
    sign.add_argument("--version", type=int, required=True, help="version folder number")
    sign.add_argument("--key", help=key_help)
    sign.add_argument("--model-repository", default=str(MODEL_REPOSITORY), help="repository")
    sign.set_defaults(handler=cmd_sign)

    sign_all = command(
        "sign-repository",
        "sign every version folder a server could load: each model's numeric folders, "
        "all but ensembles' and empty ones",
    )
    sign_all.add_argument(
        "repository", nargs="?", default=str(MODEL_REPOSITORY), help="model repository"
    )
    sign_all.add_argument("--key", help=key_help)
    sign_all.set_defaults(handler=cmd_sign_repository)

    trusted_help = f"folder of trusted *.pub keys (else env {TRUSTED_KEYS_ENV})"
    verify = command("verify", "verify every model version of a repository")
    verify.add_argument(
        "repository", nargs="?", default=str(MODEL_REPOSITORY), help="model repository"
    )
    verify.add_argument("--trusted-keys", help=trusted_help)
    verify.add_argument("--profile", default="cpu", help="config the server selects (cpu, gpu)")
    verify.set_defaults(handler=cmd_verify)

    fleet_admin.add_commands(
        command,
        (GoldenSettings.min_top1_agreement, GoldenSettings.max_mean_eta_diff_minutes),
    )
    add_quality_command(command)
    rollout_admin.add_commands(command)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage
        return EXIT_USAGE if exc.code else EXIT_OK
    handler: Callable[[argparse.Namespace, TextIO], int] = args.handler
    try:
        return handler(args, out)
    except (UsageError, fleet_admin.AdminUsageError) as exc:  # fleet_admin reads the keys
        print(f"usage error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LifecycleError as exc:
        print(f"{args.command} failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ModelConfigError as exc:  # a config.pbtxt that does not parse: one line
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
