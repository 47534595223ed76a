"""The Kubernetes overlays carry the fleet's state store and every pod's watcher on it.

Rendered with the kustomize subset of `test_deploy` (loaded from its file: test modules are
imported by path here); each check is on what the overlay renders, for both profiles.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dispatch_service.core.signing import TRUSTED_KEYS_ENV
from dispatch_service.ops.fleet_state import STATE_FILE, STATE_STORE_ENV
from dispatch_service.ops.server_cli import build_parser

OVERLAYS = ("gpu", "cpu")
KUBERNETES_VERSION = "1.30"
STATE_CONFIGMAP = "dispatch-fleet-state"
KEYS_CONFIGMAP = "dispatch-trusted-keys"
CONFIGMAPS = Path(__file__).parents[3] / "deploy" / "k8s" / "base" / "fleet-state.yaml"


@cache
def deploy_checks() -> ModuleType:
    path = Path(__file__).with_name("test_deploy.py")
    spec = importlib.util.spec_from_file_location("deploy_checks_for_fleet", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered(overlay: str) -> list[dict[str, Any]]:
    resources: list[dict[str, Any]] = deploy_checks().rendered(overlay)
    return resources


def container(resources: list[dict[str, Any]]) -> dict[str, Any]:
    found: dict[str, Any] = deploy_checks().triton_container(resources)
    return found


def shipped_configmaps() -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = list(yaml.safe_load_all(CONFIGMAPS.read_text()))
    return documents


def configmap(resources: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [r for r in resources if r["kind"] == "ConfigMap" and r["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one ConfigMap {name}"
    return found[0]


def env_of(resources: list[dict[str, Any]]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(resources)["env"]}


def mounted(resources: list[dict[str, Any]], path: str) -> dict[str, Any]:
    """The volume mounted at ``path`` (with its mount's readOnly)."""
    mounts = {m["mountPath"]: m for m in container(resources)["volumeMounts"]}
    assert path in mounts, f"nothing is mounted at {path}"
    spec = deploy_checks().pod_spec(resources)
    volumes = {v["name"]: v for v in spec["volumes"]}
    return {**volumes[mounts[path]["name"]], "readOnly": mounts[path].get("readOnly", False)}


def launcher_args(resources: list[dict[str, Any]]) -> argparse.Namespace:
    """The launcher's parsed options as the pod's environment sets their defaults."""
    env = env_of(resources)
    saved = {name: os.environ.get(name) for name in env}
    try:
        os.environ.update(env)
        return build_parser().parse_args([])
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_watches_the_state_configmap_read_only(overlay: str) -> None:
    resources = rendered(overlay)
    args = launcher_args(resources)
    assert args.state_store is not None, f"{STATE_STORE_ENV} must point the watcher at a store"
    store = mounted(resources, str(args.state_store))
    assert store["configMap"]["name"] == STATE_CONFIGMAP
    assert store["readOnly"] is True
    assert "items" not in store["configMap"], "the whole map: the kubelet then updates the file"
    assert all("subPath" not in m for m in container(resources)["volumeMounts"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_document_is_verified_with_mounted_trusted_keys(overlay: str) -> None:
    resources = rendered(overlay)
    args = launcher_args(resources)
    assert args.trusted_keys is not None, f"{TRUSTED_KEYS_ENV}: a store needs trusted keys"
    keys = mounted(resources, str(args.trusted_keys))
    assert keys["configMap"]["name"] == KEYS_CONFIGMAP
    assert keys["readOnly"] is True


def test_the_configmaps_ship_without_data_so_an_apply_never_wipes_a_deploy() -> None:
    for name in (STATE_CONFIGMAP, KEYS_CONFIGMAP):
        resource = configmap(shipped_configmaps(), name)
        assert "data" not in resource and "binaryData" not in resource, name
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlays_leave_the_maps_to_the_operator(overlay: str) -> None:
    """Not rendered: a later `kubectl apply -k` must never put an older document back."""
    kinds = {r["kind"] for r in rendered(overlay)}
    assert "ConfigMap" not in kinds


def test_the_configmap_file_says_how_to_fill_the_store() -> None:
    text = CONFIGMAPS.read_text()
    assert f"--from-file={STATE_FILE}=" in text
    assert "kubectl replace" in text
