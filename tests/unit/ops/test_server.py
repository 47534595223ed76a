"""Behaviour of dispatch_service.ops.server without a real tritonserver.

A stand-in "tritonserver" (a small script written to tmp_path: fake_tritonserver.py) plays
the binary: one that fails at once, one that never becomes ready, and one that answers the
readiness probe. The launcher's command line is test_server_cli.py's; integration tests start
the real server.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest
from fake_tritonserver import FAKE_READY_SERVER, make_runtime

from dispatch_service.ops.child_process import ServerError
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from dispatch_service.routing.live import ROUTING_FILE_ENV


def make_server(tmp_path: Path, runtime: TritonRuntime) -> TritonServer:
    options = ServerOptions(model_repository=tmp_path / "repo", ports=Ports.free())
    return TritonServer(runtime, options, tmp_path / "logs" / "server.log")


# ---- ports ---------------------------------------------------------------------------


def test_default_ports() -> None:
    assert Ports() == Ports(http=8000, grpc=8001, metrics=8002)


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = Ports.free()
    chosen = [ports.http, ports.grpc, ports.metrics]
    assert len(set(chosen)) == 3
    for port in chosen:
        assert 0 < port < 65536
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


# ---- runtime -------------------------------------------------------------------------


def test_runtime_from_venv_points_into_the_pytriton_wheel(tmp_path: Path) -> None:
    runtime = TritonRuntime.from_venv(tmp_path / "venv", tmp_path / "backends")
    site = tmp_path / "venv" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = site / "site-packages"
    assert runtime.tritonserver == site / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    assert runtime.library_path == site / "nvidia_pytriton.libs"
    assert runtime.backend_dir == tmp_path / "backends"
    assert runtime.python_bin_dir == tmp_path / "venv" / "bin"


def test_check_names_every_missing_path_and_suggests_make_setup(tmp_path: Path) -> None:
    runtime = make_runtime(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        runtime.check()
    message = str(info.value)
    for path in (runtime.tritonserver, runtime.library_path, runtime.backend_dir / "python"):
        assert str(path) in message
    assert "make setup" in message


def test_check_names_only_what_is_missing(tmp_path: Path) -> None:
    runtime = make_runtime(tmp_path, "#!/bin/sh\n")
    runtime.check()
    (runtime.backend_dir / "python").rmdir()
    with pytest.raises(FileNotFoundError) as info:
        runtime.check()
    assert str(runtime.backend_dir / "python") in str(info.value)
    assert str(runtime.tritonserver) not in str(info.value)


# ---- command and environment ---------------------------------------------------------


def test_command_carries_repository_backends_ports_and_profile(tmp_path: Path) -> None:
    runtime = make_runtime(tmp_path)
    options = ServerOptions(
        model_repository=tmp_path / "repo", ports=Ports(9100, 9101, 9102), profile="gpu"
    )
    command = TritonServer(runtime, options, tmp_path / "log").command()
    assert command[0] == str(runtime.tritonserver)
    for flag in (
        f"--model-repository={tmp_path / 'repo'}",
        f"--backend-directory={runtime.backend_dir}",
        "--http-port=9100",
        "--grpc-port=9101",
        "--metrics-port=9102",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--metrics-address=127.0.0.1",
        "--model-config-name=gpu",
        "--model-control-mode=explicit",
        "--load-model=*",
        # Instances are picked by their configured priority (a warm one first), nothing
        # rate-limited: no config sets resources (tests/unit/contract/test_contracts.py).
        "--rate-limit=execution_count",
    ):
        assert flag in command


def restricted(command: list[str]) -> dict[str, dict[str, str]]:
    """flag -> {group: 'header=key'} for every restricted-group flag of a command."""
    found: dict[str, dict[str, str]] = {}
    for arg in command:
        flag, _, spec = arg.partition("=")
        if flag in ("--http-restricted-api", "--grpc-restricted-protocol"):
            groups, _, header_key = spec.partition(":")
            for group in groups.split(","):
                assert group not in found.setdefault(flag, {}), f"{group} restricted twice"
                found[flag][group] = header_key
    return found


def test_every_server_locks_the_control_groups_with_fresh_keys(tmp_path: Path) -> None:
    runtime = make_runtime(tmp_path)
    first, second = ServerOptions(), ServerOptions()
    assert first.admin_key and first.shm_key and first.admin_key != first.shm_key
    assert first.admin_key != second.admin_key  # random per server, never a shared default
    command = TritonServer(runtime, first, tmp_path / "log").command()
    admin, shm = f"admin-key={first.admin_key}", f"shm-key={first.shm_key}"
    expected = {"model-repository": admin, "logging": admin, "trace": admin, "shared-memory": shm}
    locks = restricted(command)
    assert locks == {"--http-restricted-api": expected, "--grpc-restricted-protocol": expected}


def test_given_keys_restrict_the_groups(tmp_path: Path) -> None:
    options = ServerOptions(admin_key="s3cret", shm_key="sh4red")
    command = TritonServer(make_runtime(tmp_path), options, tmp_path / "log").command()
    assert "--http-restricted-api=model-repository,logging,trace:admin-key=s3cret" in command
    assert "--grpc-restricted-protocol=shared-memory:shm-key=sh4red" in command


@pytest.mark.parametrize(
    ("admin", "shm"), [("same", "same"), ("a b", "x"), ("a", "x:y"), ("a,b", "x")]
)
def test_unusable_key_pairs_are_refused(admin: str, shm: str) -> None:
    with pytest.raises(ValueError, match="key"):
        ServerOptions(admin_key=admin, shm_key=shm)


def test_load_models_need_explicit_control(tmp_path: Path) -> None:
    options = ServerOptions(model_control="none")
    with pytest.raises(ValueError, match="explicit"):
        TritonServer(make_runtime(tmp_path), options, tmp_path / "log").command()


def test_command_defaults_to_the_cpu_profile(tmp_path: Path) -> None:
    server = TritonServer(make_runtime(tmp_path), ServerOptions(), tmp_path / "log")
    assert "--model-config-name=cpu" in server.command()


def shm_prefix(server: TritonServer) -> str:
    (arg,) = [a for a in server.command() if "shm-region-prefix-name=" in a]
    assert arg.startswith("--backend-config=python,")
    return arg.split("shm-region-prefix-name=", 1)[1]


def test_shm_region_prefix_is_unique_per_server_instance(tmp_path: Path) -> None:
    runtime = make_runtime(tmp_path)

    def server() -> TritonServer:
        return TritonServer(runtime, ServerOptions(ports=Ports(9000, 1, 2)), tmp_path / "log")

    one, two = server(), server()
    assert shm_prefix(one) == one.shm_prefix
    assert one.shm_prefix != two.shm_prefix  # same ports, different instances
    assert one.shm_prefix.startswith(f"dispatchsrv_{os.getpid()}_")


def test_explicit_mode_loads_the_named_models(tmp_path: Path) -> None:
    options = ServerOptions(
        model_control="explicit",
        load_models=("feature_encoder", "dispatch_model"),
        extra_args=("--log-info=true",),
    )
    command = TritonServer(make_runtime(tmp_path), options, tmp_path / "log").command()
    assert "--model-control-mode=explicit" in command
    loads = [arg for arg in command if arg.startswith("--load-model")]
    assert loads == ["--load-model=feature_encoder", "--load-model=dispatch_model"]
    assert command[-1] == "--log-info=true"


def test_urls_use_host_and_ports(tmp_path: Path) -> None:
    options = ServerOptions(ports=Ports(1, 2, 3), host="10.0.0.5")
    server = TritonServer(make_runtime(tmp_path), options, tmp_path / "log")
    assert server.http_url == "10.0.0.5:1"
    assert server.grpc_url == "10.0.0.5:2"
    assert server.metrics_url == "http://10.0.0.5:3/metrics"
    assert "--http-address=10.0.0.5" in server.command()


def test_environment_puts_the_venv_first_and_sets_the_library_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", "/usr/local/bin:/usr/bin")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/elsewhere")
    monkeypatch.setenv("DISPATCH_TEST_MARKER", "kept")
    runtime = make_runtime(tmp_path)
    env = TritonServer(runtime, ServerOptions(), tmp_path / "log").environment()
    assert env["PATH"].split(os.pathsep) == [
        str(runtime.python_bin_dir),
        "/usr/local/bin",
        "/usr/bin",
    ]
    assert env["LD_LIBRARY_PATH"] == str(runtime.library_path)
    assert env["DISPATCH_TEST_MARKER"] == "kept"
    assert os.environ["PATH"] == "/usr/local/bin:/usr/bin"


def test_the_live_routing_file_is_named_only_for_a_fleet_replica_in_a_private_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ROUTING_FILE_ENV, str(tmp_path / "stray.json"))
    runtime = make_runtime(tmp_path)
    plain = TritonServer(runtime, ServerOptions(), tmp_path / "log")
    assert ROUTING_FILE_ENV not in plain.environment() and plain.routing_file() is None
    replica = TritonServer(runtime, ServerOptions(live_routing=True), tmp_path / "log")
    path = replica.routing_file()
    assert path is not None and replica.environment()[ROUTING_FILE_ENV] == str(path)
    assert replica.routing_file() == path  # one file while the launcher runs
    assert path.parent.stat().st_mode & 0o777 == 0o700
    replica.remove_routing_file()
    assert not path.parent.exists()


def test_the_models_verify_exactly_when_the_launcher_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trusted keys reach the models' own initialize through the server's environment;
    a stray variable in the caller's shell never turns verification on or points it
    elsewhere."""
    monkeypatch.setenv("DISPATCH_TRUSTED_KEYS", "/somewhere/else")
    runtime = make_runtime(tmp_path)
    env = TritonServer(runtime, ServerOptions(), tmp_path / "log").environment()
    assert "DISPATCH_TRUSTED_KEYS" not in env
    keys = tmp_path / "keys"
    options = ServerOptions(trusted_keys=keys)
    env = TritonServer(runtime, options, tmp_path / "log").environment()
    assert env["DISPATCH_TRUSTED_KEYS"] == str(keys.resolve())


# ---- start and stop ------------------------------------------------------------------


def test_start_checks_the_runtime_first(tmp_path: Path) -> None:
    server = make_server(tmp_path, make_runtime(tmp_path))
    with pytest.raises(FileNotFoundError, match="make setup"):
        server.start(timeout_s=5)
    assert server.process is None


def test_a_server_that_exits_raises_with_the_log_tail(tmp_path: Path) -> None:
    script = "#!/bin/sh\necho 'error: unrecognized option --bogus' >&2\nexit 3\n"
    server = make_server(tmp_path, make_runtime(tmp_path, script))
    with pytest.raises(ServerError) as info:
        server.start(timeout_s=60)
    message = str(info.value)
    assert "tritonserver exited with 3" in message
    assert "error: unrecognized option --bogus" in message
    assert server.log_path.exists()


def test_a_server_that_never_gets_ready_is_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = f"#!/bin/sh\necho $$ > {pid_file}\necho 'still loading models'\nexec sleep 60\n"
    server = make_server(tmp_path, make_runtime(tmp_path, script))
    with pytest.raises(ServerError) as info:
        server.start(timeout_s=1.5)
    assert "not ready after" in str(info.value)
    assert "still loading models" in str(info.value)
    assert server.process is None
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


def test_a_ready_server_runs_until_the_context_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "report.json"
    monkeypatch.setenv("FAKE_TRITON_REPORT", str(report))
    runtime = make_runtime(tmp_path, f"#!{sys.executable}\n{FAKE_READY_SERVER}")
    server = make_server(tmp_path, runtime)

    with server as running:
        assert running is server
        assert server.is_ready()
        process = server.process
        assert process is not None and process.poll() is None
        seen = json.loads(report.read_text())
    assert seen["argv"] == server.command()
    assert seen["env"]["PATH"].startswith(f"{runtime.python_bin_dir}{os.pathsep}")
    assert seen["env"]["LD_LIBRARY_PATH"] == str(runtime.library_path)

    assert server.process is None
    assert process.returncode is not None
    assert not server.is_ready()
    assert "fake tritonserver listening" in server.log_tail()
    server.stop()  # stopping twice is harmless


def test_log_tail_keeps_the_last_lines(tmp_path: Path) -> None:
    server = make_server(tmp_path, make_runtime(tmp_path))
    assert server.log_tail() == "(no log)"
    server.log_path.parent.mkdir(parents=True)
    server.log_path.write_text("".join(f"line {i}\n" for i in range(100)))
    assert server.log_tail(3) == "line 97\nline 98\nline 99"


def test_stop_without_start_does_nothing(tmp_path: Path) -> None:
    server = make_server(tmp_path, make_runtime(tmp_path))
    server.stop()
    assert server.process is None


def test_stop_removes_only_this_servers_python_backend_regions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(TritonServer, "shm_dir", shm)
    runtime = make_runtime(tmp_path)
    server = TritonServer(runtime, ServerOptions(ports=Ports(8123, 1, 2)), tmp_path / "log")
    other = TritonServer(runtime, ServerOptions(ports=Ports(8123, 1, 2)), tmp_path / "log")
    ours = [f"{server.shm_prefix}a1", f"{server.shm_prefix}b2"]
    kept = [f"{other.shm_prefix}c3", "dispatch_client_1_0_in"]
    for name in ours + kept:
        (shm / name).write_bytes(b"x")
    server.stop()  # never started: nothing to stop, the leftovers still go
    assert sorted(p.name for p in shm.iterdir()) == sorted(kept)


def test_an_unlocked_group_is_for_loopback_measurements_only(tmp_path: Path) -> None:
    runtime = make_runtime(tmp_path)
    options = ServerOptions(unlocked_groups=("shared-memory",))
    locks = restricted(TritonServer(runtime, options, tmp_path / "log").command())
    assert set(locks["--grpc-restricted-protocol"]) == {"model-repository", "logging", "trace"}
    exposed = ServerOptions(unlocked_groups=("shared-memory",), host="0.0.0.0", expose=True)
    with pytest.raises(ValueError, match="loopback"):
        TritonServer(runtime, exposed, tmp_path / "log").command()
    with pytest.raises(ValueError, match="unknown endpoint group"):
        TritonServer(
            runtime, ServerOptions(unlocked_groups=("inference",)), tmp_path / "l"
        ).command()


def test_a_non_loopback_host_is_refused_without_expose_and_says_why(tmp_path: Path) -> None:
    runtime = make_runtime(tmp_path, "#!/bin/sh\nexit 0\n")
    server = TritonServer(runtime, ServerOptions(host="0.0.0.0"), tmp_path / "log")
    with pytest.raises(ServerError) as info:
        server.start(timeout_s=5)
    for cve in ("CVE-2025-23310", "CVE-2025-23311", "CVE-2025-23319", "CVE-2025-23334"):
        assert cve in str(info.value)
    assert "--expose" in str(info.value)
    assert server.process is None and not server.log_path.exists()


@pytest.mark.parametrize(
    "extra",
    [
        ("--metrics-address=0.0.0.0",),
        ("--grpc-address", "0.0.0.0"),
        ("--http-addr=10.0.0.5",),
        ("--allow-sagemaker=true",),
    ],
)
def test_a_triton_arg_binding_beyond_loopback_is_refused_without_expose(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    runtime = make_runtime(tmp_path, "#!/bin/sh\nexit 0\n")
    server = TritonServer(runtime, ServerOptions(extra_args=extra), tmp_path / "log")
    with pytest.raises(ServerError) as info:
        server.start(timeout_s=5)
    assert " ".join(extra) in str(info.value) and "--expose" in str(info.value)
    assert server.process is None and not server.log_path.exists()


def test_vertex_ai_from_the_environment_is_refused_without_expose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    runtime = make_runtime(tmp_path, "#!/bin/sh\nexit 0\n")
    server = TritonServer(runtime, ServerOptions(), tmp_path / "log")
    with pytest.raises(ServerError, match="AIP_MODE=PREDICTION"):
        server.start(timeout_s=5)
    assert server.process is None


def test_an_unlocked_group_refuses_a_triton_arg_beyond_loopback(tmp_path: Path) -> None:
    options = ServerOptions(
        unlocked_groups=("shared-memory",), extra_args=("--grpc-address=0.0.0.0",), expose=True
    )
    with pytest.raises(ValueError, match="loopback"):
        TritonServer(make_runtime(tmp_path), options, tmp_path / "log").command()


def test_ports_in_use_are_refused_before_the_log_is_touched(tmp_path: Path) -> None:
    runtime = make_runtime(tmp_path, "#!/bin/sh\nexit 0\n")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        free = Ports.free()
        options = ServerOptions(ports=Ports(free.http, taken, free.metrics))
        server = TritonServer(runtime, options, tmp_path / "log")
        server.log_path.write_text("the first server's log\n")
        with pytest.raises(ServerError, match=f"port\\(s\\) {taken} .* already in use"):
            server.start(timeout_s=5)
    assert server.process is None
    assert server.log_path.read_text() == "the first server's log\n"


def test_a_start_that_died_of_a_signal_is_retried_once_with_its_cause_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Under heavy load 2.51 aborted at start now and then (SIGABRT, gRPC "epoll_wait error:
    Bad file descriptor"): one more start, the cause logged. A second abort fails."""
    marker = tmp_path / "aborted-once"
    script = (
        f"#!/bin/sh\nif [ ! -e {marker} ]; then touch {marker}; echo 'epoll_wait error'; "
        f"kill -ABRT $$; fi\nexec {sys.executable} -c '{FAKE_READY_SERVER}' \"$@\"\n"
    )
    runtime = make_runtime(tmp_path, script)
    server = make_server(tmp_path, runtime)
    os.environ["FAKE_TRITON_REPORT"] = str(tmp_path / "report.json")
    try:
        with caplog.at_level("WARNING"), server:
            assert server.is_ready()
        retried = [
            json.loads(r.message) for r in caplog.records if "server_start_retried" in r.message
        ]
        assert [r["cause"] for r in retried] == ["tritonserver died of SIGABRT while starting"]
        always = "#!/bin/sh\necho 'epoll_wait error'\nkill -ABRT $$\n"
        server = make_server(tmp_path / "again", make_runtime(tmp_path / "again", always))
        with pytest.raises(ServerError, match="exited with -6"):
            server.start(timeout_s=60)
    finally:
        del os.environ["FAKE_TRITON_REPORT"]


def test_free_ports_are_drawn_below_the_ephemeral_range_where_there_is_room() -> None:
    """A client connection takes its port from the ephemeral range: a server port drawn
    there could be taken before the server binds it."""
    from dispatch_service.ops import triton_runtime

    start = triton_runtime._ephemeral_start()
    ports = [triton_runtime.free_port() for _ in range(20)]
    if start - 10_000 >= 1_000:
        assert all(10_000 <= port < start for port in ports), (start, ports)
    chosen = Ports.free()
    assert len({chosen.http, chosen.grpc, chosen.metrics}) == 3
