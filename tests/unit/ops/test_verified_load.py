"""What the launcher loads when trusted keys are configured (no real tritonserver here).

A small repository in tmp_path: ``scorer`` (Python model, versions 1 and 2, serving both),
``encoder`` (one version), ``pipeline`` (an ensemble over both, with a ``.gitkeep``) and
``pinned`` (an ensemble pinning scorer version 2). Tampering decides what loads; a stand-in
"tritonserver" records the load requests the launcher sends after start.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dispatch_service.core.repository_layout import model_layout
from dispatch_service.core.signing import (
    SigningError,
    TrustedKeys,
    generate_private_key,
    public_key_pem,
    sign_version,
)
from dispatch_service.ops.child_process import ServerError
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from dispatch_service.ops.server_cli import main
from dispatch_service.ops.verified_load import (
    load_failures,
    plan_load,
    read_config,
    served_versions,
)

PYTHON_MODEL = """name: "{name}"
backend: "python"
max_batch_size: 8
{policy}
"""

ENSEMBLE = """name: "{name}"
platform: "ensemble"
max_batch_size: 0
ensemble_scheduling {{
  step [
{steps}
  ]
}}
"""

STEP = '    {{ model_name: "{model}" model_version: {version} }}'


def write_model(repo: Path, name: str, versions: list[int], policy: str = "") -> None:
    layout = model_layout(repo, name)
    layout.folder.mkdir(parents=True)
    layout.config.write_text(PYTHON_MODEL.format(name=name, policy=policy))
    for version in versions:
        layout.version(version).mkdir()
        layout.python_model(version).write_text(f"VERSION = {version}\n")
        (layout.version(version) / "weights.bin").write_bytes(bytes([version]) * 64)


def write_ensemble(repo: Path, name: str, steps: list[tuple[str, int]]) -> None:
    layout = model_layout(repo, name)
    layout.version(1).mkdir(parents=True)
    (layout.version(1) / ".gitkeep").write_text("")
    text = ",\n".join(STEP.format(model=m, version=v) for m, v in steps)
    layout.config.write_text(ENSEMBLE.format(name=name, steps=text))


@pytest.fixture
def signer() -> Ed25519PrivateKey:
    return generate_private_key()


@pytest.fixture
def trusted(signer: Ed25519PrivateKey) -> TrustedKeys:
    return TrustedKeys.from_public_keys(signer.public_key())


@pytest.fixture
def repo(tmp_path: Path, signer: Ed25519PrivateKey) -> Path:
    root = tmp_path / "repo"
    write_model(root, "scorer", [1, 2], "version_policy: { all {} }")
    write_model(root, "encoder", [1])
    write_ensemble(root, "pipeline", [("encoder", -1), ("scorer", -1)])
    write_ensemble(root, "pinned", [("encoder", -1), ("scorer", 2)])
    for model, version in (("scorer", 1), ("scorer", 2), ("encoder", 1)):
        sign_version(model_layout(root, model).version(version), signer)
    (root / "notes").mkdir()  # a folder without a config is not a model
    return root


def tamper(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF
    path.write_bytes(bytes(data))


# ---- version policy ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "served"),
    [
        ({}, (3,)),
        ({"version_policy": {"latest": {"num_versions": 2}}}, (2, 3)),
        ({"version_policy": {"all": {}}}, (1, 2, 3)),
        ({"version_policy": {"specific": {"versions": ["1", "3", "9"]}}}, (1, 3)),
    ],
)
def test_served_versions_follow_the_version_policy(
    policy: dict[str, object], served: tuple[int, ...]
) -> None:
    assert served_versions(policy, [3, 1, 2]) == served


def test_read_config_prefers_the_profile_config(repo: Path) -> None:
    encoder = model_layout(repo, "encoder")
    encoder.profiles.mkdir()
    encoder.profile("gpu").write_text(
        PYTHON_MODEL.format(name="encoder", policy="version_policy: { all {} }")
    )
    assert "version_policy" not in read_config(encoder.folder, "cpu")
    assert read_config(encoder.folder, "gpu")["version_policy"] == {"all": {}}


# ---- plans -------------------------------------------------------------------------------


def test_everything_verified_loads_at_start(repo: Path, trusted: TrustedKeys) -> None:
    plan = plan_load(repo, trusted)
    assert plan.startup == ("encoder", "pinned", "pipeline", "scorer")
    assert not plan.restricted and not plan.deferred and not plan.refused
    assert plan.log_lines() == []


def test_a_bad_version_restricts_its_model_and_defers_its_ensembles(
    repo: Path, trusted: TrustedKeys
) -> None:
    tamper(model_layout(repo, "scorer").version(2) / "weights.bin")
    plan = plan_load(repo, trusted)
    assert plan.startup == ("encoder",)
    assert plan.restricted == {"scorer": (1,)}
    assert plan.deferred == ("pipeline",)
    assert plan.refused == {"pinned": "depends on scorer version 2, which does not load"}
    override = plan.override_config("scorer")
    assert override["version_policy"] == {"specific": {"versions": [1]}}
    assert override["backend"] == "python" and override["max_batch_size"] == 8
    events = [json.loads(line) for line in plan.log_lines()]
    assert events[0] == {
        "event": "model_version_refused",
        "model": "scorer",
        "version": 2,
        "reason": "digest mismatch on file weights.bin",
        "check": "digest_mismatch",
    }
    assert {"event": "model_restricted", "model": "scorer", "versions": [1]} in events
    assert events[-1]["event"] == "model_refused" and events[-1]["model"] == "pinned"


def test_a_model_without_a_good_version_is_refused_with_its_ensembles(
    repo: Path, trusted: TrustedKeys
) -> None:
    (model_layout(repo, "encoder").version(1) / "MANIFEST.json").unlink()
    plan = plan_load(repo, trusted)
    assert plan.startup == ("scorer",)
    assert plan.refused == {
        "encoder": "no verified version to serve",
        "pinned": "depends on refused model encoder",
        "pipeline": "depends on refused model encoder",
    }
    (refusal,) = plan.refused_versions
    assert (refusal.model, refusal.version, refusal.reason) == (
        "encoder",
        1,
        "missing manifest MANIFEST.json",
    )


def test_an_unserved_bad_version_is_reported_but_blocks_nothing(
    repo: Path, trusted: TrustedKeys
) -> None:
    model_layout(repo, "scorer").config.write_text(
        PYTHON_MODEL.format(name="scorer", policy="version_policy: { specific { versions: 2 } }")
    )
    tamper(model_layout(repo, "scorer").python_model(1))
    plan = plan_load(repo, trusted)
    assert "scorer" in plan.startup and not plan.restricted
    assert [v.version for v in plan.refused_versions] == [1]


def write_reader(repo: Path, signer: Ed25519PrivateKey) -> None:
    """A Python model that runs scorer versions itself, as dispatch_fused does (routed by the
    initial routing: stable version 1, canary 2)."""
    write_model(repo, "reader", [1])
    config = model_layout(repo, "reader").config
    config.write_text(
        config.read_text()
        + 'parameters [ { key: "scoring_model", value: { string_value: "scorer" } } ]\n'
    )
    sign_version(model_layout(repo, "reader").version(1), signer)


def test_a_model_reading_other_versions_needs_its_stable_version_only(
    repo: Path, signer: Ed25519PrivateKey, trusted: TrustedKeys
) -> None:
    """A refused canary takes the canary out of the reader's routing (the reader verifies
    in its own initialize), not the reader; a refused stable version refuses the reader."""
    write_reader(repo, signer)
    assert "reader" in plan_load(repo, trusted).startup
    assert plan_load(repo, trusted, requested=["reader"]).startup == ("reader", "scorer")
    tamper(model_layout(repo, "scorer").version(2) / "weights.bin")
    plan = plan_load(repo, trusted)
    assert "reader" not in plan.refused
    # loaded after start, routing over the verified versions only
    assert plan.restricted == {"scorer": (1,), "reader": (1,)}
    tamper(model_layout(repo, "scorer").version(1) / "weights.bin")
    plan = plan_load(repo, trusted)
    assert plan.refused["reader"] == "depends on refused model scorer"


def test_a_routing_model_loads_with_the_verified_versions_as_its_scoring_versions(
    repo: Path, signer: Ed25519PrivateKey, trusted: TrustedKeys
) -> None:
    write_reader(repo, signer)
    assert "reader" in plan_load(repo, trusted).startup
    tamper(model_layout(repo, "scorer").version(2) / "weights.bin")
    plan = plan_load(repo, trusted)
    assert plan.restricted["reader"] == (1,) and plan.scoring_versions == {"reader": (1,)}
    override = plan.override_config("reader")
    assert override["parameters"]["scoring_versions"] == {"string_value": "1"}
    assert override["parameters"]["scoring_model"] == {"string_value": "scorer"}


def test_an_unknown_signer_refuses_everything_signed(repo: Path) -> None:
    stranger = TrustedKeys.from_public_keys(generate_private_key().public_key())
    plan = plan_load(repo, stranger)
    assert plan.startup == ()
    assert set(plan.refused) == {"encoder", "scorer", "pinned", "pipeline"}
    assert all("unknown key" in v.reason for v in plan.refused_versions)


def test_requested_models_bring_their_ensemble_steps(repo: Path, trusted: TrustedKeys) -> None:
    plan = plan_load(repo, trusted, requested=("pipeline",))
    assert plan.startup == ("encoder", "pipeline", "scorer")
    plan = plan_load(repo, trusted, requested=("missing",))
    assert plan.refused == {"missing": "no such model in the repository"}


# ---- the launcher ------------------------------------------------------------------------

FAKE_TRITON = """\
import http.server, json, os, sys
args = sys.argv[1:]
port = int(next(a for a in args if a.startswith("--http-port=")).split("=", 1)[1])
report = os.environ["FAKE_TRITON_REPORT"]
with open(report, "w") as out:
    json.dump({"argv": args, "loads": []}, out)
broken = os.environ.get("FAKE_TRITON_BROKEN")  # "model:version" fails to load at start
if broken:
    model, version = broken.split(":")
    if f"--load-model={model}" in args or "--load-model=*" in args:
        q, escaped_newline = chr(39), chr(92) + "n"  # Triton's log escapes the cause's newlines
        print("E1203 model_lifecycle.cc:642] failed to load " + q + model + q + " version "
              + version + ": Internal: broken weights" + escaped_newline + "At: model.py")
        print("error: creating server: Internal - failed to load all models", flush=True)
        sys.exit(1)

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        answer = b""
        if self.path.startswith("/v2/models/") and self.path.endswith("/config"):
            # A model's config: the last one a load gave it.
            with open(report) as inp:
                seen = json.load(inp)
            model = self.path.split("/")[3]
            served = next(a for a in args if a.startswith("--model-repository=")).split("=", 1)[1]
            config = os.path.join(served, model, "config.pbtxt")
            if os.path.isfile(config):  # the file's, until a load overrides it
                from dispatch_service.core.model_config import read_config_dict
                answer = json.dumps(read_config_dict(config)).encode()
            for load in seen["loads"]:
                if load["path"] == f"/v2/repository/models/{model}/load":
                    answer = load["body"].get("parameters", {}).get("config", "").encode()
        ok = self.path == "/v2/health/ready" or bool(answer)
        self.send_response(200 if ok else 404)
        self.end_headers()
        self.wfile.write(answer)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        with open(report) as inp:
            seen = json.load(inp)
        answer = b""
        if self.path == "/v2/repository/index":
            # What Triton serves: the versions of each override (or FAKE_TRITON_SERVES).
            serves = json.loads(os.environ.get("FAKE_TRITON_SERVES", "{}"))
            for load in seen["loads"]:
                config = json.loads(load["body"].get("parameters", {}).get("config", "{}"))
                versions = config.get("version_policy", {}).get("specific", {}).get("versions")
                if versions:
                    serves.setdefault(load["path"].split("/")[-2], versions)
            answer = json.dumps([{"name": m, "version": str(v), "state": "READY"}
                                 for m, vs in serves.items() for v in vs]).encode()
        else:
            seen["loads"].append({"path": self.path, "key": self.headers.get("admin-key"),
                                  "body": body})
        with open(report, "w") as out:
            json.dump(seen, out)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def fake_runtime(root: Path) -> TritonRuntime:
    runtime = TritonRuntime(
        tritonserver=root / "bin" / "tritonserver",
        library_path=root / "libs",
        backend_dir=root / "backends",
        python_bin_dir=root / "venv" / "bin",
    )
    runtime.tritonserver.parent.mkdir(parents=True)
    runtime.tritonserver.write_text(f"#!{sys.executable}\n{FAKE_TRITON}")
    runtime.tritonserver.chmod(runtime.tritonserver.stat().st_mode | stat.S_IXUSR)
    runtime.library_path.mkdir()
    (runtime.backend_dir / "python").mkdir(parents=True)
    return runtime


def keys_dir(tmp_path: Path, signer: Ed25519PrivateKey) -> Path:
    folder = tmp_path / "trusted"
    folder.mkdir()
    (folder / "ops.pub").write_bytes(public_key_pem(signer.public_key()))
    return folder


def test_the_launcher_loads_verified_models_then_overrides_then_dependents(
    tmp_path: Path, repo: Path, signer: Ed25519PrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = tmp_path / "report.json"
    monkeypatch.setenv("FAKE_TRITON_REPORT", str(report))
    tamper(model_layout(repo, "scorer").python_model(2))
    options = ServerOptions(
        model_repository=repo,
        ports=Ports.free(),
        admin_key="k3y",
        trusted_keys=keys_dir(tmp_path, signer),
    )
    server = TritonServer(fake_runtime(tmp_path), options, tmp_path / "server.log")
    with server:
        seen = json.loads(report.read_text())
        served = server.served_repository
        assert server.repository_copy is not None
        copy_root = server.repository_copy.root
        assert stat.S_IMODE(copy_root.stat().st_mode) == 0o700
        # Triton reads the launcher's copy: the verified bytes, compiled before Triton reads
        # them; the refused version is an empty folder there, and the source is not written.
        assert f"--model-repository={served}" in seen["argv"] and served != repo
        copied = model_layout(served, "scorer")
        assert (
            copied.python_model(1).read_bytes()
            == model_layout(repo, "scorer").python_model(1).read_bytes()
        )
        assert list((copied.version(1) / "__pycache__").glob("model.*.pyc"))
        assert list(copied.version(2).iterdir()) == []
        assert not (model_layout(repo, "scorer").version(1) / "__pycache__").exists()
    assert not copy_root.exists()  # removed with the server
    assert [a for a in seen["argv"] if a.startswith("--load-model")] == ["--load-model=encoder"]
    loads = seen["loads"]
    assert [load["path"] for load in loads] == [
        "/v2/repository/models/scorer/load",
        "/v2/repository/models/pipeline/load",
    ]
    assert all(load["key"] == "k3y" for load in loads)
    config = json.loads(loads[0]["body"]["parameters"]["config"])
    assert config["version_policy"] == {"specific": {"versions": [1]}}
    assert loads[1]["body"] == {}
    log = server.log_path.read_text()
    assert '"reason": "digest mismatch on file model.py"' in log
    assert '"model": "pinned"' in log and '"event": "model_refused"' in log


def test_without_trusted_keys_everything_loads_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TRITON_REPORT", str(tmp_path / "report.json"))
    options = ServerOptions(model_repository=tmp_path, ports=Ports.free())
    server = TritonServer(fake_runtime(tmp_path), options, tmp_path / "server.log")
    with server:
        assert server.load_plan is None
        assert "--load-model=*" in server.command()
    assert "signatures_not_verified" in server.log_path.read_text()


def test_an_empty_or_missing_trusted_keys_directory_stops_the_start(
    tmp_path: Path, repo: Path
) -> None:
    (tmp_path / "empty").mkdir()
    for directory in (tmp_path / "empty", tmp_path / "absent"):
        options = ServerOptions(model_repository=repo, trusted_keys=directory)
        server = TritonServer(fake_runtime(tmp_path / directory.name), options, tmp_path / "l")
        with pytest.raises(SigningError):
            server.start(timeout_s=5)
        assert server.process is None


def test_the_launcher_fails_closed_when_a_refused_version_comes_back(
    tmp_path: Path, repo: Path, signer: Ed25519PrivateKey, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TRITON_REPORT", str(tmp_path / "report.json"))
    monkeypatch.setenv("FAKE_TRITON_SERVES", json.dumps({"scorer": [1, 2]}))
    tamper(model_layout(repo, "scorer").python_model(2))
    options = ServerOptions(
        model_repository=repo, ports=Ports.free(), trusted_keys=keys_dir(tmp_path, signer)
    )
    server = TritonServer(fake_runtime(tmp_path), options, tmp_path / "server.log")
    with pytest.raises(ServerError, match=r"scorer serves versions \[1, 2\], verified \[1\]"):
        server.start(timeout_s=30)
    assert server.process is None


def test_serve_cli_takes_trusted_keys_from_the_environment(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    venv = tmp_path / "venv"
    runtime = TritonRuntime.from_venv(venv, tmp_path / "backends")
    runtime.tritonserver.parent.mkdir(parents=True)
    runtime.tritonserver.write_text("#!/bin/sh\nexit 3\n")
    runtime.library_path.mkdir(parents=True)
    (runtime.backend_dir / "python").mkdir(parents=True)
    (tmp_path / "no-keys").mkdir()
    monkeypatch.setenv("DISPATCH_TRUSTED_KEYS", str(tmp_path / "no-keys"))
    monkeypatch.setenv("DISPATCH_ADMIN_KEY", "from-env")
    code = main(
        [
            "--venv", str(venv), "--backend-dir", str(runtime.backend_dir),
            "--model-repository", str(repo), "--log", str(tmp_path / "server.log"),
            "--http-port", str(Ports.free().http),
        ]
    )  # fmt: skip
    assert code == 1
    assert "no trusted keys (*.pub)" in capsys.readouterr().err


# ---- versions that fail to load ---------------------------------------------------------

TRITON_LOG = (
    'I1203 13:18:52.1 1472 model_lifecycle.cc:469] "loading: dispatch_model:2"\n'
    "E1203 13:18:52.808123 1472 model_lifecycle.cc:642] \"failed to load 'dispatch_model' "
    'version 2: Internal: InvalidProtobuf: Protobuf parsing failed.\\n\\nAt:\\n  x.py(7)\\n"\n'
    "I1203 13:18:52.9 1472 model_lifecycle.cc:777] \"failed to load 'dispatch_model'\"\n"
)


def test_load_failures_read_the_version_and_its_cause_from_tritons_log() -> None:
    assert load_failures(TRITON_LOG) == {
        ("dispatch_model", 2): "Internal: InvalidProtobuf: Protobuf parsing failed."
    }
    assert load_failures("all good\n") == {}


def test_a_version_that_failed_to_load_is_left_out_like_a_refused_one(
    repo: Path, trusted: TrustedKeys
) -> None:
    failed = {("scorer", 1): "Internal: broken"}
    for keys in (trusted, None):  # verified or not
        plan = plan_load(repo, keys, failed=failed)
        assert plan.restricted == {"scorer": (2,)} and not plan.refused
        (line,) = [entry for entry in plan.log_lines() if "model_version_failed" in entry]
        assert json.loads(line) == {
            "event": "model_version_failed",
            "model": "scorer",
            "version": 1,
            "cause": "Internal: broken",
        }
    # Version 2 is pinned by an ensemble: leaving it out refuses that ensemble.
    plan = plan_load(repo, None, failed={("scorer", 2): "Internal: broken"})
    assert plan.refused == {"pinned": "depends on scorer version 2, which does not load"}


def test_a_start_skips_a_version_that_fails_to_load_and_logs_the_cause(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broken version nothing else needs (a canary routed at 0 %) no longer stops the
    server: it starts again without it, and the log says why it was left out."""
    report = tmp_path / "report.json"
    monkeypatch.setenv("FAKE_TRITON_REPORT", str(report))
    monkeypatch.setenv("FAKE_TRITON_BROKEN", "scorer:1")
    options = ServerOptions(model_repository=repo, ports=Ports.free(), admin_key="k3y")
    server = TritonServer(fake_runtime(tmp_path), options, tmp_path / "server.log")
    with server:
        seen = json.loads(report.read_text())
    assert "--load-model=scorer" not in seen["argv"] and "--load-model=encoder" in seen["argv"]
    scorer = [load for load in seen["loads"] if load["path"].endswith("/scorer/load")]
    config = json.loads(scorer[0]["body"]["parameters"]["config"])
    assert config["version_policy"] == {"specific": {"versions": [2]}}
    log = server.log_path.read_text()
    assert '"event": "model_version_failed"' in log and "broken weights" in log


def test_a_start_without_a_version_another_model_needs_fails_naming_it_and_its_cause(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TRITON_REPORT", str(tmp_path / "report.json"))
    monkeypatch.setenv("FAKE_TRITON_BROKEN", "scorer:2")
    options = ServerOptions(model_repository=repo, ports=Ports.free())
    server = TritonServer(fake_runtime(tmp_path), options, tmp_path / "server.log")
    with pytest.raises(ServerError) as raised:
        server.start(timeout_s=30)
    assert str(raised.value) == (
        "cannot start: scorer version 2 failed to load (Internal: broken weights); without "
        "it: pinned: depends on scorer version 2, which does not load"
    )
    assert server.process is None


SEVERAL_INSTANCES = """
instance_group [
  { count: 1, kind: KIND_CPU, rate_limiter { priority: 1 } },
  { count: 3, kind: KIND_CPU, rate_limiter { priority: 1000000 } }
]
"""


def test_a_restart_plan_loads_a_model_of_several_instances_on_its_first_after_start(
    repo: Path, trusted: TrustedKeys
) -> None:
    """A restart is ready on one stub a model (each stub imports the library: most of a
    start's CPU); the ensembles over such a model load after it."""
    config = model_layout(repo, "scorer").config
    config.write_text(config.read_text() + SEVERAL_INSTANCES)
    full = plan_load(repo, trusted)
    assert full.startup == ("encoder", "pinned", "pipeline", "scorer")
    assert not full.first_instance
    plan = plan_load(repo, trusted, first_instances=True)
    assert plan.startup == full.startup  # from the cut repository, at start
    assert plan.first_instance == ("scorer",)
    assert plan.configs["scorer"]["instance_group"][1]["count"] == 3  # the file's, kept
    # Restricted too (a refused version): its override, on its first instance.
    tamper(model_layout(repo, "scorer").version(2) / "weights.bin")
    plan = plan_load(repo, trusted, first_instances=True)
    assert plan.restricted == {"scorer": (1,)} and plan.first_instance == ("scorer",)
    override = plan.load_config("scorer")
    assert override["version_policy"] == {"specific": {"versions": [1]}}
    assert override["instance_group"] == [
        {"count": 1, "kind": "KIND_CPU", "rate_limiter": {"priority": 1}}
    ]


def test_a_restart_plan_loads_gpu_groups_whole(repo: Path, trusted: TrustedKeys) -> None:
    config = model_layout(repo, "scorer").config
    config.write_text(
        config.read_text() + "instance_group [ { count: 2, kind: KIND_GPU, gpus: [0] } ]\n"
    )
    assert not plan_load(repo, trusted, first_instances=True).first_instance


def test_a_first_instances_start_serves_on_one_then_adds_the_others(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart's start (no trusted keys here): Triton reads a private view of the
    repository where the model of several instances has its first alone, and loads
    everything at start (no entry point missing once the ports open); `add_instances` loads
    the config it serves with every instance group of its file, and the view gives that
    model its own config back. One model a call."""
    report = tmp_path / "report.json"
    monkeypatch.setenv("FAKE_TRITON_REPORT", str(report))
    config = model_layout(repo, "scorer").config
    config.write_text(config.read_text() + SEVERAL_INSTANCES)
    options = ServerOptions(model_repository=repo, ports=Ports.free(), admin_key="k3y")
    server = TritonServer(fake_runtime(tmp_path), options, tmp_path / "server.log")
    server.start_first_instances(timeout_s=30)
    try:
        seen = json.loads(report.read_text())
        assert server.first_instances is not None
        view = server.first_instances.root
        assert stat.S_IMODE(view.stat().st_mode) == 0o700
        assert f"--model-repository={view}" in seen["argv"]
        assert "--load-model=scorer" in seen["argv"] and not seen["loads"]
        cut = read_config(view / "scorer")
        assert cut["instance_group"] == [
            {"count": 1, "kind": "KIND_CPU", "rate_limiter": {"priority": 1}}
        ]
        assert model_layout(view, "scorer").python_model(1).read_text() == "VERSION = 1\n"
        assert read_config(view / "encoder") == read_config(repo / "encoder")
        assert server.instances_pending == ("scorer",)
        lines = server.add_instances()
        assert [json.loads(line) for line in lines] == [
            {"event": "instances_added", "model": "scorer", "instances": 4}
        ]
        assert server.instances_pending == () and server.add_instances() == []
        added = json.loads(report.read_text())["loads"][-1]
        assert added["path"] == "/v2/repository/models/scorer/load" and added["key"] == "k3y"
        config_added = json.loads(added["body"]["parameters"]["config"])
        assert [g["count"] for g in config_added["instance_group"]] == [1, 3]
        assert config_added["instance_group"][1]["rate_limiter"] == {"priority": 1000000}
        assert read_config(view / "scorer") == read_config(repo / "scorer")  # its own again
    finally:
        server.stop()
        server.release()
    assert not view.exists()  # removed with the server
    assert server.instances_pending == ()
