"""The launcher's command line (`make serve`, `python -m dispatch_service.ops.server`, the
images' entry point): keys, options, start, supervision, then wait for a signal or a death.

Exit codes: 0 stopped by a signal (drained), 1 the server did not start or Triton exited,
2 usage or keys, 3 the server was declared dead (`EXIT_DEAD`: let the process manager
restart it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, TextIO

from dispatch_contract.keys import (
    ADMIN_KEY_ENV,
    ADMIN_KEY_HEADER,
    PRIORITY_KEY_ENV,
    PRIORITY_KEY_FILE_ENV,
    PRIORITY_KEY_HEADER,
    SHM_KEY_ENV,
    SHM_KEY_HEADER,
    read_key,
)
from dispatch_contract.version import add_version_argument
from dispatch_service.core.model_config import ModelConfigError, check_repository_configs
from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.core.signing import TRUSTED_KEYS_ENV, SigningError
from dispatch_service.ops import fleet_watch
from dispatch_service.ops.child_process import ServerError
from dispatch_service.ops.control_gate import ControlGate, triton_upstream
from dispatch_service.ops.fleet_state import StateStore
from dispatch_service.ops.gpu import monitor as gpu_monitor
from dispatch_service.ops.host import EXPOSURE_RISKS
from dispatch_service.ops.keys import (
    ADMIN_KEY_FILE,
    PRIORITY_KEY_FILE,
    SHM_KEY_FILE,
    AccessKeys,
    KeyFileError,
    command_line_note,
    load_or_create_keys,
)
from dispatch_service.ops.outcome_launch import (
    add_outcome_arguments,
    outcome_service_from_args,
    outcome_store_from_args,
)
from dispatch_service.ops.request_watch import RequestWatch
from dispatch_service.ops.restart import CrashCounter, default_on_dead, end_process_group
from dispatch_service.ops.rollout_controller import RolloutBook, RolloutCollector
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from dispatch_service.ops.supervisor import Supervisor
from dispatch_service.ops.supervisor_state import SupervisorSettings

__all__ = [
    "ADMIN_KEY_ENV",
    "EXIT_DEAD",
    "build_parser",
    "default_log_path",
    "event_printer",
    "main",
    "options_from_args",
    "resolve_keys",
    "run_until_stopped",
    "stop_on_signals",
    "stop_regardless",
]

# A drain ends within drain_timeout_s, then Triton stops gracefully within its exit timeout
# (10 s) plus the stop's own wait: past this margin the launcher stops regardless.
STOP_MARGIN_S: Final = 25.0
EXIT_DEAD: Final = 3  # the deep check failed for dead_after_s: let the process manager restart us


def resolve_keys(args: argparse.Namespace, out: TextIO) -> AccessKeys:
    """The keys from flags, environment or files; what is still missing comes from (and is
    created in) the key folder, so no start runs open. Prints where the keys are."""
    admin = read_key(args.admin_key, ADMIN_KEY_ENV, file=args.admin_key_file)
    shm = read_key(args.shm_key, SHM_KEY_ENV, file=args.shm_key_file)
    priority = read_key(args.priority_key, PRIORITY_KEY_ENV, file=args.priority_key_file)
    if admin and shm:
        if not priority:
            print(
                f"no priority key ({PRIORITY_KEY_ENV}, {PRIORITY_KEY_FILE_ENV}): the priority "
                "lane dispatch_priority serves no client",
                file=out,
            )
            return AccessKeys(admin=admin, shm=shm)
        return AccessKeys(admin=admin, shm=shm, priority=priority)
    if args.no_create_keys:
        missing = [name for name, key in (("admin", admin), ("shared-memory", shm)) if not key]
        raise KeyFileError(
            f"no {' or '.join(missing)} key: set {ADMIN_KEY_ENV} and {SHM_KEY_ENV} (e.g. from "
            f"a Kubernetes Secret) or {ADMIN_KEY_ENV}_FILE and {SHM_KEY_ENV}_FILE"
        )
    stored, created = load_or_create_keys(args.key_dir)
    for path in created:
        print(f"created key file {path} (mode 0600)", file=out)
    keys = AccessKeys(
        admin=admin or stored.admin, shm=shm or stored.shm, priority=priority or stored.priority
    )
    if not admin:
        print(
            f"admin key (model-repository, logging, trace at the launcher's health port; "
            f"header {ADMIN_KEY_HEADER!r}): "
            f"{args.key_dir / ADMIN_KEY_FILE}  -> export {ADMIN_KEY_ENV}_FILE=...",
            file=out,
        )
    if not shm:
        print(
            f"shared-memory key (header {SHM_KEY_HEADER!r}): {args.key_dir / SHM_KEY_FILE}  "
            f"-> export {SHM_KEY_ENV}_FILE=...",
            file=out,
        )
    if not priority:
        print(
            f"priority key (the priority lane dispatch_priority; header "
            f"{PRIORITY_KEY_HEADER!r}): {args.key_dir / PRIORITY_KEY_FILE}  "
            f"-> export {PRIORITY_KEY_FILE_ENV}=...",
            file=out,
        )
    return keys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Serve the dispatch model repository (loopback, control endpoints locked)"
    )
    add_version_argument(parser, "dispatch_service.ops.server")
    parser.add_argument(
        "--venv",
        type=Path,
        default=REPO_ROOT / ".venv",
        help="virtual environment the Python-backend stubs run in (default %(default)s)",
    )
    parser.add_argument(
        "--backend-dir",
        type=Path,
        default=REPO_ROOT / ".triton" / "backends",
        help="Triton backends folder, with the python backend (default %(default)s)",
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=MODEL_REPOSITORY,
        help="the model repository to serve (default %(default)s)",
    )
    parser.add_argument(
        "--profile",
        choices=("cpu", "gpu"),
        default="cpu",
        help="runtime profile: every model on CPU, or dispatch_model on the onnxruntime "
        "backend on GPU (default %(default)s)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1); a non-loopback one needs --expose",
    )
    parser.add_argument(
        "--expose",
        action="store_true",
        help="allow a non-loopback --host: only with a patched Triton (25.07 or newer), never "
        "with the embedded 2.51 (CVE-2025-23310/23311/23319/23320/23334)",
    )
    parser.add_argument("--http-port", type=int, default=8000, help="(default %(default)s)")
    parser.add_argument("--grpc-port", type=int, default=8001, help="(default %(default)s)")
    parser.add_argument(
        "--metrics-port", type=int, default=8002, help="Prometheus metrics (default %(default)s)"
    )
    parser.add_argument(
        "--log",
        type=Path,
        default=None,
        help="tritonserver's log file (default .triton/server-HTTP_PORT.log: one per local "
        "server, so replicas on one host never write into one file)",
    )
    parser.add_argument(
        "--tritonserver",
        type=Path,
        default=None,
        help="run this tritonserver with its own lib/ and backends/ (e.g. the NGC image's "
        "/opt/tritonserver/bin/tritonserver, which has the onnxruntime backend of the gpu "
        "profile) instead of the embedded one",
    )
    parser.add_argument(
        "--trusted-keys",
        type=Path,
        default=os.environ.get(TRUSTED_KEYS_ENV) or None,
        help=f"directory of trusted *.pub keys: load only verified models (env {TRUSTED_KEYS_ENV})",
    )
    parser.add_argument(
        "--admin-key",
        default=None,
        help=f"admin key (else {ADMIN_KEY_ENV}, else the file named by {ADMIN_KEY_ENV}_FILE, "
        "else KEY_DIR/admin.key, created when missing)",
    )
    parser.add_argument("--admin-key-file", type=Path, default=None, help="file (mode 0600)")
    parser.add_argument(
        "--shm-key",
        default=None,
        help=f"shared-memory key (else {SHM_KEY_ENV}, else the file named by {SHM_KEY_ENV}_FILE, "
        "else KEY_DIR/shm.key, created when missing)",
    )
    parser.add_argument("--shm-key-file", type=Path, default=None, help="file (mode 0600)")
    parser.add_argument(
        "--priority-key",
        default=None,
        help=f"the key that entitles a window to the priority lane (else {PRIORITY_KEY_ENV}, "
        f"else the file named by {PRIORITY_KEY_FILE_ENV}, else KEY_DIR/priority.key, created "
        "when missing; with --no-create-keys and none given, the lane serves no client)",
    )
    parser.add_argument("--priority-key-file", type=Path, default=None, help="file (mode 0600)")
    parser.add_argument(
        "--key-dir",
        type=Path,
        default=REPO_ROOT / ".triton" / "keys",
        help="where missing keys are read from or created (default .triton/keys)",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        default=None,
        help="the launcher's own health endpoint (/livez, /readyz, /healthz, /metrics): "
        "deep checks of the entry points (default: metrics port + 1; 0 picks a free port)",
    )
    parser.add_argument(
        "--on-dead",
        choices=("exit", "restart"),
        default=None,
        help="when the entry points have not answered for 6 s or Triton died: stop the server "
        "and exit 3 (for a process manager), or restart it in place (default: restart for the "
        "embedded Triton 2.51, whose gRPC front end crashes on short client deadlines; exit "
        "with --tritonserver; docs/security.md)",
    )
    parser.add_argument(
        "--max-failed-starts",
        type=int,
        default=5,
        help="with --on-dead restart: after this many restarts in a row whose server never "
        "became ready, stop and exit 3 (a crash after ready is always restarted; "
        "default %(default)s)",
    )
    parser.add_argument(
        "--stub-leak-limit",
        type=int,
        default=16,
        help="restart Triton cleanly once it holds this many dead or replaced Python-backend "
        "stubs (2.51 never ends them; default %(default)s)",
    )
    parser.add_argument(
        "--stub-leak-max-age",
        type=float,
        default=120.0,
        help="... or once it has held any for this many seconds, with no stub death in the "
        "last 10 s (default %(default)s)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM, wait this long at most for in-flight requests (default 30 s)",
    )
    parser.add_argument(
        "--triton-arg",
        action="append",
        default=[],
        help="one more tritonserver flag (repeatable), e.g. --triton-arg=--log-format=ISO8601",
    )
    parser.add_argument(
        "--no-create-keys",
        action="store_true",
        help="fail instead of creating missing keys (the images: keys come from a Secret)",
    )
    parser.add_argument(
        "--require",
        default="dispatch,dispatch_fused,dispatch_priority",
        help="entry points that must load and answer before ready (comma-separated; "
        "default dispatch,dispatch_fused,dispatch_priority; '' for none)",
    )
    gpu_monitor.add_gpu_monitor_arguments(parser)
    fleet_watch.add_arguments(parser)
    add_outcome_arguments(parser)
    return parser


def default_log_path(http_port: int) -> Path:
    """Where a local server logs without ``--log``: a file per HTTP port (two replicas on
    one host writing one file interleave and lose lines)."""
    return REPO_ROOT / ".triton" / f"server-{http_port}.log"


def options_from_args(args: argparse.Namespace, keys: AccessKeys) -> ServerOptions:
    """The server options a launcher command line asks for (images and tests read it too).

    Triton gets a fresh admin key that only this launcher holds: the operators' admin key
    opens the launcher's control endpoint (`control_gate`), which checks every load first."""
    return ServerOptions(
        model_repository=args.model_repository,
        ports=Ports(args.http_port, args.grpc_port, args.metrics_port),
        profile=args.profile,
        host=args.host,
        expose=args.expose,
        admin_key=None,
        shm_key=keys.shm,
        priority_key=keys.priority,
        trusted_keys=None if args.trusted_keys is None else Path(args.trusted_keys),
        required_models=tuple(m for m in args.require.split(",") if m.strip()),
        extra_args=tuple(args.triton_arg),
        live_routing=args.state_store is not None,
        outcome_store=outcome_store_from_args(args),
    )


def _proc_mounts() -> str:
    """The mount table (how /proc is mounted decides who reads Triton's command line)."""
    try:
        return Path("/proc/self/mounts").read_text()
    except OSError:
        return ""


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """`make serve`: start the server in the foreground and print the endpoints."""
    out = out or sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    args.log = args.log or default_log_path(args.http_port)
    if args.max_failed_starts < 1:
        parser.error(f"--max-failed-starts must be >= 1, got {args.max_failed_starts}")
    if args.stub_leak_limit < 1 or args.stub_leak_max_age < 0:
        parser.error("--stub-leak-limit must be >= 1 and --stub-leak-max-age >= 0")
    gpu_settings = gpu_monitor.gpu_monitor_settings(parser, args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        keys = resolve_keys(args, out)
        outcomes = outcome_service_from_args(args, out)
    except (KeyFileError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # a broken config: one line naming it, not a server that fails on its ensembles
        check_repository_configs(args.model_repository, args.profile)
    except ModelConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    options = options_from_args(args, keys)
    runtime = (
        TritonRuntime.from_venv(args.venv, args.backend_dir)
        if args.tritonserver is None
        else TritonRuntime.from_install(args.tritonserver, args.venv / "bin")
    )
    server = TritonServer(runtime, options, args.log)
    exposed = server.exposed_listeners() if args.expose else []
    if exposed:
        print(f"warning: exposing {'; '.join(exposed)}: {EXPOSURE_RISKS}", file=sys.stderr)
    print(f"starting tritonserver (profile {args.profile}), log: {args.log}", flush=True, file=out)
    print(command_line_note(_proc_mounts(), os.geteuid()), file=out)
    shm_note = runtime.private_shm_note()
    if shm_note is not None:
        print(shm_note, file=out)
    try:
        server.start()
    except (ServerError, FileNotFoundError, SigningError) as exc:
        server.release()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    verifier = server.load_verifier()
    monitor = gpu_monitor.start_gpu_monitor(
        server.http_url, gpu_settings, options.admin_key, act=args.profile == "gpu", serve=False
    )
    # The fleet's state (--state-store) is applied before ready: a new replica joins in it.
    watcher = fleet_watch.watcher_from_args(
        args,
        server.http_url,
        options.admin_key,
        verifier,
        event_printer(out),
        routing_file=server.routing_file(),
    )
    for entry in server.entry_points:
        print(entry.line(), file=out)
    health_port = args.metrics_port + 1 if args.health_port is None else args.health_port
    settings = SupervisorSettings(
        on_dead=default_on_dead(args.on_dead, args.tritonserver),
        max_failed_starts=args.max_failed_starts,
        stub_leak_limit=args.stub_leak_limit,
        stub_leak_max_age_s=args.stub_leak_max_age,
        drain_timeout_s=args.drain_timeout,
        health_host=args.host,
        health_port=health_port,
    )
    try:
        gate = ControlGate(
            keys.admin,
            triton_upstream(server.http_url, options.access_keys.admin),
            repository=args.model_repository,
            profile=args.profile,
            verifier=verifier,
            report=event_printer(out),
        )
        supervisor = Supervisor(server, settings, event_printer(out), verifier, gate=gate)
        if outcomes is not None:  # POST /v1/outcomes, GET /v1/quality, the quality gauges
            supervisor.routes.extend(outcomes.routes())
            supervisor.registry.register(outcomes.collector())
            outcomes.start_housekeeping()
        monitor.export_to(supervisor.registry)  # the GPU series on the health port's /metrics
        if args.state_store is not None:  # the rollout the fleet's store holds, if any
            book = RolloutBook(StateStore(Path(args.state_store)), create=False)
            supervisor.registry.register(RolloutCollector(book))
        supervisor.start()
        crashes = CrashCounter(server, lambda event: event_printer(out)(json.dumps(event)))
        supervisor.metric_sources.append(crashes.start().metrics_text)
        supervisor.crash_seen = crashes.current_crashed
        requests = RequestWatch(server, lambda event: event_printer(out)(json.dumps(event)))
        supervisor.metric_sources.append(requests.start().metrics_text)
        supervisor.stub_died = requests.arm
        if watcher is not None:
            watcher.follow(supervisor)
    except OSError as exc:  # the health port is taken
        monitor.stop()
        server.stop()
        server.release()
        print(f"error: health endpoint on port {health_port}: {exc}", file=sys.stderr)
        return 1
    # Before "ready:": a signal sent as soon as it is read must drain, not kill the launcher
    # with its default action.
    stop = stop_on_signals()
    print(
        f"ready: HTTP http://{server.http_url}  gRPC {server.grpc_url}  "
        f"metrics {server.metrics_url}  health {supervisor.health_url}/readyz  "
        f"control (admin key) {supervisor.health_url}\n"
        "Ctrl-C or SIGTERM drains and stops it.",
        flush=True,
        file=out,
    )
    try:
        return run_until_stopped(server, supervisor, out, stop)
    finally:
        if watcher is not None:
            watcher.stop()
        crashes.stop()
        requests.stop()
        if outcomes is not None:
            outcomes.close()
        monitor.stop()
        server.stop()  # whatever ended the loop: never leave a Triton behind
        server.release()


def event_printer(out: TextIO) -> Callable[[str], None]:
    """The supervisor's events as lines on ``out``. A reader that went away (a closed pipe)
    must not stop the launcher: an event printed into it raised BrokenPipeError in the
    drain, and the launcher exited with its Triton still running, orphaned."""

    def report(line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            print(line, file=out, flush=True)

    return report


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM, SIGINT or SIGHUP sets. SIGHUP is a closed terminal: by default
    it ended the launcher at once, with its Triton left serving in a process group of its
    own."""
    stop = threading.Event()

    def _stop(signum: int, frame: object) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop)
    return stop


def run_until_stopped(
    server: TritonServer, supervisor: Supervisor, out: TextIO, stop: threading.Event
) -> int:
    """Block until ``stop`` is set (drain, exit 0), a dead server (exit 3) or Triton exiting
    on its own (its code, or 1)."""
    while not stop.wait(0.25):
        if supervisor.dead.is_set():
            supervisor.stop()
            server.stop(timeout_s=5)
            print(
                f"error: server declared dead: {supervisor.snapshot()['dead_reason']}",
                file=sys.stderr,
            )
            return EXIT_DEAD
        process = server.process
        restarting = supervisor.settings.on_dead == "restart"
        if not restarting and (process is None or process.poll() is not None):
            code = process.returncode if process is not None else 1
            supervisor.stop()
            server.stop()
            print(f"error: tritonserver exited with {code}:\n{server.log_tail()}", file=sys.stderr)
            return int(code or 1)
    # Whatever the drain waits on, the launcher exits: past the drain's own bound and
    # Triton's exit timeout, the server's group is killed and the launcher exits 1.
    settings = supervisor.settings
    watchdog = stop_regardless(server, settings.drain_timeout_s + STOP_MARGIN_S)
    drained = supervisor.drain_and_stop()
    watchdog.cancel()
    event_printer(out)(f"tritonserver stopped (drained {drained:.1f} s)")
    return 0


def stop_regardless(server: TritonServer, after_s: float) -> threading.Timer:
    """A timer that, unless cancelled, kills the server's process group and exits the
    launcher at once (status 1) ``after_s`` from now: a stop always stops."""

    def give_up() -> None:
        print(
            f"error: the drain did not end in {after_s:.0f} s: killing tritonserver",
            file=sys.stderr,
        )
        process = server.process
        if process is not None:
            end_process_group(process.pid)
        os._exit(1)

    timer = threading.Timer(after_s, give_up)
    timer.daemon = True
    timer.start()
    return timer


if __name__ == "__main__":
    sys.exit(main())
