"""`dispatch-admin`: keys, signatures and the model lifecycle of a live server.

    dispatch-admin keygen [--out DIR] [--name NAME]       (default ~/keys/ops.key, ops.pub)
    dispatch-admin sign --model M --version N [--key FILE] [--model-repository R]
    dispatch-admin sign-repository [R] [--key FILE]
    dispatch-admin verify [R] --trusted-keys DIR
    dispatch-admin deploy --model dispatch_model --version N [--canary-percent P] [--city ID]
                          --url HOST:PORT --admin-key K --trusted-keys DIR
    dispatch-admin rollback --url HOST:PORT --admin-key K [--unload-canary] [--city ID]
    dispatch-admin status --url HOST:PORT --admin-key K
    dispatch-admin deploy|rollback|status --state-store DIR ...   (the fleet: `fleet_admin`)

Secrets enter here and nowhere deeper: the signing key comes from ``--key FILE`` or the
environment variable ``DISPATCH_SIGNING_KEY`` (the PEM text), the admin key from
``--admin-key``, ``--admin-key-file``, ``DISPATCH_ADMIN_KEY`` or the file named by
``DISPATCH_ADMIN_KEY_FILE``, the trusted keys directory from ``--trusted-keys``
or ``DISPATCH_TRUSTED_KEYS``. The library functions take them as arguments.

What ``deploy``, ``rollback`` and ``status`` do to a server is the library's
(`model_lifecycle`); this module reads the secrets, parses the arguments and prints. ``status``
prints one JSON document: ``{"model", "serving_versions", "router", "dispatch_fused",
"dispatch_priority", "routed", "routed_by_city", "disagreements"}``, and exits 1 when the
entry points or the routing and the loaded versions disagree.

Exit codes: 0 done, 1 a check failed or the server refused, 2 usage (bad arguments, a key
or folder that cannot be read).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TextIO

from dispatch_contract.keys import ADMIN_KEY_ENV, KeyFileError, read_key
from dispatch_contract.version import add_version_argument
from dispatch_service.core.model_config import ModelConfigError
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.signing import (
    TRUSTED_KEYS_ENV,
    Outcome,
    SigningError,
    TrustedKeys,
    load_private_key,
    sign_version,
    write_key_pair,
)
from dispatch_service.ops import fleet_admin, router_control
from dispatch_service.ops.golden import GoldenSettings
from dispatch_service.ops.model_control import ready_versions
from dispatch_service.ops.model_lifecycle import (
    DeployRequest,
    LifecycleError,
    UsageError,
    city_suffix,
    deploy,
    disagreements,
    rollback,
    routed_line,
    server_call,
    sign_repository,
)
from dispatch_service.ops.verified_load import plan_load
from dispatch_service.outcomes.cli import add_quality_command
from dispatch_service.routing.settings import IN_PROCESS_ROUTING_MODELS

__all__ = [
    "DEFAULT_KEY_DIR",
    "DEFAULT_KEY_NAME",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_USAGE",
    "SIGNING_KEY_ENV",
    "UNSIGNED",
    "build_parser",
    "cmd_deploy",
    "cmd_keygen",
    "cmd_rollback",
    "cmd_sign",
    "cmd_sign_repository",
    "cmd_status",
    "cmd_verify",
    "main",
    "plural",
]

SIGNING_KEY_ENV: Final = "DISPATCH_SIGNING_KEY"
UNSIGNED: Final = frozenset({Outcome.MISSING_MANIFEST, Outcome.MISSING_SIGNATURE})
DEFAULT_KEY_DIR: Final = "~/keys"  # outside any checkout: a private key never lands in git
DEFAULT_KEY_NAME: Final = "ops"

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2


def plural(count: int, noun: str) -> str:
    """``1 file``, ``2 files``: the CLI's lines are read by people."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _trusted(args: argparse.Namespace) -> TrustedKeys:
    directory = args.trusted_keys or os.environ.get(TRUSTED_KEYS_ENV)
    if not directory:
        raise UsageError(f"--trusted-keys DIR (or {TRUSTED_KEYS_ENV}) is required")
    try:
        return TrustedKeys.required_in(Path(directory))
    except SigningError as exc:
        raise UsageError(str(exc)) from None


def _admin_key(args: argparse.Namespace) -> str | None:
    """--admin-key, --admin-key-file, DISPATCH_ADMIN_KEY or the file DISPATCH_ADMIN_KEY_FILE."""
    try:
        return read_key(args.admin_key, ADMIN_KEY_ENV, file=args.admin_key_file)
    except KeyFileError as exc:
        raise UsageError(str(exc)) from None


def _signing_key_pem(args: argparse.Namespace) -> bytes:
    if args.key is not None:
        try:
            return Path(args.key).read_bytes()
        except OSError as exc:
            raise UsageError(f"cannot read the signing key: {exc}") from None
    pem = os.environ.get(SIGNING_KEY_ENV)
    if not pem:
        raise UsageError(f"--key FILE or the environment variable {SIGNING_KEY_ENV} is required")
    return pem.encode()


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
    try:
        key = load_private_key(_signing_key_pem(args))
    except SigningError as exc:
        raise UsageError(f"signing key: {exc}") from None
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
    try:
        key = load_private_key(_signing_key_pem(args))
    except SigningError as exc:
        raise UsageError(f"signing key: {exc}") from None
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
    plan = plan_load(repository, _trusted(args), args.profile)
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


def _fleet(args: argparse.Namespace) -> bool:
    """Whether the command goes to the fleet's state store (no --url given, a store named)."""
    if args.url:
        return False
    if not args.state_store:
        raise UsageError("--url HOST:PORT (one server) or --state-store DIR (the fleet) needed")
    return True


def cmd_deploy(args: argparse.Namespace, out: TextIO) -> int:
    if _fleet(args):
        return fleet_admin.cmd_deploy(args, out)
    try:
        golden = GoldenSettings(
            min_top1_agreement=args.min_top1_agreement,
            max_mean_eta_diff_minutes=args.max_eta_diff_minutes,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    request = DeployRequest(
        http_url=args.url,
        model=args.model,
        version=args.version,
        canary_percent=args.canary_percent,
        repository=Path(args.model_repository),
        trusted=_trusted(args),
        admin_key=_admin_key(args),
        golden=golden,
        timeout_s=args.timeout_s,
        city=args.city,
    )
    result = deploy(request, lambda line: print(line, file=out, flush=True))
    print(
        f"deployed {args.model} version {result.canary} as canary at "
        f"{result.canary_percent}%{city_suffix(result.city)} (stable {result.stable})",
        file=out,
    )
    return EXIT_OK


def cmd_rollback(args: argparse.Namespace, out: TextIO) -> int:
    if _fleet(args):
        return fleet_admin.cmd_rollback(args, out)
    result = rollback(
        args.url,
        admin_key=_admin_key(args),
        model=args.model,
        unload_canary=args.unload_canary,
        timeout_s=args.timeout_s,
        city=args.city,
    )
    print(result.summary(args.model), file=out)
    return EXIT_OK


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    """What the server serves and routes, read from it, as one JSON document; exit 1 when the
    entry points or the routing and the loaded versions disagree."""
    if _fleet(args):
        return fleet_admin.cmd_status(args, out)
    key = _admin_key(args)
    settings = server_call(
        "reading the router settings",
        lambda: router_control.read_router_settings(args.url, key, args.timeout_s),
    )
    followers = {
        name: server_call(
            f"reading the {name} settings",
            functools.partial(
                router_control.read_fused_settings, args.url, key, args.timeout_s, model=name
            ),
        )
        for name in IN_PROCESS_ROUTING_MODELS
    }
    served = server_call(
        "reading the served versions",
        lambda: ready_versions(args.url, args.model, key, args.timeout_s),
    )
    document = {
        "model": args.model,
        "serving_versions": list(served),
        "router": dataclasses.asdict(settings),
        **{
            name: None if follower is None else dataclasses.asdict(follower)
            for name, follower in followers.items()
        },
        "routed": routed_line(settings),
        "routed_by_city": {
            route.city: routed_line(settings.for_city(route.city)) for route in settings.city_routes
        },
        "disagreements": disagreements(settings, followers, served),
    }
    print(json.dumps(document, indent=2, sort_keys=True), file=out)
    return EXIT_FAILED if document["disagreements"] else EXIT_OK


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
        description="Signed models and their lifecycle on a live server. Exit codes: 0 done, "
        "1 a check failed or the server refused, 2 usage (bad arguments, unreadable keys or "
        "folders).",
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

    def server_options(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--url",
            help="one server's control endpoint, the launcher's health port (127.0.0.1:8003): "
            "host:port, http://host:port or https://host:port (else --state-store: the whole "
            "fleet; docs/fleet.md)",
        )
        command.add_argument(
            "--admin-key",
            help=f"admin key (else env {ADMIN_KEY_ENV}, else the file named by "
            f"{ADMIN_KEY_ENV}_FILE; `make serve` prints where it keeps one)",
        )
        command.add_argument("--admin-key-file", type=Path, help="file holding the admin key")
        command.add_argument("--model", default="dispatch_model", help="the routed model")
        command.add_argument(
            "--timeout-s", type=float, default=300.0, help="seconds per server call"
        )

    city_help = "a registered city id: change only its route (default: every city)"
    deploy_cmd = command("deploy", "verify, check and serve a canary version")
    server_options(deploy_cmd)
    deploy_cmd.add_argument("--version", type=int, required=True, help="the canary version")
    deploy_cmd.add_argument(
        "--canary-percent", type=int, default=10, help="share of users routed to the canary"
    )
    deploy_cmd.add_argument("--trusted-keys", help=trusted_help)
    deploy_cmd.add_argument(
        "--model-repository", default=str(MODEL_REPOSITORY), help="where the versions are"
    )
    deploy_cmd.add_argument(
        "--min-top1-agreement",
        type=float,
        default=GoldenSettings.min_top1_agreement,
        help="golden check: least share of orders with the same best rider",
    )
    deploy_cmd.add_argument(
        "--max-eta-diff-minutes",
        type=float,
        default=GoldenSettings.max_mean_eta_diff_minutes,
        help="golden check: largest mean |ETA difference|",
    )
    deploy_cmd.add_argument("--city", help=city_help)
    fleet_admin.add_store_options(deploy_cmd, writes=True, trusted=False)
    deploy_cmd.set_defaults(handler=cmd_deploy)

    rollback_cmd = command("rollback", "back to the stable version only")
    server_options(rollback_cmd)
    rollback_cmd.add_argument(
        "--unload-canary", action="store_true", help="also unload the canary version"
    )
    rollback_cmd.add_argument("--city", help=city_help)
    rollback_cmd.add_argument(
        "--model-repository", default=str(MODEL_REPOSITORY), help="with --state-store: its files"
    )
    fleet_admin.add_store_options(rollback_cmd, writes=True, trusted=True)
    rollback_cmd.set_defaults(handler=cmd_rollback)

    status = command("status", "served versions and router settings, as one JSON document")
    server_options(status)
    fleet_admin.add_store_options(status, writes=False, trusted=True)
    status.set_defaults(handler=cmd_status)
    add_quality_command(command)
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
    except UsageError as exc:
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
