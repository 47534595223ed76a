"""Signed models on a live server: verified start, restricted endpoints, deploy and rollback.

A server of its own (module scope, its own free ports) over a COPY of the model repository in
tmp_path, signed there with a throwaway key; the committed repository is never touched. In the
copy, dispatch_model serves versions 1 and 3 (``version_policy``), and version 3 -- a signed
copy of version 2 -- has one byte of its model.onnx flipped after signing. So the server
starts with dispatch_model version 1 only, and version 2 is on disk, signed, not served: what
`dispatch-admin deploy` puts live.

Background load: a thread sends dispatch windows over gRPC while deploy or rollback runs and
counts every error; deploy and rollback must drop nothing.
"""

from __future__ import annotations

import io
import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from dispatch_contract import ORDER_FALLBACK_LEVEL, ORDER_MODEL_VERSION
from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import SCORING_MODEL, model_layout, models_in
from dispatch_service.core.signing import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    generate_private_key,
    private_key_pem,
    public_key_pem,
)
from dispatch_service.ops import admin
from dispatch_service.ops.model_control import (
    ModelControlError,
    load_model,
    model_config,
    ready_versions,
    repository_index,
    with_versions,
)
from dispatch_service.ops.router_control import read_fused_settings, read_router_settings
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from triton_helpers import OUTPUT_NAMES, grpc_inputs, sim_window

ADMIN_KEY = "lifecycle-test-admin-key"
GRPC_ADMIN_HEADER = "triton-grpc-protocol-admin-key"
MODEL = SCORING_MODEL
TAMPERED = 3
# A server call that takes longer has hung: fail the test instead of waiting on.
CALL_TIMEOUT_S = 60
REQUEST_TIMEOUT_S = 30
CANARY = 2


@dataclass
class Lifecycle:
    server: TritonServer
    repository: Path
    trusted_keys: Path

    def admin(self, *argv: str) -> tuple[int, str]:
        out = io.StringIO()
        return admin.main(list(argv), out=out), out.getvalue()

    def deploy(self, version: int, percent: int) -> tuple[int, str]:
        return self.admin(
            "deploy", "--model", MODEL, "--version", str(version),
            "--canary-percent", str(percent), "--url", self.server.http_url,
            "--admin-key", ADMIN_KEY, "--trusted-keys", str(self.trusted_keys),
            "--model-repository", str(self.repository), "--timeout-s", str(CALL_TIMEOUT_S),
        )  # fmt: skip


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def prepare_repository(root: Path) -> tuple[Path, Path]:
    """Copy, sign (with the CLI and a throwaway key), tamper; returns (repository, keys)."""
    repository = root / "repo"
    shutil.copytree(
        MODEL_REPOSITORY,
        repository,
        ignore=shutil.ignore_patterns("__pycache__", MANIFEST_NAME, SIGNATURE_NAME),
    )
    scoring = model_layout(repository, MODEL)
    shutil.copytree(scoring.version(CANARY), scoring.version(TAMPERED))
    config = scoring.config
    lines = [line for line in config.read_text().splitlines() if "version_policy" not in line]
    lines.append(f"version_policy: {{ specific: {{ versions: [ 1, {TAMPERED} ] }} }}")
    config.write_text("\n".join(lines) + "\n")

    key = generate_private_key()
    key_file = root / "signing.key"
    key_file.write_bytes(private_key_pem(key))
    key_file.chmod(0o600)
    trusted = root / "trusted_keys"
    trusted.mkdir()
    (trusted / "ops.pub").write_bytes(public_key_pem(key.public_key()))
    for layout in models_in(repository):
        if '"ensemble"' in layout.config.read_text():
            continue
        model_dir = layout.folder
        for version_dir in sorted(p for p in model_dir.iterdir() if p.name.isdigit()):
            code = admin.main(
                [
                    "sign",
                    "--model",
                    model_dir.name,
                    "--version",
                    version_dir.name,
                    "--key",
                    str(key_file),
                    "--model-repository",
                    str(repository),
                ],
                out=io.StringIO(),
            )
            assert code == 0, f"signing {version_dir} failed"
    flip_byte(scoring.onnx(TAMPERED))
    return repository, trusted


@pytest.fixture(scope="module")
def lifecycle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lifecycle]:
    root = tmp_path_factory.mktemp("lifecycle")
    repository, trusted = prepare_repository(root)
    runtime = TritonRuntime.from_venv()
    options = ServerOptions(
        model_repository=repository,
        ports=Ports.free(),
        admin_key=ADMIN_KEY,
        trusted_keys=trusted,
    )
    server = TritonServer(runtime, options, root / "server.log")
    with server:
        yield Lifecycle(server, repository, trusted)
    print(f"lifecycle tritonserver log: {server.log_path}")


# ---- background load ---------------------------------------------------------------------

ROUTING_OUTPUTS = (ORDER_MODEL_VERSION.name, ORDER_FALLBACK_LEVEL.name)


@dataclass
class BackgroundLoad:
    """Sends dispatch windows over gRPC from a thread until stopped (at most ``limit``)."""

    grpc_url: str
    limit: int = 5000
    sent: int = 0
    errors: list[str] = field(default_factory=list)
    versions: Counter[int] = field(default_factory=Counter)  # orders per scoring version
    fallbacks: Counter[int] = field(default_factory=Counter)  # orders per fallback level
    _stop: threading.Event = field(default_factory=threading.Event)
    _first: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        windows = [sim_window(seed=900 + i, orders=8, riders=40) for i in range(4)]
        outputs = [grpcclient.InferRequestedOutput(n) for n in (*OUTPUT_NAMES, *ROUTING_OUTPUTS)]
        client = grpcclient.InferenceServerClient(self.grpc_url)
        try:
            while not self._stop.is_set() and self.sent < self.limit:
                window = windows[self.sent % len(windows)]
                try:
                    result = client.infer(
                        "dispatch",
                        grpc_inputs(window),
                        outputs=outputs,
                        client_timeout=REQUEST_TIMEOUT_S,
                    )
                    # [1, B]: one window per request
                    self.versions.update(result.as_numpy(ORDER_MODEL_VERSION.name)[0].tolist())
                    self.fallbacks.update(result.as_numpy(ORDER_FALLBACK_LEVEL.name)[0].tolist())
                except InferenceServerException as exc:
                    self.errors.append(str(exc))
                self.sent += 1
                self._first.set()
        finally:
            client.close()
            self._first.set()

    def __enter__(self) -> BackgroundLoad:
        self._thread = threading.Thread(target=self._run, name="dispatch-load", daemon=True)
        self._thread.start()
        assert self._first.wait(timeout=60), "no answer to the first background request"
        return self

    def until(self, more: int) -> None:
        """Let ``more`` further requests finish; stop waiting at the first error or after
        ``CALL_TIMEOUT_S`` (a hung server must fail the test, not stall it)."""
        target = self.sent + more
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while (
            self.sent < target
            and not self.errors
            and self._thread is not None
            and self._thread.is_alive()
            and time.monotonic() < deadline
        ):
            self._thread.join(timeout=0.05)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)


def dispatch_once(
    lifecycle: Lifecycle,
    model: str = "dispatch",
    extra: dict[str, np.ndarray[Any, Any]] | None = None,
) -> dict[str, np.ndarray[Any, Any]]:
    window = {**sim_window(seed=77, orders=16, riders=60), **(extra or {})}
    names = (*OUTPUT_NAMES, *ROUTING_OUTPUTS)
    with grpcclient.InferenceServerClient(lifecycle.server.grpc_url) as client:
        result = client.infer(
            model,
            grpc_inputs(window),
            outputs=[grpcclient.InferRequestedOutput(n) for n in names],
        )
    return {name: result.as_numpy(name)[0] for name in names}  # one window: batch of 1


# ---- tests -------------------------------------------------------------------------------


def test_a_tampered_version_is_refused_at_start_and_the_rest_serve(lifecycle: Lifecycle) -> None:
    events = []
    for line in lifecycle.server.log_path.read_text().splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    assert {
        "event": "model_version_refused",
        "model": MODEL,
        "version": TAMPERED,
        "reason": "digest mismatch on file model.onnx",
        "check": "digest_mismatch",
    } in events
    assert {"event": "model_restricted", "model": MODEL, "versions": [1]} in events
    # Both routing models load with the verified versions as what they route over: a refused
    # version is out of routing, it does not refuse dispatch_fused.
    for routing_model in ("dispatch_fused", "dispatch_router"):
        assert {"event": "model_restricted", "model": routing_model, "versions": [1]} in events
    assert not [e for e in events if e.get("event") == "model_refused"]
    url = lifecycle.server.http_url
    assert ready_versions(url, MODEL, ADMIN_KEY) == (1,)
    ready = {e["name"] for e in repository_index(url, ADMIN_KEY) if e.get("state") == "READY"}
    assert {"dispatch", "dispatch_fused", "dispatch_router", MODEL} <= ready
    assert read_router_settings(url).scoring_versions == (1,)
    for model in ("dispatch", "dispatch_fused"):
        answer = dispatch_once(lifecycle, model)
        assert set(answer[ORDER_MODEL_VERSION.name].tolist()) == {1}
        assert set(answer[ORDER_FALLBACK_LEVEL.name].tolist()) == {0}


def test_no_load_path_serves_the_tampered_version(lifecycle: Lifecycle) -> None:
    """After the start refused version 3, a key holder's plain load of
    dispatch_fused, a load that names version 3 among its scoring versions, or a load of
    dispatch_model with version 3 never serves its weights: each model verifies itself."""
    url = lifecycle.server.http_url
    tag = {"MODEL_VERSION_TAG": np.array([str(TAMPERED).encode()], dtype=object)}
    load_model(url, "dispatch_fused", admin_key=ADMIN_KEY)
    plan = lifecycle.server.load_plan
    assert plan is not None
    override = plan.override_config("dispatch_fused")
    asks_for_3 = json.loads(json.dumps(override))
    asks_for_3["parameters"]["scoring_versions"] = {"string_value": f"1,{TAMPERED}"}
    try:
        for config in (None, asks_for_3):
            if config is not None:
                load_model(url, "dispatch_fused", config, admin_key=ADMIN_KEY)
            answer = dispatch_once(lifecycle, "dispatch_fused", tag)
            assert set(answer[ORDER_MODEL_VERSION.name].tolist()) == {1}
            assert set(answer[ORDER_FALLBACK_LEVEL.name].tolist()) == {1}
        log = lifecycle.server.log_path.read_text()
        assert "refused by signature verification" in log
        with pytest.raises(ModelControlError):
            config = model_config(url, MODEL)
            load_model(url, MODEL, with_versions(config, (1, TAMPERED)), admin_key=ADMIN_KEY)
        assert ready_versions(url, MODEL, ADMIN_KEY) == (1,)
    finally:
        load_model(url, "dispatch_fused", override, admin_key=ADMIN_KEY)


def test_a_load_without_the_admin_key_is_refused_and_with_it_accepted(
    lifecycle: Lifecycle,
) -> None:
    server = lifecycle.server
    with pytest.raises(ModelControlError) as refused:
        load_model(server.http_url, "topk_resolver")
    assert refused.value.status == 403
    with pytest.raises(ModelControlError) as wrong:
        load_model(server.http_url, "topk_resolver", admin_key="not-the-key")
    assert wrong.value.status == 403
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="admin-key"):
            client.load_model("topk_resolver")
        # gRPC carries the key under Triton's prefix for restricted protocols.
        client.load_model("topk_resolver", headers={GRPC_ADMIN_HEADER: ADMIN_KEY})
        assert client.is_model_ready("topk_resolver")
    load_model(server.http_url, "topk_resolver", admin_key=ADMIN_KEY)
    assert ready_versions(server.http_url, "topk_resolver", ADMIN_KEY) == (1,)


def test_deploy_of_a_tampered_version_fails_and_the_old_keeps_serving(
    lifecycle: Lifecycle, capsys: pytest.CaptureFixture[str]
) -> None:
    url = lifecycle.server.http_url
    settings_before = read_router_settings(url)
    versions_before = ready_versions(url, MODEL, ADMIN_KEY)
    code, _ = lifecycle.deploy(TAMPERED, 50)
    assert code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(
        f"deploy failed: {MODEL} version {TAMPERED} refused: digest mismatch on file model.onnx "
        "(model.onnx sha256 "
    )
    assert read_router_settings(url) == settings_before
    assert ready_versions(url, MODEL, ADMIN_KEY) == versions_before
    assert set(dispatch_once(lifecycle)[ORDER_FALLBACK_LEVEL.name].tolist()) == {0}


def test_deploy_and_rollback_under_load_drop_no_request(lifecycle: Lifecycle) -> None:
    url = lifecycle.server.http_url
    with BackgroundLoad(lifecycle.server.grpc_url) as deploy_load:
        code, text = lifecycle.deploy(CANARY, 50)
        deploy_load.until(40)
    assert code == 0, text
    assert ready_versions(url, MODEL, ADMIN_KEY) == (1, CANARY)
    settings = read_router_settings(url)
    assert (settings.stable_version, settings.canary_version) == (1, CANARY)
    assert settings.canary_percent == 50
    print(
        f"deploy under load: {deploy_load.sent} requests, {len(deploy_load.errors)} errors, "
        f"orders by version {dict(deploy_load.versions)}, "
        f"by fallback level {dict(deploy_load.fallbacks)}"
    )
    assert deploy_load.errors == []
    assert deploy_load.versions[CANARY] > 0  # the canary serves once routed

    with BackgroundLoad(lifecycle.server.grpc_url) as rollback_load:
        code, text = rollback(lifecycle)
        rollback_load.until(40)
    assert code == 0, text
    assert f"(canary {CANARY} no longer routed); loaded versions [1, {CANARY}]" in text
    assert_true_state(lifecycle, (1, CANARY))
    with BackgroundLoad(lifecycle.server.grpc_url) as unload_load:
        code, text = rollback(lifecycle, "--unload-canary")
        unload_load.until(40)
    assert code == 0, text
    assert f"(there was no canary); loaded versions [1] (unloaded [{CANARY}])" in text
    assert_true_state(lifecycle, (1,))
    for load in (rollback_load, unload_load):
        print(
            f"rollback under load: {load.sent} requests, {len(load.errors)} errors, "
            f"orders by version {dict(load.versions)}, "
            f"by fallback level {dict(load.fallbacks)}"
        )
        assert load.errors == []
    answer = dispatch_once(lifecycle)
    assert set(answer[ORDER_MODEL_VERSION.name].tolist()) == {1}


def test_rollback_in_the_other_order_leaves_the_same_true_state(lifecycle: Lifecycle) -> None:
    code, text = lifecycle.deploy(CANARY, 50)
    assert code == 0, text
    assert_true_state(lifecycle, (1, CANARY), canary=CANARY)
    code, text = rollback(lifecycle, "--unload-canary")
    assert code == 0, text
    assert f"(canary {CANARY} no longer routed); loaded versions [1] (unloaded [{CANARY}])" in text
    assert_true_state(lifecycle, (1,))
    code, text = rollback(lifecycle)
    assert code == 0, text
    assert text.strip().endswith("(there was no canary); loaded versions [1]")
    assert_true_state(lifecycle, (1,))


def rollback(lifecycle: Lifecycle, *extra: str) -> tuple[int, str]:
    return lifecycle.admin(
        "rollback", "--url", lifecycle.server.http_url, "--admin-key", ADMIN_KEY,
        "--timeout-s", str(CALL_TIMEOUT_S), *extra,
    )  # fmt: skip


def assert_true_state(lifecycle: Lifecycle, served: tuple[int, ...], canary: int = 0) -> None:
    """status, the server and both entry points tell the same story."""
    url = lifecycle.server.http_url
    code, text = lifecycle.admin("status", "--url", url, "--admin-key", ADMIN_KEY)
    assert code == 0, text
    status = json.loads(text)
    assert status["serving_versions"] == list(served) and status["disagreements"] == []
    assert status["dispatch_fused"] == status["router"]
    assert ready_versions(url, MODEL, ADMIN_KEY) == served
    router = read_router_settings(url)
    assert read_fused_settings(url, ADMIN_KEY) == router
    assert router.scoring_versions == served and router.canary_version == canary
    if not canary:
        assert (router.canary_percent, router.shadow_percent) == (0, 0)
        assert status["routed"] == "stable version 1 only"
