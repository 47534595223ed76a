"""The Prometheus alert rules: each reads only metrics that exist and has a runbook entry.

`deploy/prometheus/alerts.yml` is loaded by `deploy/prometheus/prometheus.yml` (and mounted
beside it by docker-compose.yml). Every expression may name only the metrics the service's
code exports (found in its source: metric specs, metric families, hand-written `# TYPE`
lines), Triton's standard `nv_*` metrics, or Prometheus's own `up`. Every alert has a
`docs/runbook.md` entry (a `###` heading with its name) and every entry an alert. Every alert
has a `promtool test rules` case that fires it and one that does not, in
`deploy/prometheus/tests/<group>.test.yml` (one file per group), run where `promtool` is
installed (the Debian package `make setup` installs). The Kubernetes PrometheusRule is
rendered from the same file, and the rules' `job` matchers name jobs both compose's
Prometheus and the ServiceMonitor produce.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch_service.outcomes.service import OUTCOME_SERIES

ROOT = Path(__file__).resolve().parents[3]
PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
CONFIG = PROMETHEUS / "prometheus.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"
# Where docs/runbook.md is published: the base of every alert's runbook_url (alerts.yml).
RUNBOOK_BASE = "https://runbooks.example.com/triton-dispatch/runbook.md"
SOURCES = (ROOT / "python_backend", ROOT / "client", ROOT / "contract")

# Triton 2.51's standard metrics (per model and version; GPU, CPU and pool gauges).
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
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_power_usage",
        "nv_cpu_utilization",
        "nv_cpu_memory_used_bytes",
        "nv_pinned_memory_pool_used_bytes",
    }
)
PROMETHEUS_METRICS = frozenset({"up"})
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# PromQL words that are not metric names.
PROMQL_WORDS = frozenset(
    {
        *("sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk"),
        *("quantile", "count_values", "group", "by", "without", "on", "ignoring"),
        *("group_left", "group_right", "and", "or", "unless", "bool", "offset"),
        *("rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets"),
        *("abs", "absent", "absent_over_time", "ceil", "floor", "round", "clamp"),
        *("clamp_min", "clamp_max", "histogram_quantile", "label_replace", "label_join"),
        *("ln", "exp", "sqrt"),
        *("vector", "scalar", "time", "timestamp", "sort", "sort_desc", "predict_linear"),
        *("avg_over_time", "min_over_time", "max_over_time", "sum_over_time"),
        *("count_over_time", "last_over_time", "present_over_time", "inf", "nan", "e"),
    }
)


def exported_metrics() -> frozenset[str]:
    """Metric names the code exports, read from its source so that a renamed module does not
    matter: `MetricSpec(...)` / `*MetricFamily(...)` first arguments (a counter family gains
    `_total`), `# TYPE name` lines of hand-written exposition, and `METRIC_NAMES` tuples."""
    spec = re.compile(r"\b(\w*)(?:MetricSpec|MetricFamily)\(\s*\"([a-z_:][a-z0-9_:]*)\"")
    typed = re.compile(r"# TYPE ([a-z_:][a-z0-9_:]*) ")
    listed = re.compile(r"METRIC_NAMES[^=\n]*=\s*\(([^)]*)\)", re.S)
    names: set[str] = set()
    for folder in SOURCES:
        for path in folder.rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for kind, name in spec.findall(text):
                names.add(name)
                if kind == "Counter" and not name.endswith("_total"):
                    names.add(f"{name}_total")
            names.update(typed.findall(text))
            for body in listed.findall(text):
                names.update(re.findall(r"\"([a-z_:][a-z0-9_:]*)\"", body))
    return frozenset(names)


# Families named in a loop, which the source scan cannot read: the outcome service's series
# (its quality gauges, one per figure).
LOOPED = frozenset(OUTCOME_SERIES)
EXPORTED = exported_metrics() | LOOPED
KNOWN = EXPORTED | TRITON_METRICS | PROMETHEUS_METRICS


def recording_rules() -> list[dict[str, Any]]:
    """The rules that record a series (``level:metric:operations`` names) for the alerts."""
    document = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"] if "record" in rule]


RECORDED = frozenset(str(rule["record"]) for rule in recording_rules())


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (a histogram's series by their family)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for word in re.findall(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)", text):
        if word.lower() in PROMQL_WORDS or re.fullmatch(r"\d+[smhdwy]", word):
            continue
        if word not in KNOWN:
            for suffix in HISTOGRAM_SUFFIXES:
                if word.endswith(suffix) and word.removesuffix(suffix) in KNOWN:
                    word = word.removesuffix(suffix)
        names.add(word)
    return names


def rules() -> list[dict[str, Any]]:
    """The alerting rules."""
    document = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"] if "alert" in rule]


def runbook_entries() -> list[str]:
    return re.findall(r"^### (\S+)\s*$", RUNBOOK.read_text(encoding="utf-8"), re.M)


def test_the_source_scan_finds_the_service_metrics() -> None:
    for name in (
        "dispatch_encoder_latency_ms",  # a model's MetricSpec
        "dispatch_router_orders_total",  # the router's
        "dispatch_geocoding_breaker_open",  # geocoding's
        "dispatch_launcher_ready",  # the launcher's hand-written exposition
        "dispatch_launcher_server_crashes_total",
        "dispatch_gpu_health_state",  # the GPU monitor's collector
        "dispatch_device_fallback_transitions_total",
    ):
        assert name in EXPORTED, name
    assert "dispatch_model" not in EXPORTED  # a model name, not a metric


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('up{job="triton"} == 0', {"up"}),
        (
            'sum by (model) (rate(dispatch_router_orders_total{level="2"}[5m])) > 0.01',
            {"dispatch_router_orders_total"},
        ),
        (
            "histogram_quantile(0.99, sum by (le) (rate(dispatch_encoder_latency_ms_bucket[5m])))",
            {"dispatch_encoder_latency_ms"},
        ),
        ("rate(dispatch_no_such_metric_total[5m]) > 0", {"dispatch_no_such_metric_total"}),
    ],
)
def test_metric_names_reads_an_expression(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_every_rule_is_a_well_formed_alert() -> None:
    found = rules()
    assert len(found) >= 10
    for rule in found:
        name = rule["alert"]
        assert re.fullmatch(r"Dispatch[A-Z][A-Za-z0-9]+", name), name
        assert rule["expr"].strip(), name
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        assert rule["annotations"]["summary"], name
        assert rule["annotations"]["runbook_url"] == f"{RUNBOOK_BASE}#{name.lower()}", name
        assert set(rule["annotations"]) == {"summary", "runbook_url"}, name
    names = [rule["alert"] for rule in found]
    assert len(names) == len(set(names)), "an alert name is used twice"


def test_every_alert_reads_only_exported_metrics() -> None:
    unknown = {
        rule["alert"]: sorted(metric_names(rule["expr"]) - KNOWN - RECORDED)
        for rule in rules()
        if metric_names(rule["expr"]) - KNOWN - RECORDED
    }
    assert unknown == {}


def test_every_recorded_series_is_named_by_convention_and_read_from_before() -> None:
    """A recording rule reads exported metrics and the series recorded above it only."""
    earlier: set[str] = set()
    for rule in recording_rules():
        name = rule["record"]
        assert re.fullmatch(r"dispatch:[a-z_]+(:[a-z0-9_]+)?", name), name
        assert metric_names(rule["expr"]) - KNOWN - earlier == set(), name
        assert name not in earlier, f"{name} recorded twice"
        earlier.add(name)


def test_every_alert_has_a_runbook_entry_and_every_entry_an_alert() -> None:
    alerts = {rule["alert"] for rule in rules()}
    entries = runbook_entries()
    assert len(entries) == len(set(entries)), "a runbook entry is written twice"
    assert alerts - set(entries) == set(), "alerts without a runbook entry"
    assert set(entries) - alerts == set(), "runbook entries without an alert"


def test_prometheus_loads_the_rules_in_compose() -> None:
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert ALERTS.name in config["rule_files"]
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"triton", "dispatch-launcher"} <= jobs  # what the rules' `up{job=...}` name
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    mounts = {
        (ROOT / str(volume["source"])).resolve(): volume["target"]
        for volume in compose["services"]["prometheus"]["volumes"]
        if isinstance(volume, dict)
    }
    config_dir = Path(mounts[CONFIG.resolve()]).parent
    assert mounts[ALERTS.resolve()] == str(config_dir / ALERTS.name)


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
def test_promtool_accepts_the_rules_and_config() -> None:
    for command in (["check", "rules", str(ALERTS)], ["check", "config", str(CONFIG)]):
        done = subprocess.run(
            [str(PROMTOOL), *command], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr


PROMTOOL_CASES = sorted((PROMETHEUS / "tests").glob("*.test.yml"))


def groups() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return found


def test_each_group_has_its_promtool_file_and_every_alert_a_case_that_fires() -> None:
    assert [path.name for path in PROMTOOL_CASES] == sorted(
        f"{group['name']}.test.yml" for group in groups()
    )
    for group, path in zip(
        sorted(groups(), key=lambda g: str(g["name"])), PROMTOOL_CASES, strict=True
    ):
        cases = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert cases["rule_files"] == ["../alerts.yml"], path.name
        checks = [check for test in cases["tests"] for check in test["alert_rule_test"]]
        fires = {check["alertname"] for check in checks if check["exp_alerts"]}
        quiet = {check["alertname"] for check in checks if not check["exp_alerts"]}
        alerts = {rule["alert"] for rule in group["rules"] if "alert" in rule}
        assert fires == alerts, f"{path.name}: alerts without a firing case"
        assert quiet == alerts, f"{path.name}: alerts without a quiet case"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed")
def test_promtool_unit_tests_of_every_alert_pass() -> None:
    done = subprocess.run(
        [str(PROMTOOL), "test", "rules", *map(str, PROMTOOL_CASES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(PROMTOOL_CASES), done.stdout


def test_the_prometheus_rule_is_rendered_from_the_rule_file() -> None:
    rendered = ROOT / "deploy" / "k8s" / "base" / "prometheusrule.yaml"
    document = yaml.safe_load(rendered.read_text(encoding="utf-8"))
    assert document["kind"] == "PrometheusRule"
    assert document["spec"]["groups"] == groups()
    done = subprocess.run(
        [sys.executable, str(PROMETHEUS / "prometheus_rule.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_job_matchers_name_jobs_that_compose_and_kubernetes_both_scrape() -> None:
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    compose_jobs = {job["job_name"] for job in config["scrape_configs"]}
    monitor = yaml.safe_load(
        (ROOT / "deploy" / "k8s" / "base" / "servicemonitor.yaml").read_text(encoding="utf-8")
    )
    # prometheus-operator names a ServiceMonitor's job after the Service unless a relabeling
    # sets it: each endpoint sets it here.
    kubernetes_jobs = {
        relabel["replacement"]
        for endpoint in monitor["spec"]["endpoints"]
        for relabel in endpoint.get("relabelings", [])
        if relabel.get("targetLabel") == "job"
    }
    assert len(kubernetes_jobs) == len(monitor["spec"]["endpoints"])
    named = {job for rule in rules() for job in re.findall(r'\bjob="([^"]+)"', rule["expr"])}
    assert named == {"triton", "dispatch-launcher"}
    assert named <= compose_jobs & kubernetes_jobs
    assert not any(re.search(r"\bjob\s*=~", rule["expr"]) for rule in rules())
