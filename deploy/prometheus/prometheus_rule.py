"""Render the Kubernetes PrometheusRule (deploy/k8s/base/prometheusrule.yaml) from the one
rule file, deploy/prometheus/alerts.yml, so compose and Kubernetes load the same rules.

    .venv/bin/python deploy/prometheus/prometheus_rule.py            # write the file
    .venv/bin/python deploy/prometheus/prometheus_rule.py --check    # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ALERTS = HERE / "alerts.yml"
TARGET = HERE.parent / "k8s" / "base" / "prometheusrule.yaml"
HEADER = """\
# GENERATED from deploy/prometheus/alerts.yml by deploy/prometheus/prometheus_rule.py: edit
# the rules there and run it again. prometheus-operator loads these rules into every
# Prometheus whose ruleSelector matches the labels below (add yours if it has one).
"""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the longer expressions) as literal blocks, as in alerts.yml."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def render() -> str:
    groups: list[dict[str, Any]] = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    rule = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "dispatch-triton",
            "labels": {
                "app.kubernetes.io/name": "dispatch-triton",
                "app.kubernetes.io/part-of": "triton-dispatch",
            },
        },
        "spec": {"groups": groups},
    }
    body = yaml.dump(rule, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return HEADER + body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the file is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
