"""The rollout controller's Kubernetes manifests (deploy/k8s/rollout-controller): valid
resources, one pod with the least privilege the launchers have (its token aside, which only
replaces the fleet's ConfigMap), its signing key and outcome store from Secrets, and a
command line dispatch-admin accepts."""

from __future__ import annotations

import kubernetes_validate
from kustomize_subset import pod_containers, render

from dispatch_service.core.paths import REPO_ROOT
from dispatch_service.ops import admin

FOLDER = REPO_ROOT / "deploy" / "k8s" / "rollout-controller"
KUBERNETES_VERSION = "1.30"


def by_kind() -> dict[str, dict]:  # type: ignore[type-arg]
    resources = render(FOLDER)
    kinds = [r["kind"] for r in resources]
    wanted = ["ServiceAccount", "Role", "RoleBinding", "PersistentVolumeClaim", "Deployment"]
    assert sorted(kinds) == sorted([*wanted, "PodMonitor"])
    return {r["kind"]: r for r in resources}


def test_the_resources_are_valid_kubernetes_in_the_fleets_namespace() -> None:
    for resource in by_kind().values():
        assert resource["metadata"]["namespace"] == "dispatch"
        if resource["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: test_prometheus_scrapes_the_controllers_metrics_port
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_prometheus_scrapes_the_controllers_metrics_port() -> None:
    resources = by_kind()
    monitor, deployment = resources["PodMonitor"], resources["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = pod_containers(deployment)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    args = admin.build_parser().parse_args([*container["command"], *container["args"]][3:])
    assert ports[endpoint["port"]] == args.metrics_port
    assert args.metrics_address == "0.0.0.0"


def test_one_controller_with_least_privilege() -> None:
    resources = by_kind()
    deployment = resources["Deployment"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == resources["ServiceAccount"]["metadata"]["name"]
    context = pod["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] != 0
    assert context["seccompProfile"]["type"] == "RuntimeDefault"
    (container,) = pod_containers(deployment)
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for mount in container["volumeMounts"]:
        if not mount.get("readOnly"):  # the store of record persists; the rest is scratch
            volume = volumes[mount["name"]]
            assert "emptyDir" in volume or "persistentVolumeClaim" in volume, mount
    (rule,) = resources["Role"]["rules"]
    assert rule == {
        "apiGroups": [""],
        "resources": ["configmaps"],
        "resourceNames": ["dispatch-fleet-state"],
        "verbs": ["get", "update"],
    }


def test_secrets_come_from_secrets_and_the_command_parses() -> None:
    deployment = by_kind()["Deployment"]
    (container,) = pod_containers(deployment)
    env = {item["name"]: item for item in container["env"]}
    for name in ("DISPATCH_SIGNING_KEY", "DISPATCH_OUTCOME_STORE"):
        assert "secretKeyRef" in env[name]["valueFrom"], name
        assert "value" not in env[name], name
    command = [*container["command"], *container["args"]]
    assert command[:3] == ["python3", "-m", "dispatch_service.ops.admin"]
    args = admin.build_parser().parse_args(command[3:])
    assert args.rollout_command == "run" and args.forever
    assert args.publish_configmap == "dispatch-fleet-state"
    assert args.model_repository == "/models"
