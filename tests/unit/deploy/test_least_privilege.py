"""Least privilege in every rendered Kubernetes workload: a pod runs as a non-root user under
the runtime's seccomp profile, no container can gain privileges or holds a capability, the
root filesystem is read-only, and what is written (the launcher's copy of the model
repository under /tmp, the backend's /dev/shm) goes to emptyDir volumes; no host namespace,
no host path, no service-account token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kustomize_subset import pod_containers, render

from dispatch_service.core.paths import REPO_ROOT

OVERLAYS = sorted((REPO_ROOT / "deploy" / "k8s" / "overlays").iterdir())
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")


def workloads(overlay: Path) -> list[dict[str, Any]]:
    found = [r for r in render(overlay) if r.get("spec", {}).get("template", {}).get("spec")]
    assert found, f"{overlay.name}: no workload rendered"
    return found


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_every_pod_runs_non_root_without_privileges(overlay: Path) -> None:
    for workload in workloads(overlay):
        name = f"{overlay.name}/{workload['metadata']['name']}"
        pod = workload["spec"]["template"]["spec"]
        context = pod.get("securityContext", {})
        assert context.get("runAsNonRoot") is True, name
        assert context.get("runAsUser", 0) != 0 and context.get("runAsGroup", 0) != 0, name
        assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault", name
        assert pod.get("automountServiceAccountToken") is False, name
        assert not any(pod.get(field) for field in HOST_NAMESPACES), name
        assert not [v for v in pod.get("volumes", []) if "hostPath" in v], name
        for container in pod_containers(workload):
            where = f"{name} container {container['name']}"
            security = container.get("securityContext", {})
            assert security.get("allowPrivilegeEscalation") is False, where
            assert security.get("readOnlyRootFilesystem") is True, where
            assert security.get("privileged", False) is False, where
            assert security.get("capabilities", {}).get("drop") == ["ALL"], where
            assert not security.get("capabilities", {}).get("add"), where
            assert security.get("runAsUser", 1) != 0, where


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_what_the_launcher_writes_goes_to_empty_dirs(overlay: Path) -> None:
    """With a read-only root filesystem, every writable mount is an emptyDir: /tmp (the
    verified copy of the repository, Triton's and the launcher's files) and /dev/shm."""
    for workload in workloads(overlay):
        pod = workload["spec"]["template"]["spec"]
        volumes = {volume["name"]: volume for volume in pod.get("volumes", [])}
        for container in pod_containers(workload):
            where = f"{overlay.name}/{workload['metadata']['name']} {container['name']}"
            mounts = container.get("volumeMounts", [])
            for mount in mounts:
                volume = volumes[mount["name"]]
                if not mount.get("readOnly"):
                    assert "emptyDir" in volume, f"{where}: {mount['mountPath']} is writable"
            if container["name"] == "triton":
                paths = {m["mountPath"]: volumes[m["name"]] for m in mounts}
                assert "emptyDir" in paths["/tmp"] and "emptyDir" in paths["/dev/shm"], where
