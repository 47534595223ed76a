"""The device-level fallback against a recording stand-in of the repository API: which
configuration JSON each level sends, and how a failed load moves down the chain.

tests/integration/test_gpu_fallback.py applies the same overrides to a live server."""

from __future__ import annotations

import json

import pytest
from gpu_stand_in import GPU_CONFIG, GPU_GROUP, Clock, FakeRepository

from dispatch_service.ops.gpu.fallback import (
    DeviceLevel,
    cpu_config,
    l1_config,
    level_for,
)
from dispatch_service.ops.gpu.settings import GpuMonitorSettings
from dispatch_service.ops.model_control import ModelControlError
from dispatch_service.routing.settings import RouterSettings

SETTINGS = GpuMonitorSettings()


def test_levels_follow_the_serving_gpus() -> None:
    assert level_for(frozenset({0, 1}), [0, 1]) is DeviceLevel.L0_ALL_GPUS
    assert level_for(frozenset({1}), [0, 1]) is DeviceLevel.L1_OTHER_GPUS
    assert level_for(frozenset(), [0, 1]) is DeviceLevel.L2_CPU
    assert level_for(frozenset(), []) is DeviceLevel.L0_ALL_GPUS  # no GPU: nothing to do


def test_the_l1_override_for_kind_gpu_leaves_the_unhealthy_gpu_out() -> None:
    override = l1_config(GPU_CONFIG, [GPU_GROUP], frozenset({0}), [0, 1], SETTINGS)
    # The JSON sent as {"parameters": {"config": ...}}: only instance_group changes.
    assert json.loads(json.dumps(override)) == {
        **GPU_CONFIG,
        "instance_group": [{**GPU_GROUP, "gpus": [0]}],
    }
    # A group without a gpus list covers every GPU; a CPU group stays as it is.
    plain = {"kind": "KIND_GPU", "count": 2}
    cpu = {"kind": "KIND_CPU", "count": 1}
    groups = l1_config(GPU_CONFIG, [plain, cpu], frozenset({1, 2}), [0, 1, 2], SETTINGS)
    assert groups["instance_group"] == [{"kind": "KIND_GPU", "count": 2, "gpus": [1, 2]}, cpu]
    with pytest.raises(ValueError, match="no GPU instance group"):
        l1_config(GPU_CONFIG, [{**GPU_GROUP, "gpus": [1]}], frozenset({0}), [0, 1], SETTINGS)


def test_the_cpu_stand_in_names_one_group_per_serving_gpu() -> None:
    settings = GpuMonitorSettings(l1_instance_kind="KIND_CPU", instances_per_gpu=2)
    override = l1_config(GPU_CONFIG, [GPU_GROUP], frozenset({1}), [0, 1], settings)
    assert override["instance_group"] == [
        {"name": "dispatch_model_gpu1", "kind": "KIND_CPU", "count": 2}
    ]


def test_the_l2_override_runs_on_cpu_instances_only() -> None:
    override = cpu_config(GPU_CONFIG, GpuMonitorSettings(cpu_instances=3))
    assert override["instance_group"] == [
        {"name": "dispatch_model_cpu", "kind": "KIND_CPU", "count": 3}
    ]
    assert override["version_policy"] == GPU_CONFIG["version_policy"]
    assert override["parameters"] == GPU_CONFIG["parameters"]
    # The embedded build's stand-in for the gpu profile: a Python runner with the CUDA EP.
    python_cuda = {**GPU_CONFIG, "parameters": {"execution_provider": {"string_value": "cuda"}}}
    assert cpu_config(python_cuda, SETTINGS)["parameters"] == {
        "execution_provider": {"string_value": "cpu"}
    }


def test_one_unhealthy_gpu_then_recovery_reloads_twice_and_restores_the_original() -> None:
    repo = FakeRepository(GPU_CONFIG)
    control = repo.controller()
    assert control.reconcile(frozenset({0, 1}), [0, 1]) == []  # healthy: nothing sent
    (step,) = control.reconcile(frozenset({0}), [0, 1])
    assert (step.level, step.serving, step.error) == (DeviceLevel.L1_OTHER_GPUS, (0,), None)
    assert repo.config is not None and repo.config["instance_group"][0]["gpus"] == [0]
    assert control.reconcile(frozenset({0}), [0, 1]) == []  # applied once, not every round
    (back,) = control.reconcile(frozenset({0, 1}), [0, 1])
    assert back.level is DeviceLevel.L0_ALL_GPUS
    assert repo.config == GPU_CONFIG
    assert [action for action, _ in repo.sent] == ["load", "load"]


def test_overrides_keep_what_others_changed_meanwhile() -> None:
    repo = FakeRepository(GPU_CONFIG)
    control = repo.controller()
    control.reconcile(frozenset({1}), [0, 1])
    assert repo.config is not None
    repo.config["version_policy"] = {"specific": {"versions": [1, 2, 3]}}  # a canary deploy
    control.reconcile(frozenset({0, 1}), [0, 1])
    assert repo.config["version_policy"] == {"specific": {"versions": [1, 2, 3]}}
    assert repo.config["instance_group"] == [GPU_GROUP]


def test_no_gpu_left_goes_to_the_cpu_and_a_failed_cpu_load_to_rule_based() -> None:
    repo = FakeRepository(GPU_CONFIG)
    control = repo.controller()
    step, router = control.reconcile(frozenset(), [0, 1])
    assert step.level is DeviceLevel.L2_CPU and step.error is None
    assert repo.config is not None and repo.config["instance_group"][0]["kind"] == "KIND_CPU"
    # The router reports the CPU-scored orders at ORDER_FALLBACK_LEVEL 3 from now on.
    assert router.config is None and router.router is not None
    assert repo.router.settings == RouterSettings(stable_version=1, canary_version=2, cpu_scoring=1)
    (back, router) = control.reconcile(frozenset({1}), [0, 1])  # GPU 1 is back: L1
    assert back.level is DeviceLevel.L1_OTHER_GPUS and repo.router.settings.cpu_scoring == 0

    repo = FakeRepository(GPU_CONFIG)
    repo.refuse = {"KIND_CPU"}
    control = repo.controller()
    l2, l3 = control.reconcile(frozenset(), [0, 1])
    assert l2.level is DeviceLevel.L2_CPU and l2.error and "failed to load" in l2.error
    # L3: the model stays loaded (readiness), the router stops waiting long for it.
    assert l3.level is DeviceLevel.L3_RULE_BASED and l3.error is None
    assert l3.router is not None and l3.router.bls_timeout_ms == 100
    assert repo.router.settings.bls_timeout_ms == 100 and repo.router.settings.cpu_scoring == 0
    assert repo.router.settings.canary_version == 2  # nothing else changes
    assert repo.config == GPU_CONFIG and control.level is DeviceLevel.L3_RULE_BASED
    assert control.reconcile(frozenset(), [0, 1]) == []  # stays there, no retry storm
    # The GPUs recover: the model's own configuration, then the router's own timeout.
    back, router = control.reconcile(frozenset({0, 1}), [0, 1])
    assert back.level is DeviceLevel.L0_ALL_GPUS and back.error is None
    assert router.level is DeviceLevel.L0_ALL_GPUS
    assert router.router is not None and router.router.bls_timeout_ms == 2000
    assert repo.router.settings == RouterSettings(stable_version=1, canary_version=2)
    assert repo.config == GPU_CONFIG


def test_a_refused_l1_load_moves_on_to_the_cpu() -> None:
    repo = FakeRepository(GPU_CONFIG)
    repo.refuse = {"KIND_GPU"}
    control = repo.controller()
    l1, l2, router = control.reconcile(frozenset({1}), [0, 1])
    assert l1.error is not None and l2.level is DeviceLevel.L2_CPU and l2.error is None
    assert router.router is not None and router.router.cpu_scoring == 1
    assert control.level is DeviceLevel.L2_CPU


def test_a_refused_change_is_tried_again_after_retry_after_s() -> None:
    repo = FakeRepository(GPU_CONFIG)
    clock = Clock()
    control = repo.controller(GpuMonitorSettings(retry_after_s=30.0), clock)
    control.reconcile(frozenset({0}), [0, 1])
    repo.refuse = {"KIND_GPU"}
    (failed,) = control.reconcile(frozenset({0, 1}), [0, 1])
    assert failed.error is not None and control.level is DeviceLevel.L1_OTHER_GPUS
    repo.refuse = set()
    clock.now = 29.0
    assert control.reconcile(frozenset({0, 1}), [0, 1]) == []  # not every round
    clock.now = 30.0
    (done,) = control.reconcile(frozenset({0, 1}), [0, 1])
    assert done.error is None and repo.config == GPU_CONFIG


def test_a_router_that_cannot_be_updated_does_not_undo_the_model_change() -> None:
    repo = FakeRepository(GPU_CONFIG)

    def refuse(settings: RouterSettings) -> None:
        raise ModelControlError("HTTP 400: dispatch_router refused")

    repo.router.apply = refuse  # type: ignore[method-assign]
    control = repo.controller()
    l2, router = control.reconcile(frozenset(), [0, 1])
    assert l2.error is None and control.level is DeviceLevel.L2_CPU
    assert router.error is not None and "dispatch_router refused" in router.error
