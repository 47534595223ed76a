"""Start and stop this repository's tritonserver (the `cpu` profile's embedded Triton 2.51).

Used by `make serve`, the integration-test fixture and the benchmarks, so all three start
the server the same way. The runtime comes from the `nvidia-pytriton` wheel in the venv;
`scripts/setup.sh` lays out its Python backend folder. The launcher's command line
(`make serve`, ``python -m dispatch_service.ops.server``) is `server_cli`.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

from dispatch_contract.keys import PRIORITY_KEY_DIGEST_ENV, PRIORITY_KEY_ENV, PRIORITY_KEY_FILE_ENV
from dispatch_service.core.backend_shm import tighten_regions
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.signing import TRUSTED_KEYS_ENV
from dispatch_service.ops.child_process import (
    LOG_READ_BYTES,
    ChildService,
    ServerError,
    read_log,
)
from dispatch_service.ops.first_instances import FirstInstanceRepository
from dispatch_service.ops.health import Probe, deep_check, explain_missing
from dispatch_service.ops.host import (
    EXPOSURE_RISKS,
    clean_leftovers,
    describe_ports,
    exposed_listeners,
    find_leftovers,
    new_shm_prefix,
    ports_in_use,
    stop_orphaned_servers,
)
from dispatch_service.ops.keys import AccessKeys, new_key
from dispatch_service.ops.repository_copy import RepositoryCopy
from dispatch_service.ops.server_loads import PlannedLoads, failures_text
from dispatch_service.ops.triton_runtime import Ports, TritonRuntime
from dispatch_service.ops.verified_load import (
    LoadPlan,
    load_failures,
)
from dispatch_service.outcomes.store import OUTCOME_STORE_ENV
from dispatch_service.routing.live import ROUTING_FILE_ENV
from dispatch_service.serving.drain import DRAIN_FILE_ENV

__all__ = [
    "TRUSTED_KEYS_ENV",
    "Ports",
    "ServerOptions",
    "TritonRuntime",
    "TritonServer",
]

logger = logging.getLogger(__name__)

# How long a start waits for the ports of an orphaned server it stopped to be free.
ORPHAN_PORTS_WAIT_S = 15.0
# Models (each version counts) Triton loads at once: more than the repository holds.
MODEL_LOAD_THREADS = 16
# Triton's HTTP threads: more than the loads a start sends at once.
HTTP_THREADS = 16


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
    # Entitles a window to the priority lane (`dispatch_contract.keys`); the lane's stubs
    # get its SHA-256. None: a fresh key only the launcher's probes hold.
    priority_key: str | None = None
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
    # (ops.health); the launcher requires `dispatch`, `dispatch_fused` and `dispatch_priority`
    # unless told others.
    required_models: Sequence[str] = ()
    # `gpu` profile only: Triton's pinned host pool (GPU<->CPU copies between ensemble steps)
    # and CUDA pool per GPU (GPU tensors between steps, CUDA shared-memory I/O). The largest
    # window's PAIR_FEATURES is 32768 x 28 x 4 B = 3.5 MiB: 512 MiB holds ~128 in flight.
    pinned_memory_pool_bytes: int = 512 << 20
    cuda_memory_pool_bytes: int = 512 << 20
    cuda_memory_pool_devices: Sequence[int] = (0,)
    # Both entry points route by a file the launcher writes (`routing.live`): a fleet
    # replica's, which changes routing without reloading a model. False: the configs' routing.
    live_routing: bool = False
    # Where the entry points write their decision records (`outcomes`): an SQLite file or a
    # PostgreSQL URL, handed to the stubs in their environment. None: no records.
    outcome_store: str | None = None

    def __post_init__(self) -> None:
        self.admin_key = self.admin_key or new_key()
        self.shm_key = self.shm_key or new_key()
        self.priority_key = self.priority_key or new_key()
        self.access_keys  # noqa: B018 -- validates the pair now, not at start

    @property
    def access_keys(self) -> AccessKeys:
        assert self.admin_key and self.shm_key and self.priority_key
        return AccessKeys(admin=self.admin_key, shm=self.shm_key, priority=self.priority_key)


class TritonServer(ChildService, PlannedLoads):
    """A tritonserver child process; a context manager that always stops it."""

    options: ServerOptions

    shm_dir: ClassVar[Path] = Path("/dev/shm")
    # The drain gate's file (`serving.drain`), named once per server: a random folder
    # under the temporary directory, made (mode 0700) only when the gate closes.
    _drain_path: Path | None = None
    # The live routing's file (`routing.live`), in a folder made (mode 0700) at the first
    # start and kept while the launcher runs: a restarted Triton routes as before.
    _routing_path: Path | None = None

    def __init__(self, runtime: TritonRuntime, options: ServerOptions, log_path: Path) -> None:
        super().__init__(log_path, "tritonserver")
        self.runtime = runtime
        self.options = options
        self.load_plan: LoadPlan | None = None  # set by start() when trusted keys are given
        # With trusted keys, Triton reads the launcher's private copy of the repository, made
        # of the bytes that were verified (`verified_load.RepositoryCopy`), kept until
        # `release`: every start and every later load refresh it before Triton reads it.
        self.repository_copy: RepositoryCopy | None = None
        # The Python backend's region names start with this: unique per server instance
        # (ops.host), so a server removes only its own regions and never another's.
        self.shm_prefix = new_shm_prefix()
        self.entry_points: list[Probe] = []  # the last deep check of required_models
        # A restart's view of the served repository, each model of several instances cut to
        # its first (`first_instances`); Triton reads it while this process runs.
        self.first_instances: FirstInstanceRepository | None = None

    def stop(self, timeout_s: float = 20.0, *, graceful: bool = True) -> None:
        """Stop the server, then remove the Python backend regions it left behind. Triton 2.51
        sometimes leaves one (4 MiB) in /dev/shm: one after each full integration-test run,
        not reproduced by any test module alone. With the server gone, nothing uses the
        prefix."""
        super().stop(timeout_s, graceful=graceful)
        if self.shm_dir.is_dir():
            for region in self.shm_dir.glob(f"{self.shm_prefix}*"):
                region.unlink(missing_ok=True)
        if self._drain_path is not None:  # the next start opens with a new gate
            shutil.rmtree(self._drain_path.parent, ignore_errors=True)
            self._drain_path = None
        if self.first_instances is not None:
            self.first_instances.remove()
            self.first_instances = None

    def drain_file(self) -> Path:
        """Where the drain gate's file goes (``DISPATCH_DRAIN_FILE`` in the environment)."""
        if self._drain_path is None:
            folder = Path(tempfile.gettempdir()) / f"dispatch-drain-{secrets.token_hex(8)}"
            self._drain_path = folder / "draining"
        return self._drain_path

    def routing_file(self) -> Path | None:
        """Where the live routing goes (``DISPATCH_ROUTING_FILE`` in the environment); None
        without `ServerOptions.live_routing`."""
        if self.options.live_routing and self._routing_path is None:
            folder = Path(tempfile.gettempdir()) / f"dispatch-routing-{secrets.token_hex(8)}"
            folder.mkdir(mode=0o700)
            self._routing_path = folder / "routing.json"
        return self._routing_path

    @property
    def source_repository(self) -> Path:
        """The repository the plan reads: the verified copy on a verified server."""
        copy = self.repository_copy
        return self.options.model_repository if copy is None else copy.repository

    @property
    def served_repository(self) -> Path:
        """The folder Triton reads: `source_repository`, seen through `first_instances`
        after a restart's start."""
        cut = self.first_instances
        return self.source_repository if cut is None else cut.root

    def release(self) -> None:
        """Remove what outlives a stop for a restart: the live routing and the repository
        copy. The launcher is done with this server."""
        self.remove_routing_file()
        if self.repository_copy is not None:
            self.repository_copy.remove()
            self.repository_copy = None

    def remove_routing_file(self) -> None:
        """Remove the live routing's folder: the launcher is done with this server."""
        if self._routing_path is not None:
            shutil.rmtree(self._routing_path.parent, ignore_errors=True)
            self._routing_path = None

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
    def priority_key(self) -> str | None:
        """The priority key the deep checks send to the priority lane."""
        return self.options.priority_key

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
            f"--model-repository={self.served_repository}",
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
            # Instances are chosen by their config's `rate_limiter { priority }` (no resources
            # are set, so nothing is rate-limited): the free instance with the fewest
            # executions x priority runs the next batch. Each multi-instance config gives one
            # instance priority 1, so at low load one warm stub takes every window instead
            # of all of them in turn, each cold after waiting for the others.
            "--rate-limit=execution_count",
            # Every model and version loads at once: with Triton's default (4 at a time) the
            # ensemble's steps began only once the first four were loaded, 20-40 s into a
            # restart on a loaded 2-core host.
            f"--model-load-thread-count={MODEL_LOAD_THREADS}",
            # The loads a start sends at once (`load_after_start`) run side by side: with
            # 2.51's default here (2 threads on 2 cores) they ran two at a time.
            f"--http-thread-count={HTTP_THREADS}",
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
        # The regions the Python backend makes in /dev/shm are born 0600 and stay so
        # (native/private_shm.c); the stubs inherit the variable.
        shim = self.runtime.preload()
        if shim is not None:
            env["LD_PRELOAD"] = " ".join(filter(None, (str(shim), env.get("LD_PRELOAD"))))
        # The models that read artifacts verify them in their own initialize (every later
        # load included) exactly when this launcher verifies: never on a stray variable.
        env.pop(TRUSTED_KEYS_ENV, None)
        if self.options.trusted_keys is not None:
            env[TRUSTED_KEYS_ENV] = str(self.options.trusted_keys.resolve())
        env[DRAIN_FILE_ENV] = str(self.drain_file())
        # The stubs check the priority key by its digest; the key itself stays out.
        for name in (PRIORITY_KEY_ENV, PRIORITY_KEY_FILE_ENV):
            env.pop(name, None)
        env[PRIORITY_KEY_DIGEST_ENV] = self.options.access_keys.priority_digest
        env.pop(OUTCOME_STORE_ENV, None)
        if self.options.outcome_store:
            env[OUTCOME_STORE_ENV] = self.options.outcome_store
        env.pop(ROUTING_FILE_ENV, None)
        routing = self.routing_file()
        if routing is not None:
            env[ROUTING_FILE_ENV] = str(routing)
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
        # A server of this repository whose launcher died holds the ports for seconds
        # while it stops: ended first, so a start right after a `kill -9` succeeds.
        lines = stop_orphaned_servers((ports.http, ports.grpc, ports.metrics))
        for line in lines:
            logger.warning(line)
        busy = ports_in_use(opts.host, (ports.http, ports.grpc, ports.metrics))
        deadline = time.monotonic() + ORPHAN_PORTS_WAIT_S
        while busy and lines and time.monotonic() < deadline:  # going with the orphan
            time.sleep(0.2)
            busy = ports_in_use(opts.host, (ports.http, ports.grpc, ports.metrics))
        if busy:
            raise ServerError(describe_ports(opts.host, busy))
        cleaned = clean_leftovers(find_leftovers(self.shm_dir))
        for line in cleaned:
            logger.warning(line)
        return lines + cleaned

    def start(
        self,
        timeout_s: float = 120.0,
        *,
        first_instances: bool = False,
        live: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> TritonServer:
        """Start Triton, load what the plan defers, and check every required entry point.
        ``first_instances``: each Python model of several instances starts with its first
        instance alone (`plan_load`), the rest for `add_instances` once ready; ``live``
        (model -> config in Triton's JSON form) the configs those of the models Triton
        loads as it starts start with (`first_instances.FirstInstanceRepository`)."""
        self.runtime.check()
        notes = self.check_host()
        notes += self.plan_verified_load(first_instances=first_instances)
        plan = self.load_plan
        if self.first_instances is not None:  # an earlier start's, never a stale view
            self.first_instances.remove()
            self.first_instances = None
        if plan is not None and plan.first_instance:
            at_start = {
                name: config
                for name, config in (live or {}).items()
                if name in plan.startup and name not in plan.restricted
            }
            self.first_instances = FirstInstanceRepository(
                self.source_repository, plan.first_instance, self.options.profile, at_start
            )
        self.spawn_skipping_failed_versions(notes, timeout_s)
        self.tighten_backend_regions()
        self.load_after_start()
        self.check_entry_points()
        return self

    def start_first_instances(
        self,
        timeout_s: float = 120.0,
        live: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> TritonServer:
        """A restart's start: ready on one instance a model (`start`; Triton reads
        `first_instances.FirstInstanceRepository`), in about half the CPU of a full start
        (each stub is a Python interpreter importing the library); `add_instances` brings
        the others once it serves. ``live``: the configs `deploy` and `rollback` had set,
        started with (no reload of new stubs once ready)."""
        return self.start(timeout_s, first_instances=True, live=live)

    def check_entry_points(self, timeout_s: float = 10.0) -> None:
        """Each required entry point must answer a small window; else stop and say why."""
        models = tuple(self.options.required_models)
        if not models:
            return
        self.entry_points = deep_check(self.grpc_url, models, timeout_s, self.priority_key)
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

    def spawn_skipping_failed_versions(self, notes: list[str], timeout_s: float) -> None:
        """Start Triton and wait until it is ready. When it exits because a version failed
        to load (Triton's log says which, and why), start it again without that version, as
        a version refused by its signature is left out, and log the cause
        (``model_version_failed``); when another model cannot do without that version (the
        stable version dispatch_fused reads, a version an ensemble pins) or the model has
        none left, fail naming the version and its cause.

        A Triton that died of a signal while starting, no version's failure in its log, is
        started once more, the cause logged (``server_start_retried``): under heavy load
        2.51 aborted now and then at start (SIGABRT after gRPC's "epoll_wait error: Bad file
        descriptor"), and passed at the next start."""
        failed: dict[tuple[str, int], str] = {}
        retried = False
        while True:
            preamble = "".join(f"{n}\n" for n in notes)
            self.spawn(self.command(), self.environment(), preamble=preamble)
            process = self.process
            try:
                self.wait_ready(timeout_s)
                return
            except ServerError as exc:
                found = load_failures(self.log_text())
                new = {key: cause for key, cause in found.items() if key not in failed}
                # Died of a signal by itself (not the stop after a timeout, not an exit).
                died = process is not None and process.pid not in self.stopped_pids
                code = process.poll() if died and process is not None else None
                if not new and not found and not retried and code is not None and code < 0:
                    retried = True
                    line = json.dumps(
                        {
                            "event": "server_start_retried",
                            "cause": f"tritonserver died of {signal.Signals(-code).name} "
                            "while starting",
                            "log_tail": self.log_tail(5),
                        }
                    )
                    logger.warning(line)
                    self.stop()
                    notes = [*notes, line]
                    continue
                if not new:
                    if found:
                        raise ServerError(f"{failures_text(found)}\n{exc}") from None
                    raise
                self.stop()
                failed.update(new)
                lines = self.plan_without(failed)
                for line in lines:
                    logger.warning(line)
                notes = [*notes, *lines]

    def log_text(self) -> str:
        """The last `LOG_READ_BYTES` of Triton's log ("" when it goes elsewhere, e.g.
        /dev/stdout): a start's load failures are at its end."""
        return read_log(self.log_path, -LOG_READ_BYTES)[0].decode(errors="replace")

    def is_ready(self) -> bool:
        return self.http_ok(f"http://{self.http_url}/v2/health/ready")

    def wait_ready(self, timeout_s: float) -> None:
        self.wait_http_ok(f"http://{self.http_url}/v2/health/ready", timeout_s)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        super().__exit__(exc_type, exc, tb)
        self.release()


if __name__ == "__main__":  # `python -m dispatch_service.ops.server`: the launcher's command line
    runpy.run_module("dispatch_service.ops.server_cli", run_name="__main__")
