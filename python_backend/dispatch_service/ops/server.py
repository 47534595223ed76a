"""Start and stop this repository's tritonserver (the `cpu` profile's embedded Triton 2.51).

Used by `make serve`, the integration-test fixture and the benchmarks, so all three start
the server the same way. The runtime comes from the `nvidia-pytriton` wheel in the venv;
`scripts/setup.sh` lays out its Python backend folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import ClassVar, TextIO

from dispatch_client.keys import (
    ADMIN_KEY_ENV,
    ADMIN_KEY_HEADER,
    SHM_KEY_ENV,
    SHM_KEY_HEADER,
    read_key,
)
from dispatch_service.core.backend_shm import tighten_regions
from dispatch_service.core.paths import MODEL_REPOSITORY, REPO_ROOT
from dispatch_service.core.signing import TRUSTED_KEYS_ENV, SigningError, TrustedKeys
from dispatch_service.ops.gpu import monitor as gpu_monitor
from dispatch_service.ops.health import Probe, deep_check, explain_missing
from dispatch_service.ops.host import (
    EXPOSURE_RISKS,
    clean_leftovers,
    describe_ports,
    die_with_parent,
    exposed_listeners,
    find_leftovers,
    new_shm_prefix,
    ports_in_use,
)
from dispatch_service.ops.keys import (
    ADMIN_KEY_FILE,
    SHM_KEY_FILE,
    AccessKeys,
    KeyFileError,
    load_or_create_keys,
    new_key,
)
from dispatch_service.ops.model_control import ModelControlError, load_model, ready_versions
from dispatch_service.ops.restart import CrashCounter, default_on_dead, end_process_group
from dispatch_service.ops.supervisor import Supervisor, SupervisorSettings
from dispatch_service.ops.verified_load import (
    LoadPlan,
    LoadVerifier,
    load_failures,
    plan_load,
    precompile,
)
from dispatch_service.serving.drain import DRAIN_FILE_ENV

__all__ = [
    "ADMIN_KEY_ENV",
    "ADMIN_KEY_HEADER",
    "EXIT_DEAD",
    "SHM_KEY_ENV",
    "SHM_KEY_HEADER",
    "TRUSTED_KEYS_ENV",
    "ChildService",
    "Ports",
    "ServerError",
    "ServerOptions",
    "TritonRuntime",
    "TritonServer",
    "build_parser",
    "main",
    "options_from_args",
    "resolve_keys",
    "run_until_stopped",
    "stop_on_signals",
]

EXIT_DEAD = 3  # the deep check failed for dead_after_s: let the process manager restart us

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def free(cls) -> Ports:
        """Three distinct loopback ports nobody listens on right now."""
        sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(3)]
        try:
            for sock in sockets:  # held open together, so the three differ
                sock.bind(("127.0.0.1", 0))
            http, grpc, metrics = (int(sock.getsockname()[1]) for sock in sockets)
        finally:
            for sock in sockets:
                sock.close()
        return cls(http, grpc, metrics)


@dataclass(frozen=True)
class TritonRuntime:
    """Where the server binary, its libraries and the Python backend folder are."""

    tritonserver: Path
    library_path: Path
    backend_dir: Path
    python_bin_dir: Path  # the stub finds numpy & co. through `python3` on PATH

    @classmethod
    def from_venv(cls, venv: Path | None = None, backend_dir: Path | None = None) -> TritonRuntime:
        """The wheel's server in ``venv`` (default: the running one) with the backend folder
        `make setup` lays out (default: `.triton/backends` of this repository)."""
        venv = venv or Path(sys.prefix)
        backend_dir = backend_dir or REPO_ROOT / ".triton" / "backends"
        site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
        return cls(
            tritonserver=site / "pytriton" / "tritonserver" / "bin" / "tritonserver",
            library_path=site / "nvidia_pytriton.libs",
            backend_dir=backend_dir,
            python_bin_dir=venv / "bin",
        )

    @classmethod
    def from_install(cls, tritonserver: Path, python_bin_dir: Path) -> TritonRuntime:
        """A stock install such as the NGC image's /opt/tritonserver/bin/tritonserver: its own
        lib/ and backends/ (which hold the native onnxruntime backend the `gpu` profile uses)."""
        root = tritonserver.resolve().parent.parent
        return cls(
            tritonserver=tritonserver,
            library_path=root / "lib",
            backend_dir=root / "backends",
            python_bin_dir=python_bin_dir,
        )

    def check(self) -> None:
        missing = [
            str(path)
            for path in (self.tritonserver, self.library_path, self.backend_dir / "python")
            if not path.exists()
        ]
        if missing:
            raise FileNotFoundError(
                f"Triton runtime incomplete ({', '.join(missing)} missing): run `make setup`"
            )


@dataclass
class ServerOptions:
    model_repository: Path = MODEL_REPOSITORY
    ports: Ports = field(default_factory=Ports)
    profile: str = "cpu"
    # Explicit control so operators can load/unload versions live; "*" loads everything.
    model_control: str = "explicit"
    load_models: Sequence[str] = ("*",)
    # The control groups are always locked (ops.keys): the admin key guards model-repository,
    # logging and trace (header `admin-key`), the shm key the shared-memory group (header
    # `shm-key`). None: a fresh random key for this server, readable from `options`.
    admin_key: str | None = None
    shm_key: str | None = None
    # A directory of trusted *.pub keys: only models whose versions verify are loaded
    # (dispatch_service.ops.verified_load). None: every model loads unverified (a warning).
    trusted_keys: Path | None = None
    extra_args: Sequence[str] = ()
    host: str = "127.0.0.1"
    # A non-loopback host is refused unless this is set: the embedded Triton 2.51 carries the
    # CVEs of section 5c of the design notes (EXPOSURE_RISKS); expose the patched image.
    expose: bool = False
    # Groups left open, for loopback measurements only: perf_analyzer cannot send the shm
    # key over gRPC (its -H reaches HTTP only), so `make bench` unlocks "shared-memory".
    unlocked_groups: Sequence[str] = ()
    # Entry points that must be loaded and answer a small window before start() returns
    # (ops.health); the launcher requires `dispatch` and `dispatch_fused` unless told others.
    required_models: Sequence[str] = ()
    # `gpu` profile only: Triton's pinned host pool (GPU<->CPU copies between ensemble steps)
    # and CUDA pool per GPU (GPU tensors between steps, CUDA shared-memory I/O). The largest
    # window's PAIR_FEATURES is 32768 x 28 x 4 B = 3.5 MiB: 512 MiB holds ~128 in flight.
    pinned_memory_pool_bytes: int = 512 << 20
    cuda_memory_pool_bytes: int = 512 << 20
    cuda_memory_pool_devices: Sequence[int] = (0,)

    def __post_init__(self) -> None:
        self.admin_key = self.admin_key or new_key()
        self.shm_key = self.shm_key or new_key()
        self.access_keys  # noqa: B018 -- validates the pair now, not at start

    @property
    def access_keys(self) -> AccessKeys:
        assert self.admin_key is not None and self.shm_key is not None
        return AccessKeys(admin=self.admin_key, shm=self.shm_key)


class ServerError(RuntimeError):
    pass


class ChildService:
    """A child process in its own process group, its output in a log file.

    Readiness is an HTTP URL answering 200; stopping signals the whole group (SIGTERM, then
    SIGKILL), so helper processes such as Triton's backend stubs go with it. Its own group
    shields the child from signals sent to ours, so it is told to stop when its parent dies
    (`host.die_with_parent`): a killed launcher never leaves a Triton behind.
    """

    def __init__(self, log_path: Path, name: str) -> None:
        self.log_path = log_path
        self.name = name
        self.process: subprocess.Popen[bytes] | None = None

    def spawn(
        self,
        command: Sequence[str],
        env: dict[str, str],
        cwd: Path | None = None,
        preamble: str = "",
    ) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            log.write(preamble.encode())
            log.flush()
            self.process = subprocess.Popen(
                list(command),
                cwd=cwd,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )

    @staticmethod
    def http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def wait_http_ok(self, url: str, timeout_s: float) -> None:
        """Wait until `url` answers 200; a dead child or the deadline raises ServerError."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise ServerError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if self.http_ok(url):
                return
            time.sleep(0.25)
        self.stop()
        raise ServerError(f"{self.name} not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path.exists() and not self.log_path.is_file():
            return f"(log goes to {self.log_path})"  # e.g. /dev/stdout in the images
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout_s: float = 20.0) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=timeout_s)
        end_process_group(process.pid)  # what a crash or the stop left of its group

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class TritonServer(ChildService):
    """A tritonserver child process; a context manager that always stops it."""

    shm_dir: ClassVar[Path] = Path("/dev/shm")
    # The drain gate's file (`serving.drain`), named once per server: a random folder
    # under the temporary directory, made (mode 0700) only when the gate closes.
    _drain_path: Path | None = None

    def __init__(self, runtime: TritonRuntime, options: ServerOptions, log_path: Path) -> None:
        super().__init__(log_path, "tritonserver")
        self.runtime = runtime
        self.options = options
        self.load_plan: LoadPlan | None = None  # set by start() when trusted keys are given
        # The Python backend's region names start with this: unique per server instance
        # (ops.host), so a server removes only its own regions and never another's.
        self.shm_prefix = new_shm_prefix()
        self.entry_points: list[Probe] = []  # the last deep check of required_models

    def stop(self, timeout_s: float = 20.0) -> None:
        """Stop the server, then remove the Python backend regions it left behind. Triton 2.51
        sometimes leaves one (4 MiB) in /dev/shm: one after each full integration-test run,
        not reproduced by any test module alone. With the server gone, nothing uses the
        prefix."""
        super().stop(timeout_s)
        if self.shm_dir.is_dir():
            for region in self.shm_dir.glob(f"{self.shm_prefix}*"):
                region.unlink(missing_ok=True)
        if self._drain_path is not None:  # the next start opens with a new gate
            shutil.rmtree(self._drain_path.parent, ignore_errors=True)
            self._drain_path = None

    def drain_file(self) -> Path:
        """Where the drain gate's file goes (``DISPATCH_DRAIN_FILE`` in the environment)."""
        if self._drain_path is None:
            folder = Path(tempfile.gettempdir()) / f"dispatch-drain-{secrets.token_hex(8)}"
            self._drain_path = folder / "draining"
        return self._drain_path

    def close_gate(self) -> None:
        """Make the entry points refuse new windows UNAVAILABLE (`serving.drain`): the first
        step of a drain. The folder is made here, mode 0700, and must not exist before."""
        path = self.drain_file()
        path.parent.mkdir(mode=0o700)
        path.touch(mode=0o600)

    def tighten_backend_regions(self) -> list[Path]:
        """Set to 0600 any Python-backend region of this server still named in /dev/shm
        (each stub of this repository's models removes its own name as it starts:
        `core.backend_shm`); the regions changed, each logged."""
        changed = tighten_regions(self.shm_prefix, self.shm_dir)
        for path in changed:
            logger.warning("set backend shared-memory region %s to mode 0600", path)
        return changed

    @property
    def admin_key(self) -> str | None:
        return self.options.admin_key

    @property
    def required_models(self) -> tuple[str, ...]:
        return tuple(self.options.required_models)

    @property
    def http_url(self) -> str:
        return f"{self.options.host}:{self.options.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.options.host}:{self.options.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.options.host}:{self.options.ports.metrics}/metrics"

    def command(self) -> list[str]:
        opts = self.options
        args = [
            str(self.runtime.tritonserver),
            f"--model-repository={opts.model_repository}",
            f"--backend-directory={self.runtime.backend_dir}",
            f"--http-address={opts.host}",
            f"--grpc-address={opts.host}",
            f"--metrics-address={opts.host}",
            f"--http-port={opts.ports.http}",
            f"--grpc-port={opts.ports.grpc}",
            f"--metrics-port={opts.ports.metrics}",
            f"--model-config-name={opts.profile}",
            f"--model-control-mode={opts.model_control}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            "--backend-config=python,shm-default-byte-size=4194304",
            "--backend-config=python,shm-growth-byte-size=4194304",
            "--strict-readiness=true",
            # Every config.pbtxt is complete (tests/unit/test_contracts.py holds them to the
            # contract): without this, each Python model load starts one more stub just to
            # ask model.py for a config, ~1 s a model (start 13.5 -> 6.4 s, stub reload 5.2
            # -> 2.1 s on the 2-core host).
            "--disable-auto-complete-config",
            "--exit-timeout-secs=10",
            "--log-verbose=0",
        ]
        if opts.load_models and opts.model_control != "explicit":
            raise ValueError("load_models needs model_control='explicit'")
        loads = self.load_plan.startup if self.load_plan is not None else opts.load_models
        args += [f"--load-model={name}" for name in loads]
        args += opts.access_keys.triton_args(opts.unlocked_groups)
        if opts.profile == "gpu":
            args.append(f"--pinned-memory-pool-byte-size={opts.pinned_memory_pool_bytes}")
            args += [
                f"--cuda-memory-pool-byte-size={device}:{opts.cuda_memory_pool_bytes}"
                for device in opts.cuda_memory_pool_devices
            ]
        args += list(opts.extra_args)
        if opts.unlocked_groups and exposed_listeners(args, self.environment()):
            raise ValueError("unlocked_groups is for loopback measurements only")
        return args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.runtime.python_bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["LD_LIBRARY_PATH"] = str(self.runtime.library_path)
        # The models that read artifacts verify them in their own initialize (every later
        # load included) exactly when this launcher verifies: never on a stray variable.
        env.pop(TRUSTED_KEYS_ENV, None)
        if self.options.trusted_keys is not None:
            env[TRUSTED_KEYS_ENV] = str(self.options.trusted_keys.resolve())
        env[DRAIN_FILE_ENV] = str(self.drain_file())
        return env

    def exposed_listeners(self) -> list[str]:
        """What the command line (``--host`` and every ``--triton-arg``) and environment would
        have Triton listen on beyond loopback (`host.exposed_listeners`); empty if nothing."""
        return exposed_listeners(self.command(), self.environment())

    def check_host(self) -> list[str]:
        """Refuse what must not start; clean what an earlier crash left. Touches nothing of
        another server: runs before the log is opened or any region is made."""
        opts = self.options
        exposed = self.exposed_listeners()
        if exposed and not opts.expose:
            raise ServerError(
                f"refusing to listen beyond loopback ({'; '.join(exposed)}): "
                f"{EXPOSURE_RISKS}. Pass --expose to do it anyway (the control endpoints stay "
                "locked behind their keys)."
            )
        ports = self.options.ports
        busy = ports_in_use(opts.host, (ports.http, ports.grpc, ports.metrics))
        if busy:
            raise ServerError(describe_ports(opts.host, busy))
        lines = clean_leftovers(find_leftovers(self.shm_dir))
        for line in lines:
            logger.warning(line)
        return lines

    def start(self, timeout_s: float = 120.0) -> TritonServer:
        self.runtime.check()
        notes = self.check_host()
        notes += self.plan_verified_load()
        self.spawn_skipping_failed_versions(notes, timeout_s)
        self.tighten_backend_regions()
        self.load_after_start()
        self.check_entry_points()
        return self

    def check_entry_points(self, timeout_s: float = 10.0) -> None:
        """Each required entry point must answer a small window; else stop and say why."""
        models = tuple(self.options.required_models)
        if not models:
            return
        self.entry_points = deep_check(self.grpc_url, models, timeout_s)
        failed = [p.model for p in self.entry_points if not p.ok]
        if not failed:
            return
        reasons = explain_missing(
            self.http_url, failed, self.options.admin_key, self.load_plan, timeout_s
        )
        lines = [
            f"  {p.model}: {reasons.get(p.model) or p.detail}"
            for p in self.entry_points
            if not p.ok
        ]
        self.stop()
        raise ServerError(
            f"required entry point(s) {', '.join(failed)} not serving:\n" + "\n".join(lines)
        )

    def plan_verified_load(self) -> list[str]:
        """Verify the repository's signatures (with trusted keys) and decide what loads.

        Returns the log lines: one per refused version and per refused or restricted model,
        or one warning that nothing is verified. Raises SigningError for an unusable key
        directory (missing, holding a bad key, or no key at all).
        """
        opts = self.options
        if opts.trusted_keys is None:
            self.load_plan = None
            line = json.dumps(
                {
                    "event": "signatures_not_verified",
                    "reason": "no trusted keys configured (--trusted-keys): models load unverified",
                }
            )
            logger.warning(line)
            return [line]
        trusted = TrustedKeys.from_directory(opts.trusted_keys)
        if not len(trusted):
            raise SigningError(f"no trusted keys (*.pub) in {opts.trusted_keys}")
        plan = plan_load(opts.model_repository, trusted, opts.profile, opts.load_models)
        self.load_plan = plan
        precompile(opts.model_repository, plan)
        lines = plan.log_lines()
        for line in lines:
            logger.warning(line)
        summary = json.dumps(
            {
                "event": "signatures_verified",
                "trusted_keys": sorted(trusted.keys),
                "load": list(plan.startup),
                "restricted": {name: list(v) for name, v in plan.restricted.items()},
                "deferred": list(plan.deferred),
                "refused": sorted(plan.refused),
            },
            sort_keys=True,
        )
        logger.info(summary)
        return [*lines, summary]

    def spawn_skipping_failed_versions(self, notes: list[str], timeout_s: float) -> None:
        """Start Triton and wait until it is ready. When it exits because a version failed
        to load (Triton's log says which, and why), start it again without that version, as
        a version refused by its signature is left out, and log the cause
        (``model_version_failed``); when another model cannot do without that version (the
        stable version dispatch_fused reads, a version an ensemble pins) or the model has
        none left, fail naming the version and its cause."""
        failed: dict[tuple[str, int], str] = {}
        while True:
            preamble = "".join(f"{n}\n" for n in notes)
            self.spawn(self.command(), self.environment(), preamble=preamble)
            try:
                self.wait_ready(timeout_s)
                return
            except ServerError as exc:
                found = load_failures(self.log_text())
                new = {key: cause for key, cause in found.items() if key not in failed}
                if not new:
                    if found:
                        raise ServerError(f"{_failures_text(found)}\n{exc}") from None
                    raise
                self.stop()
                failed.update(new)
                lines = self.plan_without(failed)
                for line in lines:
                    logger.warning(line)
                notes = [*notes, *lines]

    def plan_without(self, failed: dict[tuple[str, int], str]) -> list[str]:
        """Set the load plan to leave out the ``failed`` versions; the lines to log. Raises
        ServerError naming them and their causes when that leaves a model out."""
        opts = self.options
        trusted = (
            None if opts.trusted_keys is None else TrustedKeys.from_directory(opts.trusted_keys)
        )
        repository, profile, requested = opts.model_repository, opts.profile, opts.load_models
        before = plan_load(repository, trusted, profile, requested)
        plan = plan_load(repository, trusted, profile, requested, failed=failed)
        lost = {name: why for name, why in plan.refused.items() if name not in before.refused}
        if lost:
            raise ServerError(
                f"cannot start: {_failures_text(failed)}; without it: "
                + "; ".join(f"{name}: {why}" for name, why in sorted(lost.items()))
            )
        self.load_plan = plan
        return [line for line in plan.log_lines() if '"model_version_failed"' in line]

    def log_text(self) -> str:
        """Triton's whole log so far ("" when it goes elsewhere, e.g. /dev/stdout)."""
        try:
            return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""
        except OSError:
            return ""

    def load_verifier(self) -> LoadVerifier | None:
        """What every load after start is checked with on a verified server (the supervisor's
        reloads, a restart's live configs); None when this server does not verify."""
        opts = self.options
        if opts.trusted_keys is None:
            return None
        return LoadVerifier(opts.model_repository, TrustedKeys.from_directory(opts.trusted_keys))

    def load_after_start(self) -> None:
        """Load what the plan defers: restricted models with their override, then dependents."""
        plan = self.load_plan
        if plan is None:
            return
        key = self.options.admin_key
        try:
            for name in plan.restricted:
                load_model(self.http_url, name, plan.override_config(name), admin_key=key)
            for name in plan.deferred:
                load_model(self.http_url, name, admin_key=key)
            # Loading an ensemble re-reads its steps' folders; fail closed if that brought
            # back a version the plan refused.
            for name, versions in plan.restricted.items():
                serving = ready_versions(self.http_url, name, admin_key=key)
                if serving != tuple(sorted(versions)):
                    raise ModelControlError(
                        f"{name} serves versions {list(serving)}, verified {list(versions)}"
                    )
        except ModelControlError as exc:
            self.stop()
            raise ServerError(f"loading verified models after start failed: {exc}") from None

    def is_ready(self) -> bool:
        return self.http_ok(f"http://{self.http_url}/v2/health/ready")

    def wait_ready(self, timeout_s: float) -> None:
        self.wait_http_ok(f"http://{self.http_url}/v2/health/ready", timeout_s)

    def __enter__(self) -> TritonServer:
        return self.start()


def _failures_text(failed: dict[tuple[str, int], str]) -> str:
    return "; ".join(
        f"{model} version {version} failed to load ({cause})"
        for (model, version), cause in sorted(failed.items())
    )


def resolve_keys(args: argparse.Namespace, out: TextIO) -> AccessKeys:
    """The keys from flags, environment or files; what is still missing comes from (and is
    created in) the key folder, so no start runs open. Prints where the keys are."""
    admin = read_key(args.admin_key, ADMIN_KEY_ENV, file=args.admin_key_file)
    shm = read_key(args.shm_key, SHM_KEY_ENV, file=args.shm_key_file)
    if admin and shm:
        return AccessKeys(admin=admin, shm=shm)
    if args.no_create_keys:
        missing = [name for name, key in (("admin", admin), ("shared-memory", shm)) if not key]
        raise KeyFileError(
            f"no {' or '.join(missing)} key: set {ADMIN_KEY_ENV} and {SHM_KEY_ENV} (e.g. from "
            f"a Kubernetes Secret) or {ADMIN_KEY_ENV}_FILE and {SHM_KEY_ENV}_FILE"
        )
    stored, created = load_or_create_keys(args.key_dir)
    for path in created:
        print(f"created key file {path} (mode 0600)", file=out)
    keys = AccessKeys(admin=admin or stored.admin, shm=shm or stored.shm)
    if not admin:
        print(
            f"admin key (model-repository, logging, trace; header {ADMIN_KEY_HEADER!r}): "
            f"{args.key_dir / ADMIN_KEY_FILE}  -> export {ADMIN_KEY_ENV}_FILE=...",
            file=out,
        )
    if not shm:
        print(
            f"shared-memory key (header {SHM_KEY_HEADER!r}): {args.key_dir / SHM_KEY_FILE}  "
            f"-> export {SHM_KEY_ENV}_FILE=...",
            file=out,
        )
    return keys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Serve the dispatch model repository (loopback, control endpoints locked)"
    )
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
        default=REPO_ROOT / ".triton" / "server.log",
        help="tritonserver's log file (default %(default)s)",
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
        "--max-restarts",
        type=int,
        default=5,
        help="with --on-dead restart: after this many restarts within 10 minutes, stop and "
        "exit 3 instead (default %(default)s)",
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
        default="dispatch,dispatch_fused",
        help="entry points that must load and answer before ready (comma-separated; "
        "default dispatch,dispatch_fused; '' for none)",
    )
    gpu_monitor.add_gpu_monitor_arguments(parser)
    return parser


def options_from_args(args: argparse.Namespace, keys: AccessKeys) -> ServerOptions:
    """The server options a launcher command line asks for (images and tests read it too)."""
    return ServerOptions(
        model_repository=args.model_repository,
        ports=Ports(args.http_port, args.grpc_port, args.metrics_port),
        profile=args.profile,
        host=args.host,
        expose=args.expose,
        admin_key=keys.admin,
        shm_key=keys.shm,
        trusted_keys=None if args.trusted_keys is None else Path(args.trusted_keys),
        required_models=tuple(m for m in args.require.split(",") if m.strip()),
        extra_args=tuple(args.triton_arg),
    )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """`make serve`: start the server in the foreground and print the endpoints."""
    out = out or sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_restarts < 0:
        parser.error(f"--max-restarts must be >= 0, got {args.max_restarts}")
    gpu_settings = gpu_monitor.gpu_monitor_settings(parser, args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        keys = resolve_keys(args, out)
    except (KeyFileError, ValueError, OSError) as exc:
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
    try:
        server.start()
    except (ServerError, FileNotFoundError, SigningError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    monitor = gpu_monitor.start_gpu_monitor(
        server.http_url, gpu_settings, options.admin_key, act=args.profile == "gpu"
    )
    for entry in server.entry_points:
        print(entry.line(), file=out)
    health_port = args.metrics_port + 1 if args.health_port is None else args.health_port
    settings = SupervisorSettings(
        on_dead=default_on_dead(args.on_dead, args.tritonserver),
        max_restarts=args.max_restarts,
        drain_timeout_s=args.drain_timeout,
        health_host=args.host,
        health_port=health_port,
    )
    try:
        supervisor = Supervisor(server, settings, event_printer(out), server.load_verifier())
        supervisor.start()
        crashes = CrashCounter(server, lambda event: event_printer(out)(json.dumps(event)))
        supervisor.metric_sources.append(crashes.start().metrics_text)
    except OSError as exc:  # the health port is taken
        monitor.stop()
        server.stop()
        print(f"error: health endpoint on port {health_port}: {exc}", file=sys.stderr)
        return 1
    # Before "ready:": a signal sent as soon as it is read must drain, not kill the launcher
    # with its default action.
    stop = stop_on_signals()
    print(
        f"ready: HTTP http://{server.http_url}  gRPC {server.grpc_url}  "
        f"metrics {server.metrics_url}  health {supervisor.health_url}/readyz\n"
        "Ctrl-C or SIGTERM drains and stops it.",
        flush=True,
        file=out,
    )
    try:
        return run_until_stopped(server, supervisor, out, stop)
    finally:
        crashes.stop()
        monitor.stop()
        server.stop()  # whatever ended the loop: never leave a Triton behind


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
    drained = supervisor.drain_and_stop()
    event_printer(out)(f"tritonserver stopped (drained {drained:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
