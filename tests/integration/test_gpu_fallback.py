"""The GPU monitor against a live server, driven by synthetic NVML readings.

The cpu profile has no GPU, so the fallback runs in its stand-in mode
(``l1_instance_kind=KIND_CPU``: each healthy GPU is one CPU instance group named
``dispatch_model_gpu<i>``); the overrides go through the real repository API and Triton
really reloads dispatch_model while requests keep arriving. The KIND_GPU JSON the gpu
profile would send is checked in tests/unit/ops/test_gpu_fallback.py.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient

from dispatch_service.ops.gpu.export import serve_metrics
from dispatch_service.ops.gpu.fallback import DeviceLevel, FallbackController
from dispatch_service.ops.gpu.monitor import GpuMonitor
from dispatch_service.ops.gpu.sampling import GpuSample, ScriptedSampler
from dispatch_service.ops.gpu.settings import GpuMonitorSettings
from dispatch_service.ops.model_control import ModelControlError, load_model, model_config
from dispatch_service.ops.router_control import apply_router_settings, read_router_settings
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from triton_helpers import ROUTED_OUTPUT_NAMES, infer_http, sim_window

GIB = 1 << 30
ADMIN_KEY = "gpu-fallback-test-key"
SETTINGS = GpuMonitorSettings(
    sample_period_s=0.2,
    restore_after_s=1.0,
    l1_instance_kind="KIND_CPU",
    cpu_instances=1,
    metrics_port=0,
)


def calm(index: int) -> GpuSample:
    return GpuSample(index, f"GPU-{index}", 30.0, 4 * GIB, 80 * GIB, 55.0, 0, True)


def hot(index: int) -> GpuSample:
    return GpuSample(index, f"GPU-{index}", 99.0, 78 * GIB, 80 * GIB, 91.0, 0, True)


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A server of its own: the `dispatch` ensemble and dispatch_model only (what the device
    fallback changes), behind an admin key like a production one."""
    log = tmp_path_factory.mktemp("gpu_fallback") / "server.log"
    options = ServerOptions(
        ports=Ports.free(),
        admin_key=ADMIN_KEY,
        load_models=("dispatch_model", "dispatch"),
        extra_args=("--exit-timeout-secs=3",),
    )
    with TritonServer(TritonRuntime.from_venv(), options, log) as started:
        yield started
    print(f"gpu fallback tritonserver log: {log}")


@pytest.fixture
def served(triton: TritonServer) -> Iterator[dict[str, Any]]:
    """dispatch_model's configuration before the test, loaded back after it."""
    config = model_config(triton.http_url, "dispatch_model")
    try:
        yield config
    finally:
        if model_config(triton.http_url, "dispatch_model") != config:
            load_model(triton.http_url, "dispatch_model", config, ADMIN_KEY)


@pytest.fixture
def two_gpus(triton: TritonServer, served: dict[str, Any]) -> dict[str, Any]:
    """dispatch_model as the stand-in of a two-GPU node: one CPU instance per "GPU", so that
    leaving one out really removes an instance (Triton updates instances in place when only
    instance_group changes; a renamed group of the same size would keep its instance)."""
    groups = [{"name": f"dispatch_model_gpu{i}", "kind": "KIND_CPU", "count": 1} for i in (0, 1)]
    load_model(triton.http_url, "dispatch_model", {**served, "instance_group": groups}, ADMIN_KEY)
    return model_config(triton.http_url, "dispatch_model")


class Load:
    """Steady requests to the `dispatch` ensemble on its own client, until stopped."""

    def __init__(self, server: TritonServer) -> None:
        self.server = server
        self.tensors = sim_window(21, 16, 60)
        self.levels: list[list[int]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        http = httpclient.InferenceServerClient(self.server.http_url, network_timeout=60.0)
        deadline = time.monotonic() + 120.0
        try:
            for _ in range(3000):
                if self._stop.is_set() or time.monotonic() > deadline:
                    break
                try:
                    out = infer_http(http, self.tensors, output_names=ROUTED_OUTPUT_NAMES)
                except Exception as exc:  # every failure is a dropped request
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                    continue
                self.levels.append(np.asarray(out["ORDER_FALLBACK_LEVEL"]).tolist())
                self._stop.wait(0.02)  # bounded: leave the CPUs room for the reload
        finally:
            http.close()

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        assert not self._thread.is_alive()


def wait_for(condition: Any, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


def group_names(server: TritonServer) -> list[str]:
    config = model_config(server.http_url, "dispatch_model")
    return [str(g["name"]) for g in config["instance_group"]]


def test_an_unhealthy_gpu_of_two_is_left_out_live_and_put_back(
    triton: TritonServer, two_gpus: dict[str, Any]
) -> None:
    sampler = ScriptedSampler([[calm(0), calm(1)]])
    controller = FallbackController(triton.http_url, SETTINGS, ADMIN_KEY)
    monitor = GpuMonitor(sampler, SETTINGS, controller)
    with Load(triton) as load:
        monitor.start()
        try:
            assert wait_for(lambda: len(load.levels) >= 3)
            sampler.replace([[calm(0), hot(1)]])
            tripped = time.monotonic()
            assert wait_for(lambda: bool(controller.transitions))  # the load has returned
            moved_s = time.monotonic() - tripped
            assert group_names(triton) == ["dispatch_model_gpu0"]
            answered = len(load.levels)
            assert wait_for(lambda: len(load.levels) >= answered + 3)
            sampler.replace([[calm(0), calm(1)]])
            assert wait_for(lambda: model_config(triton.http_url, "dispatch_model") == two_gpus)
            answered = len(load.levels)
            assert wait_for(lambda: len(load.levels) >= answered + 3)
        finally:
            monitor.stop()
    levels = [t.level for t in controller.transitions]
    assert levels == [DeviceLevel.L1_OTHER_GPUS, DeviceLevel.L0_ALL_GPUS]
    assert all(t.error is None for t in controller.transitions)
    l1 = controller.transitions[0]
    assert l1.config is not None and l1.config["instance_group"] == [
        {"name": "dispatch_model_gpu0", "kind": "KIND_CPU", "count": 1}
    ]
    assert load.failures == []
    assert {level for answer in load.levels for level in answer} == {0}  # the model scored all
    back = controller.transitions[1]
    print(
        f"3 hot samples at {SETTINGS.sample_period_s} s + reload: traffic off GPU 1 after "
        f"{moved_s:.2f} s (load {l1.seconds:.2f} s, back {back.seconds:.2f} s); "
        f"{len(load.levels)} requests, 0 failed"
    )


def level_of(controller: FallbackController) -> DeviceLevel:
    return controller.level


def levels_now(server: TritonServer) -> set[int]:
    """ORDER_FALLBACK_LEVEL of one window sent now."""
    http = httpclient.InferenceServerClient(server.http_url, network_timeout=60.0)
    try:
        out = infer_http(http, sim_window(23, 8, 40), output_names=ROUTED_OUTPUT_NAMES)
    finally:
        http.close()
    return set(np.asarray(out["ORDER_FALLBACK_LEVEL"]).tolist())


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return str(answer.read().decode())


def test_no_healthy_gpu_moves_scoring_to_cpu_instances_and_answers_say_so(
    triton: TritonServer, two_gpus: dict[str, Any]
) -> None:
    sampler = ScriptedSampler([[hot(0), hot(1)]])
    controller = FallbackController(triton.http_url, SETTINGS, ADMIN_KEY)
    monitor = GpuMonitor(sampler, SETTINGS, controller)
    endpoint = serve_metrics(monitor, "127.0.0.1", 0)
    metrics_url = f"http://127.0.0.1:{endpoint.server_address[1]}/metrics"
    try:
        with Load(triton) as load:
            for _ in range(3):
                monitor.step()
            assert level_of(controller) is DeviceLevel.L2_CPU
            assert group_names(triton) == ["dispatch_model_cpu"]
            assert triton.is_ready()  # degraded, still ready
            assert read_router_settings(triton.http_url).cpu_scoring == 1
            assert levels_now(triton) == {3}  # every answer says "scored on the CPU"
            text = scrape(metrics_url)
            assert "dispatch_device_fallback_level 2.0" in text
            assert 'dispatch_gpu_health_state{gpu="1",uuid="GPU-1"} 2.0' in text
            answered = len(load.levels)
            assert wait_for(lambda: len(load.levels) >= answered + 3)
            sampler.replace([[calm(0), calm(1)]])
            monitor.step()
            assert level_of(controller) is DeviceLevel.L2_CPU  # clear, but waiting restore_after_s
            time.sleep(SETTINGS.restore_after_s)
            monitor.step()
            assert level_of(controller) is DeviceLevel.L0_ALL_GPUS
            assert model_config(triton.http_url, "dispatch_model") == two_gpus
            assert read_router_settings(triton.http_url).cpu_scoring == 0
            assert levels_now(triton) == {0}
            assert "dispatch_device_fallback_level 0.0" in scrape(metrics_url)
    finally:
        endpoint.shutdown()
        endpoint.server_close()
    assert load.failures == []
    assert {level for answer in load.levels for level in answer} == {0, 3}


def test_a_refused_cpu_load_keeps_the_server_ready_and_bounds_the_router_wait(
    triton: TritonServer, served: dict[str, Any]
) -> None:
    """L3: the CPU load is refused (injected), so the model stays where it was; the router's
    per-call timeout drops to l3_bls_timeout_ms so that a broken GPU costs at most that
    before the rule-based dispatcher answers (tests/integration/test_canary.py shows the
    rule-based answers of a failing model). Nothing is unloaded: the server stays ready."""
    before = read_router_settings(triton.http_url)

    def refuse_cpu(url: str, model: str, config: Any, key: Any, timeout_s: float) -> None:
        if config["instance_group"][0].get("name") == "dispatch_model_cpu":
            raise ModelControlError("HTTP 400: CPU load refused (injected)", 400)
        load_model(url, model, config, key, timeout_s)

    controller = FallbackController(triton.http_url, SETTINGS, ADMIN_KEY, load=refuse_cpu)
    sampler = ScriptedSampler([[hot(0), hot(1)]])
    monitor = GpuMonitor(sampler, SETTINGS, controller)
    http = httpclient.InferenceServerClient(triton.http_url, network_timeout=60.0)
    tensors = sim_window(22, 16, 60)
    try:
        for _ in range(3):
            monitor.step()
        assert [t.level for t in controller.transitions] == [
            DeviceLevel.L2_CPU,
            DeviceLevel.L3_RULE_BASED,
        ]
        assert level_of(controller) is DeviceLevel.L3_RULE_BASED
        assert model_config(triton.http_url, "dispatch_model") == served
        assert read_router_settings(triton.http_url).bls_timeout_ms == SETTINGS.l3_bls_timeout_ms
        assert triton.is_ready()
        out = infer_http(http, tensors, output_names=ROUTED_OUTPUT_NAMES)
        assert len(np.asarray(out["ORDER_FALLBACK_LEVEL"])) == 16
        sampler.replace([[calm(0), calm(1)]])
        monitor.step()
        time.sleep(SETTINGS.restore_after_s)
        monitor.step()
        assert level_of(controller) is DeviceLevel.L0_ALL_GPUS
        assert read_router_settings(triton.http_url) == before
        assert model_config(triton.http_url, "dispatch_model") == served
    finally:
        http.close()
        if read_router_settings(triton.http_url) != before:
            apply_router_settings(triton.http_url, before, ADMIN_KEY)
