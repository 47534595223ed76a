"""Deployment files: Dockerfiles, docker-compose, Prometheus/Grafana, Kubernetes manifests.

Nothing here needs Docker, kubectl or a network. The Kubernetes overlays are rendered by
`kustomize_subset` (resources, namespace, images, JSON 6902 patches) and every built-in
resource is validated against the Kubernetes 1.30 schemas of `kubernetes-validate` in strict
mode; the ServiceMonitor (a CRD) is checked structurally. Where `promtool`, `kubectl` or
docker compose (the plugin or the standalone `docker-compose`) happen to be installed, the
PromQL, the kustomize rendering and the compose file are also checked with the real tools,
compose run the way deploy/README.md runs it (the two keys in its environment).
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import os
import re
import secrets
import shutil
import subprocess
from dataclasses import astuple
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kustomize_subset import (
    KustomizeError,
    apply_json_patch,
    load_yaml,
    pod_containers,
    render,
)

from dispatch_service.core.metrics import ALL_METRICS, DECISION_RECORDS
from dispatch_service.ops.gpu.export import METRIC_NAMES as GPU_MONITOR_METRICS
from dispatch_service.ops.keys import AccessKeys
from dispatch_service.ops.server import Ports, ServerOptions, TritonRuntime, TritonServer
from dispatch_service.ops.server_cli import build_parser, options_from_args
from dispatch_service.outcomes.service import OUTCOME_SERIES
from dispatch_service.routing.metrics import (
    FALLBACK_ORDERS,
    FUSED_ROUTING_METRICS,
    MODEL_ERRORS,
    MODEL_LATENCY,
    ROUTED_ORDERS,
    ROUTER_METRICS,
    SHADOW_ORDERS,
    SHADOW_TOP1_AGREEMENTS,
)

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE_GPU = ROOT / "docker" / "Dockerfile"
DOCKERFILE_CPU = ROOT / "docker" / "Dockerfile.cpu"
COMPOSE = ROOT / "docker-compose.yml"
DEPLOY = ROOT / "deploy"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
GRAFANA_DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
GRAFANA_PROVIDERS = DEPLOY / "grafana" / "provisioning" / "dashboards" / "dashboards.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "dispatch.json"
K8S = DEPLOY / "k8s"
ADAPTER_RULES = K8S / "prometheus-adapter-rules.yaml"
OVERLAYS = ("gpu", "cpu")
KUBERNETES_VERSION = "1.30"  # the schemas every built-in resource is validated against
HPA_METRIC = "triton_queue_time_us_per_request"

Doc = dict[str, Any]

# Metric names Triton 2.51 exposes (request, latency counters and summaries, GPU, CPU, pools).
TRITON_METRICS = frozenset(
    {
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_inference_pending_request_count",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
        "nv_inference_request_summary_us",
        "nv_inference_queue_summary_us",
        "nv_inference_compute_input_summary_us",
        "nv_inference_compute_infer_summary_us",
        "nv_inference_compute_output_summary_us",
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_power_usage",
        "nv_gpu_power_limit",
        "nv_energy_consumption",
        "nv_cpu_utilization",
        "nv_cpu_memory_used_bytes",
        "nv_cpu_memory_total_bytes",
        "nv_pinned_memory_pool_used_bytes",
        "nv_pinned_memory_pool_total_bytes",
    }
)
# The launcher's series (its health port), as a started launcher serves them: its supervisor's
# registry with the fleet watcher's and the crash counter's series.
LAUNCHER_METRICS = frozenset(
    {
        "dispatch_build_info",
        "dispatch_launcher_ready",
        "dispatch_launcher_degraded",
        "dispatch_launcher_fallback_level",
        "dispatch_launcher_unhealed",
        "dispatch_launcher_probes_total",
        "dispatch_launcher_stub_restarts_total",
        "dispatch_launcher_server_restarts_total",
        "dispatch_launcher_server_crashes_total",
        "dispatch_launcher_fleet_state_revision",
        "dispatch_launcher_fleet_state_refused",
        "dispatch_launcher_fleet_state_applies_total",
        "dispatch_launcher_fleet_state_refusals_total",
        *OUTCOME_SERIES,
    }
)
# The project's custom metrics (Python models through pb_utils.MetricFamily), as the library
# defines them: a panel can only read what some model records.
PROJECT_METRICS = frozenset(
    (
        *(spec.name for spec in (*ALL_METRICS, *ROUTER_METRICS, *FUSED_ROUTING_METRICS)),
        DECISION_RECORDS.name,
        *GPU_MONITOR_METRICS,
        *LAUNCHER_METRICS,
    )
)
# What the dashboard must show.
DASHBOARD_REQUIRED = frozenset(
    {
        "nv_inference_request_summary_us",
        "nv_inference_request_duration_us",
        "nv_inference_queue_duration_us",
        "nv_inference_request_success",
        "nv_inference_request_failure",
        "nv_inference_count",
        "nv_inference_exec_count",
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
        *(spec.name for spec in ALL_METRICS),
        *(spec.name for spec in (ROUTED_ORDERS, FALLBACK_ORDERS, MODEL_LATENCY, MODEL_ERRORS)),
        *(spec.name for spec in (SHADOW_ORDERS, SHADOW_TOP1_AGREEMENTS)),
        "dispatch_gpu_health_state",
        "dispatch_gpu_unhealthy_reason",
        "dispatch_gpu_samples_over_threshold",
        "dispatch_device_fallback_level",
        # readiness, fleet revision, restarts and crashes per pod (the launcher's port)
        "dispatch_launcher_ready",
        "dispatch_launcher_fleet_state_revision",
        "dispatch_launcher_server_restarts_total",
        "dispatch_launcher_server_crashes_total",
        "dispatch_launcher_stub_restarts_total",
        # live quality from outcomes, and the decision records behind it (docs/outcomes.md)
        DECISION_RECORDS.name,
        "dispatch_outcomes_received_total",
        "dispatch_quality_eta_mae",
        "dispatch_quality_eta_bias",
        "dispatch_quality_brier",
        "dispatch_quality_ece",
        "dispatch_quality_late_rate",
    }
)


# ------------------------------------------------------------------------------ helpers


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) per instruction; continuation lines joined, comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, f"{path}: dangling line continuation"
    return instructions


def instruction(path: Path, keyword: str) -> str:
    found = [rest for key, rest in dockerfile_instructions(path) if key == keyword]
    assert len(found) == 1, f"{path.name}: expected one {keyword}, found {len(found)}"
    return found[0]


def expanded_runs(path: Path) -> str:
    """All RUN commands with the ENV variables set before them expanded."""
    env: dict[str, str] = {}
    runs = []
    for key, rest in dockerfile_instructions(path):
        if key == "ENV":
            for name, value in re.findall(r"(\w+)=(\S+)", rest):
                env[name] = value
        elif key == "RUN":
            runs.append(re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), m.group(0)), rest))
    return "\n".join(runs)


def entrypoint(path: Path) -> list[str]:
    args = json.loads(instruction(path, "ENTRYPOINT"))
    assert isinstance(args, list)
    assert all(isinstance(arg, str) for arg in args)
    return args


def flag_values(args: list[str], name: str) -> list[str]:
    """Values of `--name=value` (or `--name value`) in an argument list."""
    values = []
    for index, arg in enumerate(args):
        if arg.startswith(f"{name}="):
            values.append(arg.split("=", 1)[1])
        elif arg == name and index + 1 < len(args):
            values.append(args[index + 1])
    return values


def flag(args: list[str], name: str) -> str:
    values = flag_values(args, name)
    assert len(values) == 1, f"{name} given {len(values)} times in {args}"
    return values[0]


def server_ports(args: list[str]) -> Ports:
    return Ports(
        int(flag(args, "--http-port")),
        int(flag(args, "--grpc-port")),
        int(flag(args, "--metrics-port")),
    )


def healthcheck_url(text: str) -> str:
    match = re.search(r"https?://[^'\"\s]+", text)
    assert match, f"no URL in health check {text!r}"
    return match.group(0)


def url_port(url: str) -> int:
    match = re.match(r"https?://[^/:]+:(\d+)", url)
    assert match, f"no explicit port in {url}"
    return int(match.group(1))


def image_launch(dockerfile: Path) -> argparse.Namespace:
    """The image's entrypoint, read by the launcher's own parser (bad flags fail here)."""
    args = entrypoint(dockerfile)
    assert args[:3] == ["python3", "-m", "dispatch_service.ops.server"], args[:3]
    return build_parser().parse_args(args[3:])


def image_triton_command(dockerfile: Path) -> list[str]:
    """The tritonserver command the image's launcher runs (keys stand-ins)."""
    launch = image_launch(dockerfile)
    options = options_from_args(launch, AccessKeys(admin="a", shm="s"))
    runtime = TritonRuntime.from_install(launch.tritonserver, launch.venv / "bin")
    return TritonServer(runtime, options, launch.log).command()


def launcher_command() -> list[str]:
    """What `make serve` runs (dispatch_service.ops.server), with its default ports."""
    fake = Path("/opt/triton")
    runtime = TritonRuntime(fake / "bin" / "tritonserver", fake / "lib", fake / "backends", fake)
    return TritonServer(runtime, ServerOptions(), Path("/tmp/server.log")).command()


def compose() -> Doc:
    doc = load_yaml(COMPOSE)
    assert isinstance(doc, dict)
    return doc


def compose_services() -> dict[str, Doc]:
    services = compose()["services"]
    assert isinstance(services, dict)
    return services


def triton_services() -> dict[str, Doc]:
    return {
        name: service
        for name, service in compose_services().items()
        if "build" in service and "dockerfile" in service["build"]
    }


def service_dockerfile(service: Doc) -> Path:
    build = service["build"]
    return (ROOT / str(build.get("context", ".")) / str(build["dockerfile"])).resolve()


def container_ports(service: Doc) -> set[int]:
    ports = set()
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports.add(int(entry["target"]))
        else:
            ports.add(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
    return ports


def bind_mounts(service: Doc) -> list[Doc]:
    """Bind mounts in long form: {source, target, read_only}; named volumes left out."""
    mounts = []
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            if entry.get("type") == "bind":
                mounts.append(entry)
            continue
        parts = str(entry).split(":")
        if parts[0].startswith((".", "/")):
            read_only = len(parts) > 2 and "ro" in parts[2].split(",")
            mounts.append({"source": parts[0], "target": parts[1], "read_only": read_only})
    return mounts


def dashboard() -> Doc:
    doc = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def dashboard_panels() -> list[Doc]:
    panels: list[Doc] = []
    for panel in dashboard()["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows keep theirs inside
    return [panel for panel in panels if panel.get("type") != "row"]


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in dashboard_panels() for target in panel["targets"]]


def metric_names(expr: str) -> set[str]:
    """Metric families an expression reads (histogram series named by their family)."""
    names = set()
    for name in re.findall(r"\b((?:nv|dispatch)_[a-z0-9_]+)\b", expr):
        if name not in TRITON_METRICS | PROJECT_METRICS:
            name = re.sub(r"_(bucket|sum|count)$", "", name)
        names.add(name)
    return names


def byte_size(text: str) -> int:
    """Compose's size notation (`2gb`, `512m`, `1073741824`) in bytes."""
    match = re.fullmatch(r"(\d+)\s*([kmg]?)b?", str(text).strip().lower())
    assert match, f"not a size: {text!r}"
    unit = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}[match.group(2)]
    return int(match.group(1)) * unit


def adapter_rule() -> Doc:
    rules = load_yaml(ADAPTER_RULES)["rules"]["custom"]
    matching = [rule for rule in rules if rule["name"]["as"] == HPA_METRIC]
    assert len(matching) == 1, f"one adapter rule must serve {HPA_METRIC}"
    rule = matching[0]
    assert isinstance(rule, dict)
    return rule


def rendered(overlay: str) -> list[Doc]:
    return render(K8S / "overlays" / overlay)


def one(resources: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [
        resource
        for resource in resources
        if resource["kind"] == kind and name in (None, resource["metadata"]["name"])
    ]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(resources: list[Doc]) -> Doc:
    spec = one(resources, "Deployment")["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def triton_container(resources: list[Doc]) -> Doc:
    containers = [c for c in pod_spec(resources)["containers"] if c["name"] == "triton"]
    assert len(containers) == 1
    container: Doc = containers[0]
    return container


def named_port(container: Doc, port: int | str) -> int:
    if isinstance(port, int):
        return port
    numbers = [p["containerPort"] for p in container["ports"] if p.get("name") == port]
    assert len(numbers) == 1, f"container has no port named {port!r}"
    return int(numbers[0])


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def image_profile(resources: list[Doc]) -> str:
    """The Dockerfile an overlay's image is built from, by its tag suffix."""
    tag = str(triton_container(resources)["image"]).rsplit(":", 1)[-1]
    assert tag.endswith(("-gpu", "-cpu")), f"image tag {tag!r} names no profile"
    return tag[-3:]


def dockerfile_for(profile: str) -> Path:
    return DOCKERFILE_GPU if profile == "gpu" else DOCKERFILE_CPU


# ------------------------------------------------------------------------- Dockerfiles


PATCHED_NGC = "nvcr.io/nvidia/tritonserver:25.10-py3"


@pytest.mark.parametrize(
    ("dockerfile", "profile"),
    [(DOCKERFILE_GPU, "gpu"), (DOCKERFILE_CPU, "cpu")],
    ids=["gpu", "cpu"],
)
def test_images_are_a_patched_ngc_release_serving_their_profile(
    dockerfile: Path, profile: str
) -> None:
    # 25.07 or newer carries the August 2025 fixes; the Dockerfile records the versions.
    assert instruction(dockerfile, "FROM") == PATCHED_NGC
    text = dockerfile.read_text(encoding="utf-8")
    for recorded in ("Triton     2.62.0", "Python     3.12", "ONNX Runtime", "rel-25-10.html"):
        assert recorded in text, recorded
    for cve in ("CVE-2025-23310", "CVE-2025-23319"):
        assert cve in text
    launch = image_launch(dockerfile)
    assert launch.profile == profile
    assert launch.tritonserver == Path("/opt/tritonserver/bin/tritonserver")
    assert str(launch.model_repository) == "/models"
    command = image_triton_command(dockerfile)
    assert flag(command, "--model-config-name") == profile
    assert flag(command, "--strict-readiness") == "true"
    assert flag(command, "--allow-gpu-metrics") == ("true" if profile == "gpu" else "false")
    # The NGC image brings its own backends (and its own 3.12 stub: nothing swapped).
    assert flag(command, "--backend-directory") == "/opt/tritonserver/backends"
    runs = " ".join(rest for key, rest in dockerfile_instructions(dockerfile) if key == "RUN")
    assert "python3.11" not in runs and "stub.python3" not in runs and "ln -s" not in runs
    assert "nvidia-pytriton" not in runs


def test_requires_python_covers_the_images_python() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'requires-python = ">=3\.(\d+),<3\.(\d+)"', text)
    assert match and int(match.group(1)) <= 11 and int(match.group(2)) >= 13


@pytest.mark.parametrize("dockerfile", [DOCKERFILE_GPU, DOCKERFILE_CPU], ids=["gpu", "cpu"])
def test_images_lock_the_control_endpoints_with_keys_from_the_environment(
    dockerfile: Path,
) -> None:
    launch = image_launch(dockerfile)
    assert launch.no_create_keys, "an image never starts with keys nobody knows"
    assert launch.admin_key is None and launch.shm_key is None  # never in the image
    assert launch.host == "0.0.0.0" and launch.expose
    command = image_triton_command(dockerfile)
    locked = " ".join(flag_values(command, "--grpc-restricted-protocol"))
    for group in ("model-repository", "logging", "trace", "shared-memory"):
        assert group in locked
    assert flag_values(command, "--http-restricted-api")


@pytest.mark.parametrize("dockerfile", [DOCKERFILE_GPU, DOCKERFILE_CPU], ids=["gpu", "cpu"])
def test_image_installs_the_project_and_copies_no_model_repository(dockerfile: Path) -> None:
    instructions = dockerfile_instructions(dockerfile)
    sources = []
    for key, rest in instructions:
        if key in ("COPY", "ADD"):
            words = [word for word in rest.split() if not word.startswith("--")]
            sources += words[:-1]
    assert sources, "the image must copy the project in"
    for source in sources:
        assert (ROOT / source).exists(), f"COPY source {source} missing"
        assert not source.startswith("model_repository"), "model repository is mounted"
    assert {"pyproject.toml", "python_backend", "client"} <= {Path(s).parts[0] for s in sources}
    runs = " ".join(rest for key, rest in instructions if key == "RUN")
    assert re.search(r"pip install -c \S*requirements/constraints\.txt", runs)
    assert "python -c 'import dispatch_service" in runs  # the build fails if it did not land
    assert instruction(dockerfile, "USER") not in ("0", "root")


def test_dockerignore_keeps_the_venv_and_model_repository_out_of_the_context() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".triton", ".git", "model_repository"} <= ignored
    for needed in ("pyproject.toml", "requirements", "python_backend", "client"):
        assert needed not in ignored


@pytest.mark.parametrize("dockerfile", [DOCKERFILE_GPU, DOCKERFILE_CPU], ids=["gpu", "cpu"])
def test_image_flags_match_the_launcher(dockerfile: Path) -> None:
    args, launcher = image_triton_command(dockerfile), launcher_command()
    assert server_ports(args) == server_ports(launcher) == Ports()
    for name in (
        "--strict-readiness",
        "--model-control-mode",
        "--exit-timeout-secs",
        "--rate-limit",
    ):
        assert flag(args, name) == flag(launcher, name)
    for address in ("--http-address", "--grpc-address", "--metrics-address"):
        assert flag(args, address) == "0.0.0.0"  # reachable from outside the container

    def shm_sizes(argv: list[str]) -> dict[str, str]:
        pairs = [value.split(",", 1)[1] for value in flag_values(argv, "--backend-config")]
        pairs = [pair for pair in pairs if pair.startswith("shm-")]
        return dict(pair.split("=", 1) for pair in pairs if "byte-size" in pair)

    assert shm_sizes(args) == shm_sizes(launcher)
    assert "shm-region-prefix-name" in " ".join(flag_values(args, "--backend-config"))
    expose = {int(port) for port in instruction(dockerfile, "EXPOSE").split()}
    assert expose == {*astuple(server_ports(args)), image_launch(dockerfile).health_port}


@pytest.mark.parametrize("dockerfile", [DOCKERFILE_GPU, DOCKERFILE_CPU], ids=["gpu", "cpu"])
def test_image_healthcheck_asks_the_launchers_deep_check(dockerfile: Path) -> None:
    check = instruction(dockerfile, "HEALTHCHECK")
    assert " CMD " in f" {check} "
    url = healthcheck_url(check)
    assert url.endswith("/readyz")
    assert url_port(url) == image_launch(dockerfile).health_port


# ---------------------------------------------------------------------- docker-compose


def test_compose_has_gpu_triton_cpu_variant_prometheus_and_grafana() -> None:
    services = compose_services()
    assert {"triton", "triton-cpu", "prometheus", "grafana"} <= set(services)
    assert service_dockerfile(services["triton"]) == DOCKERFILE_GPU
    assert service_dockerfile(services["triton-cpu"]) == DOCKERFILE_CPU
    assert services["triton-cpu"]["profiles"] == ["cpu"]
    assert "cpu" not in services["triton"].get("profiles", [])
    for name in ("triton", "triton-cpu"):
        assert ":" in services[name]["image"], f"{name} needs an image tag"
    # Prometheus and Grafana run with either profile.
    assert "profiles" not in services["prometheus"]
    assert "profiles" not in services["grafana"]


def test_compose_reserves_one_gpu_for_triton_only() -> None:
    services = compose_services()
    devices = services["triton"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert "deploy" not in services["triton-cpu"]


@pytest.mark.parametrize("name", ["triton", "triton-cpu"])
def test_compose_triton_runtime_settings(name: str) -> None:
    service = compose_services()[name]
    launch = image_launch(service_dockerfile(service))
    args = image_triton_command(service_dockerfile(service))
    mounts = [m for m in bind_mounts(service) if m["target"] == flag(args, "--model-repository")]
    assert len(mounts) == 1, "the model repository is mounted where the server looks"
    assert mounts[0]["read_only"] is True
    assert (ROOT / mounts[0]["source"]).resolve() == (ROOT / "model_repository").resolve()
    assert container_ports(service) == {*astuple(server_ports(args)), launch.health_port}
    assert byte_size(service["shm_size"]) >= 1024**3, "Python-backend tensors use /dev/shm"
    assert service["ulimits"] == {"memlock": -1, "stack": 67108864}
    test = service["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL")
    url = healthcheck_url(" ".join(test[1:]))
    assert url.endswith("/readyz")
    assert url_port(url) == launch.health_port
    # Keys from the operator's environment, required (`:?`), never a default in the file.
    env = service["environment"]
    for key in ("DISPATCH_ADMIN_KEY", "DISPATCH_SHM_KEY"):
        assert env[key].startswith(f"${{{key}:?"), key
    grace = int(str(service["stop_grace_period"]).rstrip("s"))
    assert grace >= launch.drain_timeout + int(flag(args, "--exit-timeout-secs"))
    # Prometheus finds either variant by the same name.
    assert "triton" in (service["networks"]["default"]["aliases"] + [name])


def test_compose_bind_mount_sources_exist() -> None:
    for name, service in compose_services().items():
        for mount in bind_mounts(service):
            assert (ROOT / mount["source"]).exists(), f"{name}: {mount['source']} missing"
    for name, service in triton_services().items():
        assert service_dockerfile(service).is_file(), f"{name}: Dockerfile missing"


def _compose_mount_for(service: str, target: str) -> Path:
    for mount in bind_mounts(compose_services()[service]):
        if mount["target"] == target:
            assert mount["read_only"] is True
            return (ROOT / str(mount["source"])).resolve()
    raise AssertionError(f"{service}: nothing mounted at {target}")


def test_prometheus_scrapes_triton_metrics_port() -> None:
    prometheus = compose_services()["prometheus"]
    config_path = flag(prometheus["command"], "--config.file")
    assert _compose_mount_for("prometheus", config_path) == PROMETHEUS_CONFIG.resolve()
    config = load_yaml(PROMETHEUS_CONFIG)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    targets = [t for sc in jobs["triton"]["static_configs"] for t in sc["targets"]]
    assert jobs["triton"].get("metrics_path", "/metrics") == "/metrics"
    names = set()
    for name, service in triton_services().items():
        names |= {name, *service["networks"]["default"]["aliases"]}
        metrics = server_ports(entrypoint(service_dockerfile(service))).metrics
        assert metrics in container_ports(service)
        for target in targets:
            assert int(target.rsplit(":", 1)[1]) == metrics
    for target in targets:
        assert target.rsplit(":", 1)[0] in names, f"{target} is no Triton service"


def test_grafana_provisioning_is_wired() -> None:
    provisioning = _compose_mount_for("grafana", "/etc/grafana/provisioning")
    assert provisioning == (DEPLOY / "grafana" / "provisioning").resolve()
    sources = load_yaml(GRAFANA_DATASOURCES)["datasources"]
    prometheus = [source for source in sources if source["type"] == "prometheus"]
    assert len(prometheus) == 1
    match = re.fullmatch(r"http://([a-z0-9-]+):(\d+)", prometheus[0]["url"])
    assert match and match.group(1) in compose_services()
    assert int(match.group(2)) in container_ports(compose_services()[match.group(1)])
    providers = load_yaml(GRAFANA_PROVIDERS)["providers"]
    assert len(providers) == 1 and providers[0]["type"] == "file"
    dashboards = _compose_mount_for("grafana", providers[0]["options"]["path"])
    assert dashboards == DASHBOARD.parent.resolve()
    # The dashboard's default datasource is the provisioned one.
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["datasource"]["current"]["value"] == prometheus[0]["uid"]


def compose_command() -> list[str] | None:
    """How this host runs compose: the docker plugin (`docker compose`, what the docs use) or
    the standalone `docker-compose`; None where neither answers."""
    candidates = [["docker", "compose"], ["docker-compose"]]
    for command in candidates:
        if shutil.which(command[0]) is None:
            continue
        try:
            probe = subprocess.run(
                [*command, "version"], capture_output=True, text=True, timeout=60, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return command
    return None


def compose_environment(**keys: str) -> dict[str, str]:
    """The caller's environment without any key of its own, plus ``keys``."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("DISPATCH_")}
    return env | keys


def run_compose(command: list[str], profile: str, env: dict[str, str]) -> CompletedProcess[str]:
    return subprocess.run(
        [*command, "-f", str(COMPOSE), "--profile", profile, "config", "-q"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=env,
        check=False,
    )


@pytest.fixture(scope="module")
def compose_cli() -> list[str]:
    command = compose_command()
    if command is None:
        pytest.skip("docker compose is not installed (neither the plugin nor docker-compose)")
    return command


@pytest.mark.parametrize("profile", ["gpu", "cpu"])
def test_compose_file_passes_docker_compose_config(compose_cli: list[str], profile: str) -> None:
    # As deploy/README.md runs it: the keys exported first (`openssl rand -base64 32` each).
    keys = {
        name: base64.b64encode(secrets.token_bytes(32)).decode()
        for name in ("DISPATCH_ADMIN_KEY", "DISPATCH_SHM_KEY")
    }
    result = run_compose(compose_cli, profile, compose_environment(**keys))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("missing", ["DISPATCH_ADMIN_KEY", "DISPATCH_SHM_KEY"])
def test_compose_refuses_to_run_triton_without_its_keys(
    compose_cli: list[str], missing: str
) -> None:
    keys = {"DISPATCH_ADMIN_KEY": "a" * 44, "DISPATCH_SHM_KEY": "s" * 44}
    del keys[missing]
    result = run_compose(compose_cli, "cpu", compose_environment(**keys))
    assert result.returncode != 0
    assert missing in result.stderr, result.stderr


# ------------------------------------------------------------------- Grafana dashboard


def test_dashboard_panels_all_query_something() -> None:
    doc = dashboard()
    assert doc["uid"] and doc["title"]
    panels = dashboard_panels()
    assert len(panels) >= 10
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel["title"], panel["id"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            assert target["expr"].strip(), f"panel {panel['title']!r} has an empty query"
        position = panel["gridPos"]
        assert position["x"] + position["w"] <= 24 and position["h"] > 0


def test_dashboard_covers_latency_queue_throughput_gpu_and_project_metrics() -> None:
    used = set().union(*(metric_names(expr) for expr in dashboard_exprs()))
    assert used <= TRITON_METRICS | PROJECT_METRICS, f"unknown metrics: {used - TRITON_METRICS}"
    missing = DASHBOARD_REQUIRED - used
    assert not missing, f"no panel for {sorted(missing)}"
    exprs = "\n".join(dashboard_exprs())
    assert re.search(r"by \(model, version\) \(rate\(nv_inference_request_success", exprs)
    assert re.search(r"histogram_quantile\(0\.99, .*dispatch_encoder_latency_ms_bucket", exprs)
    assert re.search(r"by \(rule\) \(rate\(dispatch_validation_rejections_total", exprs)
    assert re.search(r"by \(level, model_version\) \(rate\(dispatch_router_fallbacks_total", exprs)
    assert re.search(r"by \(model_version\) \(rate\(dispatch_router_orders_total", exprs)


def test_dashboard_model_variable_lists_triton_models() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert "nv_inference_request_success" in variables["model"]["definition"]
    assert any('model=~"$model"' in expr for expr in dashboard_exprs())


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promql_is_valid(tmp_path: Path) -> None:
    rules = [
        {
            "record": f"dashboard:query_{index}",
            "expr": expr.replace("$__rate_interval", "1m").replace("$model", ".*"),
        }
        for index, expr in enumerate(dashboard_exprs())
    ]
    query = adapter_rule()["metricsQuery"]
    query = query.replace("<<.LabelMatchers>>", 'namespace="dispatch",pod=~"dispatch-triton-.*"')
    rules.append({"record": "adapter:query", "expr": query.replace("<<.GroupBy>>", "pod")})
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "check", "rules": rules}]}))
    for command in (["check", "rules", str(path)], ["check", "config", str(PROMETHEUS_CONFIG)]):
        result = subprocess.run(
            ["promtool", *command], capture_output=True, text=True, timeout=60, check=False
        )
        assert result.returncode == 0, result.stdout + result.stderr


# -------------------------------------------------------------------------- Kubernetes


def test_renderer_applies_and_rejects_json_patches() -> None:
    document: Doc = {"spec": {"items": [{"name": "a"}]}}
    apply_json_patch(
        document,
        [
            {"op": "test", "path": "/spec/items/0/name", "value": "a"},
            {"op": "add", "path": "/spec/items/-", "value": {"name": "b"}},
            {"op": "add", "path": "/spec/x~1y", "value": 1},
            {"op": "replace", "path": "/spec/items/0/name", "value": "c"},
            {"op": "remove", "path": "/spec/x~1y"},
        ],
    )
    assert document == {"spec": {"items": [{"name": "c"}, {"name": "b"}]}}
    with pytest.raises(KustomizeError):
        apply_json_patch(document, [{"op": "test", "path": "/spec/items/0/name", "value": "a"}])
    with pytest.raises(KustomizeError):
        apply_json_patch(document, [{"op": "replace", "path": "/spec/nothing", "value": 1}])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_resources_are_valid_kubernetes(overlay: str) -> None:
    resources = rendered(overlay)
    kinds = sorted(resource["kind"] for resource in resources)
    assert kinds == sorted(
        [
            "Deployment",
            "HorizontalPodAutoscaler",
            "PersistentVolumeClaim",
            "PodDisruptionBudget",
            "PrometheusRule",
            "Service",
            "Service",
            "ServiceMonitor",
        ]
    )
    for resource in resources:
        assert resource["metadata"]["namespace"] == "dispatch"
        if resource["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # CRDs: test_service_monitor_scrapes_triton_and_the_launcher and
            # test_the_alert_rules_ship_as_a_prometheus_rule
        kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)


def test_validator_rejects_a_broken_resource() -> None:
    deployment = copy.deepcopy(one(rendered("cpu"), "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_runs_the_matching_image_and_profile(overlay: str) -> None:
    resources = rendered(overlay)
    assert image_profile(resources) == overlay
    args = image_triton_command(dockerfile_for(overlay))
    assert flag(args, "--model-config-name") == overlay
    container = triton_container(resources)
    # The image's entrypoint carries the server flags; the manifests must not fork them.
    assert "command" not in container and "args" not in container


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_image_tags_carry_the_product_version(overlay: str) -> None:
    tag = str(triton_container(rendered(overlay))["image"]).rsplit(":", 1)[-1]
    assert tag == f"{(ROOT / 'VERSION').read_text().strip()}-{overlay}"


def test_gpu_overlay_pins_pods_to_gpu_nodes_with_one_gpu() -> None:
    resources = rendered("gpu")
    spec = pod_spec(resources)
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    expressions = [e for term in terms["nodeSelectorTerms"] for e in term["matchExpressions"]]
    assert {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]} in expressions
    limits = triton_container(resources)["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) == 1
    assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"])
    (init,) = spec["initContainers"]
    script = " ".join(init["command"] + init.get("args", []))
    assert "nvidia-smi" in script
    bound = re.search(r"seq 1 (\d+)", script)
    assert bound and int(bound.group(1)) <= 120, "the GPU wait must give up"
    assert "exit 1" in script
    assert init["image"] == triton_container(resources)["image"]
    assert int(init["resources"]["limits"]["nvidia.com/gpu"]) == 1


def test_cpu_overlay_has_no_gpu_requirements() -> None:
    resources = rendered("cpu")
    spec = pod_spec(resources)
    assert "initContainers" not in spec
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in spec.get("affinity", {}).get(
        "nodeAffinity", {}
    )
    assert "tolerations" not in spec
    for container in pod_containers(one(resources, "Deployment")):
        for section in ("requests", "limits"):
            assert "nvidia.com/gpu" not in container["resources"].get(section, {})


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_and_ports_match_the_image(overlay: str) -> None:
    resources = rendered(overlay)
    container = triton_container(resources)
    launch = image_launch(dockerfile_for(overlay))
    ports = server_ports(image_triton_command(dockerfile_for(overlay)))
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": ports.http,
        "grpc": ports.grpc,
        "metrics": ports.metrics,
        "health": launch.health_port,
    }
    # The launcher's deep check, not Triton's /v2/health/*, which said 200 while hung.
    expected = {"startupProbe": "/readyz", "readinessProbe": "/readyz", "livenessProbe": "/livez"}
    for probe, path in expected.items():
        http_get = container[probe]["httpGet"]
        assert http_get["path"] == path, probe
        assert named_port(container, http_get["port"]) == launch.health_port, probe
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "time to load models"
    # The keys come from a Secret, never from the manifest.
    env = {e["name"]: e for e in container["env"]}
    for name, key in (("DISPATCH_ADMIN_KEY", "admin-key"), ("DISPATCH_SHM_KEY", "shm-key")):
        assert env[name]["valueFrom"]["secretKeyRef"] == {"name": "dispatch-keys", "key": key}
        assert "value" not in env[name]
    # Keys a deployment may do without (the lane then serves no client; outcomes are refused)
    # and the fleet's outcome store: from Secrets too, optional.
    for name, secret, key in (
        ("DISPATCH_PRIORITY_KEY", "dispatch-keys", "priority-key"),
        ("DISPATCH_OUTCOME_KEY", "dispatch-keys", "outcome-key"),
        ("DISPATCH_OUTCOME_STORE", "dispatch-outcome-store", "url"),
    ):
        reference = env[name]["valueFrom"]["secretKeyRef"]
        assert reference == {"name": secret, "key": key, "optional": True}, name
        assert "value" not in env[name]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_volumes_resources_and_shutdown(overlay: str) -> None:
    resources = rendered(overlay)
    spec, container = pod_spec(resources), triton_container(resources)
    args = image_triton_command(dockerfile_for(overlay))
    launch = image_launch(dockerfile_for(overlay))
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    mounts = {mount["mountPath"]: mount for mount in container["volumeMounts"]}
    shm = volumes[mounts["/dev/shm"]["name"]]
    assert shm["emptyDir"]["medium"] == "Memory"
    models = mounts[flag(args, "--model-repository")]
    assert models["readOnly"] is True
    claim = volumes[models["name"]]["persistentVolumeClaim"]
    assert claim["readOnly"] is True
    pvc = one(resources, "PersistentVolumeClaim", claim["claimName"])
    assert pvc["spec"]["accessModes"] == ["ReadOnlyMany"]
    for c in pod_containers(one(resources, "Deployment")):
        requests, limits = c["resources"]["requests"], c["resources"]["limits"]
        assert {"cpu", "memory"} <= set(requests), c["name"]
        assert requests == limits, f"{c['name']}: Guaranteed QoS (requests == limits)"
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    drain = int(pre_stop[-1]) if pre_stop[0] == "sleep" else 0
    exit_timeout = int(flag(args, "--exit-timeout-secs"))
    budget = drain + launch.drain_timeout + exit_timeout
    assert spec["terminationGracePeriodSeconds"] >= budget
    assert spec["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_pdb_and_hpa_point_at_the_deployment(overlay: str) -> None:
    resources = rendered(overlay)
    deployment = one(resources, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels_match(deployment["spec"]["selector"]["matchLabels"], pod_labels)
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    container = triton_container(resources)

    service = one(resources, "Service", "dispatch-triton")
    assert labels_match(service["spec"]["selector"], pod_labels)
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert {name: p["port"] for name, p in ports.items()} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
        "health": 8003,
    }
    for p in ports.values():
        assert named_port(container, p["targetPort"]) == p["port"]
    headless = one(resources, "Service", "dispatch-triton-headless")
    assert headless["spec"]["clusterIP"] == "None"
    # each replica's health port by pod address (dispatch-admin --replica)
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]}["health"] == 8003
    assert labels_match(headless["spec"]["selector"], pod_labels)

    pdb = one(resources, "PodDisruptionBudget")
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    assert pdb["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]

    hpa = one(resources, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": deployment["apiVersion"],
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    assert pdb["spec"]["maxUnavailable"] < hpa["spec"]["minReplicas"]
    pods_metrics = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert [m["metric"]["name"] for m in pods_metrics] == [HPA_METRIC]
    assert pods_metrics[0]["target"]["type"] == "AverageValue"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_service_monitor_scrapes_triton_and_the_launcher(overlay: str) -> None:
    """Triton's metrics port and the launcher's health port (its /metrics carries the
    launcher's series and the GPU monitor's: tests/unit/ops/test_gpu_monitor.py), each
    through exactly one Service, each under the `job` the alert rules name."""
    resources = rendered(overlay)
    monitor = one(resources, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) <= {"selector", "endpoints", "namespaceSelector", "jobLabel"}
    selector = monitor["spec"]["selector"]["matchLabels"]
    launch = image_launch(dockerfile_for(overlay))
    ports = server_ports(image_triton_command(dockerfile_for(overlay)))
    scraped: dict[int, str] = {}
    for endpoint in monitor["spec"]["endpoints"]:
        assert set(endpoint) <= {
            *("port", "path", "scheme", "interval", "scrapeTimeout", "relabelings"),
        }
        assert endpoint["path"] == "/metrics"
        assert re.fullmatch(r"\d+s", endpoint["interval"])
        assert int(endpoint["scrapeTimeout"][:-1]) < int(endpoint["interval"][:-1])
        services = [
            service
            for service in resources
            if service["kind"] == "Service"
            and labels_match(selector, service["metadata"].get("labels", {}))
            and any(p["name"] == endpoint["port"] for p in service["spec"]["ports"])
        ]
        assert len(services) == 1, "exactly one Service is scraped (no double counting)"
        (port,) = [p for p in services[0]["spec"]["ports"] if p["name"] == endpoint["port"]]
        (job,) = [r for r in endpoint["relabelings"] if r["targetLabel"] == "job"]
        scraped[port["port"]] = job["replacement"]
    assert scraped == {ports.metrics: "triton", launch.health_port: "dispatch-launcher"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_alert_rules_ship_as_a_prometheus_rule(overlay: str) -> None:
    rule = one(rendered(overlay), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    alerts = load_yaml(DEPLOY / "prometheus" / "alerts.yml")
    assert rule["spec"]["groups"] == alerts["groups"]


def test_adapter_rule_serves_queue_time_per_request() -> None:
    rule = adapter_rule()
    assert "nv_inference_queue_duration_us" in rule["seriesQuery"]
    overrides = rule["resources"]["overrides"]
    assert overrides == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    query = " ".join(rule["metricsQuery"].split())
    numerator, _, denominator = query.partition(" / ")
    assert "rate(nv_inference_queue_duration_us{<<.LabelMatchers>>" in numerator
    assert "rate(nv_inference_request_success{<<.LabelMatchers>>" in denominator
    assert query.count("sum by (<<.GroupBy>>)") == 2
    # The metric is in microseconds, as the HPA target is.
    assert re.search(r"_us(_|$)", rule["name"]["as"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_renderer_agrees_with_kubectl_kustomize(overlay: str) -> None:
    try:
        result = subprocess.run(
            ["kubectl", "kustomize", str(K8S / "overlays" / overlay)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.skip("kubectl kustomize did not answer")
    assert result.returncode == 0, result.stderr
    theirs = [doc for doc in yaml.safe_load_all(result.stdout) if doc]

    def key(resource: Doc) -> tuple[str, str]:
        return resource["kind"], resource["metadata"]["name"]

    assert sorted(theirs, key=key) == sorted(rendered(overlay), key=key)
