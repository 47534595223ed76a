"""`dispatch-admin rollout ...` and `dispatch-admin experiment report`: a progressive
rollout driven by outcomes (`rollout_controller`), and the comparison it acts on.

    dispatch-admin rollout start --version N [--steps 1,5,25,50,100] [--city ID] ...
    dispatch-admin rollout run [--interval-s 5] [--once]      (the controller: one per fleet)
    dispatch-admin rollout status | pause | resume | abort [--keep-canary]
    dispatch-admin experiment report --treatment-version N [--control-version M] [--city ID]

Every routing change the rollout makes is a signed fleet revision (`fleet_revisions`); the
commands need the fleet store, its trusted keys and (to write) the signing key, like the
other routing commands, plus the outcome store (``--outcome-store``, env
``DISPATCH_OUTCOME_STORE``; `make serve`'s SQLite file by default).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final, TextIO

from prometheus_client import CollectorRegistry, start_http_server

from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.core.signing import Outcome, verify_version
from dispatch_service.experiments.analysis import (
    DEFAULT_ALPHA,
    METRIC_NAMES,
    Experiment,
    metric_specs,
)
from dispatch_service.experiments.rollout import (
    DEFAULT_GUARDRAILS,
    DEFAULT_MATURITY_S,
    DEFAULT_MIN_OUTCOMES,
    DEFAULT_MIN_SECONDS,
    DEFAULT_PRIMARY,
    DEFAULT_STEPS,
    RolloutPlan,
)
from dispatch_service.ops import fleet_admin
from dispatch_service.ops.configmap_publish import ConfigMapPublisher, PublishError
from dispatch_service.ops.fleet_state import STATE_STORE_ENV, StateStore, initial_state
from dispatch_service.ops.rollout_controller import (
    DEFAULT_LEASE_S,
    RolloutBook,
    RolloutCollector,
    RolloutController,
    RolloutError,
    arms,
    mature_rows,
)
from dispatch_service.outcomes.sql_store import open_store
from dispatch_service.outcomes.store import (
    DEFAULT_STORE_FILE,
    OUTCOME_STORE_ENV,
    OutcomeStore,
    StoreError,
)
from dispatch_service.routing.settings import SCORING_MODEL_NAME

__all__ = ["ROLLOUT_ROUTING_COMMANDS", "add_commands"]

# What writes one fleet revision each time it is run (`rollout run` writes one per action
# it takes, none while it holds).
ROLLOUT_ROUTING_COMMANDS: Final = ("rollout start", "rollout abort")
_EXIT_OK, _EXIT_FAILED, _EXIT_USAGE = 0, 1, 2


def _default_outcome_store() -> str:
    """`make serve`'s store, as the launcher's ``--outcome-store`` defaults to it."""
    return os.environ.get(OUTCOME_STORE_ENV) or str(REPO_ROOT / ".triton" / DEFAULT_STORE_FILE)


def _numbers(text: str, kind: Callable[[str], Any], what: str) -> tuple[Any, ...]:
    try:
        return tuple(kind(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise fleet_admin.AdminUsageError(
            f"{what}: comma-separated numbers, got {text!r}"
        ) from None


def _margins(pairs: list[str]) -> dict[str, float]:
    margins = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        try:
            margins[name.strip()] = float(value)
        except ValueError:
            raise fleet_admin.AdminUsageError(
                f"--margin {pair!r}: METRIC=NUMBER, e.g. late=0.01"
            ) from None
    return margins


def _outcomes(args: argparse.Namespace) -> OutcomeStore:
    try:
        return open_store(args.outcome_store)
    except StoreError as exc:
        raise fleet_admin.AdminUsageError(f"--outcome-store {args.outcome_store}: {exc}") from None


def _known_version(repository: Path, trusted: Any) -> Callable[[int], str | None]:
    """A rollout's version must be a signed folder of the scoring model, as replicas check."""

    def refusal(version: int) -> str | None:
        folder = repository / SCORING_MODEL_NAME / str(version)
        if not folder.is_dir():
            return f"no folder {folder}"
        verdict = verify_version(folder, trusted)
        return None if verdict.outcome is Outcome.VERIFIED else f"refused: {verdict.reason}"

    return refusal


def _controller(args: argparse.Namespace, *, signing: bool) -> RolloutController:
    trusted = fleet_admin.trusted_keys(args)
    signer = fleet_admin.signing_key(args) if signing else None
    return RolloutController(
        state_store=fleet_admin.state_store(args),
        outcomes=_outcomes(args),
        signer=signer,
        trusted=trusted,
        holder=args.holder,
        lease_s=args.lease_s,
        known_version=_known_version(Path(args.model_repository), trusted),
        initial=lambda: initial_state(Path(args.model_repository)),
        publish=_publisher(getattr(args, "publish_configmap", None)),
    )


def _publisher(configmap: str | None) -> Callable[[StateStore], None] | None:
    if configmap is None:
        return None
    try:
        return ConfigMapPublisher.in_cluster(configmap).publish
    except PublishError as exc:
        raise fleet_admin.AdminUsageError(f"--publish-configmap {configmap}: {exc}") from None


def _print(document: Any, out: TextIO) -> None:
    print(json.dumps(document, indent=2, sort_keys=True), file=out)


def _guarded(name: str, run: Callable[[], int]) -> int:
    try:
        return run()
    except (fleet_admin.AdminUsageError, ValueError) as exc:
        print(f"usage error: {exc}", file=sys.stderr)
        return _EXIT_USAGE
    except RolloutError as exc:
        print(f"{name} refused: {exc}", file=sys.stderr)
        return _EXIT_FAILED


def cmd_start(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        plan = RolloutPlan(
            version=args.version,
            steps=_numbers(args.steps, int, "--steps"),
            city=fleet_admin.registered_city(args.city, Path(args.model_repository)),
            min_outcomes=args.min_outcomes,
            min_seconds=args.min_seconds,
            guardrails=tuple(g for g in args.guardrails.split(",") if g),
            primary=args.primary,
            margins=_margins(args.margin),
            alpha=args.alpha,
            maturity_s=args.maturity_s,
        )
        state = _controller(args, signing=True).start(plan)
        _print(state.to_dict(), out)
        return _EXIT_OK

    return _guarded("rollout start", run)


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        controller = _controller(args, signing=True)
        if args.metrics_port is not None:  # the rollout's series, where no launcher reads its store
            registry = CollectorRegistry(auto_describe=False)
            registry.register(RolloutCollector(controller.book))
            start_http_server(args.metrics_port, addr=args.metrics_address, registry=registry)
        # The lease goes with the controller: on any exit (SIGTERM from a pod stop included)
        # another controller, or `rollout abort`, may act at once instead of after lease_s.
        with _sigterm_exits():
            try:
                while True:
                    action = controller.tick()
                    if action is not None:
                        line = {"action": str(action.kind), "reason": action.reason}
                        print(json.dumps(line), file=out)
                        out.flush()
                    state = controller.book.load()
                    ended = state is not None and state.phase.final
                    if args.once or (ended and not args.forever):
                        return _EXIT_OK
                    time.sleep(args.interval_s)
            finally:
                controller.book.release(controller.holder)

    return _guarded("rollout run", run)


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM raises SystemExit (so ``finally`` blocks run) while inside; the main thread
    only, where Python delivers signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def cmd_status(args: argparse.Namespace, out: TextIO) -> int:
    def run() -> int:
        book = RolloutBook(fleet_admin.state_store(args), create=False)
        state = book.load()
        if state is None:
            _print({"rollout": None}, out)
            return _EXIT_OK
        _print({"rollout": state.to_dict(), "audit": book.audit()[-args.last :]}, out)
        return _EXIT_OK

    return _guarded("rollout status", run)


def _operator(name: str) -> Callable[[argparse.Namespace, TextIO], int]:
    def command(args: argparse.Namespace, out: TextIO) -> int:
        def run() -> int:
            controller = _controller(args, signing=name == "abort")
            if name == "pause":
                state = controller.pause()
            elif name == "resume":
                state = controller.resume()
            else:
                state = controller.abort(roll_back=not args.keep_canary)
            _print(state.to_dict(), out)
            return _EXIT_OK

        return _guarded(f"rollout {name}", run)

    return command


def cmd_experiment_report(args: argparse.Namespace, out: TextIO) -> int:
    """Per metric: each arm's orders and mean, the interval, the verdict (one look over
    every outcome since ``--since``)."""

    def run() -> int:
        store = _outcomes(args)
        try:
            rows = mature_rows(
                store.joined(since=args.since), since=args.since, maturity_s=args.maturity_s
            )
        finally:
            store.close()
        treatment, control = arms(
            rows,
            city=args.city,
            treatment_version=args.treatment_version,
            control_version=args.control_version,
        )
        experiment = Experiment(metric_specs(_margins(args.margin)), args.alpha)
        report = experiment.look(treatment, control).report()
        _print(
            {
                "treatment_version": args.treatment_version,
                "control_version": args.control_version,
                "city": args.city,
                "since": args.since,
                "alpha": args.alpha,
                "metrics": report,
            },
            out,
        )
        return _EXIT_OK

    return _guarded("experiment report", run)


def add_commands(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """Add ``rollout`` and ``experiment`` with ``command(name, help)`` (`admin.build_parser`)."""

    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--state-store",
            default=os.environ.get(STATE_STORE_ENV) or fleet_admin.DEFAULT_STATE_STORE,
            help="the fleet's state folder",
        )
        parser.add_argument("--trusted-keys", help="folder of trusted *.pub keys")
        parser.add_argument(
            "--outcome-store",
            default=os.environ.get(OUTCOME_STORE_ENV)
            or str(REPO_ROOT / ".triton" / DEFAULT_STORE_FILE),
            help="the outcome store: an SQLite file or a postgresql:// URL "
            f"(env {OUTCOME_STORE_ENV})",
        )
        parser.add_argument("--key", help="signing key PEM file (else env DISPATCH_SIGNING_KEY)")
        parser.add_argument(
            "--model-repository", default=str(MODEL_REPOSITORY), help="where versions are verified"
        )
        parser.add_argument(
            "--holder",
            default=f"{socket.gethostname()}:{os.getpid()}",
            help="this controller's name in the lease",
        )
        parser.add_argument(
            "--lease-s", type=float, default=DEFAULT_LEASE_S, help="the lease's length"
        )

    rollout = command("rollout", "a progressive rollout judged on delivery outcomes")
    actions = rollout.add_subparsers(dest="rollout_command", required=True, metavar="ACTION")

    start = actions.add_parser("start", help="route the first step's share to a version")
    common(start)
    start.add_argument("--version", type=int, required=True, help="the version to roll out")
    start.add_argument(
        "--steps",
        default=",".join(map(str, DEFAULT_STEPS)),
        help="canary shares in percent, the last 100 (the promotion)",
    )
    start.add_argument("--city", help="roll out in this city only (default: every city)")
    start.add_argument(
        "--min-outcomes", type=int, default=DEFAULT_MIN_OUTCOMES, help="per arm, per step"
    )
    start.add_argument(
        "--min-seconds", type=float, default=DEFAULT_MIN_SECONDS, help="per step at least"
    )
    start.add_argument(
        "--guardrails",
        default=",".join(DEFAULT_GUARDRAILS),
        help=f"metrics whose worsening rolls back ({', '.join(METRIC_NAMES)})",
    )
    start.add_argument(
        "--primary", default=DEFAULT_PRIMARY, help="the metric that must be non-inferior"
    )
    start.add_argument(
        "--margin", action="append", default=[], help="METRIC=NUMBER, e.g. late=0.01 (repeat)"
    )
    start.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="the whole rollout's")
    start.add_argument(
        "--maturity-s",
        type=float,
        default=DEFAULT_MATURITY_S,
        help="judge a decision only this long after it was made (its outcome is in by then)",
    )
    start.set_defaults(handler=cmd_start)

    run = actions.add_parser("run", help="the controller: look, act, repeat until it ends")
    common(run)
    run.add_argument("--interval-s", type=float, default=5.0, help="between looks")
    run.add_argument("--once", action="store_true", help="one look, then exit")
    run.add_argument(
        "--forever",
        action="store_true",
        help="keep looking after a rollout ends, for the next one (a controller's pod)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        help="serve the rollout's Prometheus series (dispatch_rollout_*) on this port",
    )
    run.add_argument(
        "--metrics-address",
        default="127.0.0.1",
        help="the address --metrics-port listens on (0.0.0.0 in a pod, for the PodMonitor)",
    )
    run.add_argument(
        "--publish-configmap",
        metavar="NAME",
        help="in a Kubernetes pod: write every new revision into this ConfigMap, which the "
        "launcher pods mount (deploy/k8s/base/rollout-controller.yaml)",
    )
    run.set_defaults(handler=cmd_run)

    status = actions.add_parser("status", help="the step, the evidence, the last actions")
    common(status)
    status.add_argument("--last", type=int, default=10, help="audit entries to show")
    status.set_defaults(handler=cmd_status)

    for name, text in (
        ("pause", "hold the rollout at its step"),
        ("resume", "let a paused rollout go on"),
        ("abort", "stop the rollout; every order back on the stable version"),
    ):
        parser = actions.add_parser(name, help=text)
        common(parser)
        if name == "abort":
            parser.add_argument(
                "--keep-canary", action="store_true", help="leave the routing as it is"
            )
        parser.set_defaults(handler=_operator(name))

    experiment = command("experiment", "compare two versions on delivery outcomes")
    verbs = experiment.add_subparsers(dest="experiment_command", required=True, metavar="ACTION")
    report = verbs.add_parser("report", help="per metric: arms, interval, verdict")
    report.add_argument(
        "--outcome-store",
        default=os.environ.get(OUTCOME_STORE_ENV)
        or str(REPO_ROOT / ".triton" / DEFAULT_STORE_FILE),
        help="an SQLite file or a postgresql:// URL",
    )
    report.add_argument("--treatment-version", type=int, required=True)
    report.add_argument("--control-version", type=int, default=1)
    report.add_argument("--city", help="one city's orders only")
    report.add_argument("--since", type=float, default=0.0, help="decisions from (unix s)")
    report.add_argument("--margin", action="append", default=[], help="METRIC=NUMBER (repeat)")
    report.add_argument("--alpha", type=float, default=DEFAULT_ALPHA)
    report.add_argument(
        "--maturity-s",
        type=float,
        default=DEFAULT_MATURITY_S,
        help="leave out decisions younger than this (their slow deliveries not reported yet)",
    )
    report.set_defaults(handler=cmd_experiment_report)
