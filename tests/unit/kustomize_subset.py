"""A small kustomize: renders a kustomization that uses only `resources`, `namespace`,
`images` and JSON 6902 `patches`, which is all the project's overlays (deploy/k8s) use.

The deployment tests render the overlays with it where no kustomize binary is installed (CI
installs none); where `kubectl` is, they check that both renderings agree. A field it does
not know is an error, never ignored.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "KustomizeError",
    "apply_json_patch",
    "load_yaml",
    "load_yaml_all",
    "pod_containers",
    "render",
]

Doc = dict[str, Any]
KNOWN_FIELDS = frozenset({"apiVersion", "kind", "resources", "namespace", "images", "patches"})


class KustomizeError(ValueError):
    """A kustomization or patch this renderer cannot apply."""


def load_yaml(path: Path) -> Any:
    with path.open(encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def load_yaml_all(path: Path) -> list[Doc]:
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise KustomizeError(f"JSON pointer must start with '/': {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _walk(document: Any, parts: list[str]) -> Any:
    node = document
    for part in parts:
        if isinstance(node, list):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KustomizeError(f"no {part!r} in the patched document")
    return node


def apply_json_patch(document: Doc, operations: list[Doc]) -> None:
    """RFC 6902 add / remove / replace / test, in place."""
    for operation in operations:
        op, parts = operation["op"], _pointer(operation["path"])
        parent, key = _walk(document, parts[:-1]), parts[-1]
        if op == "test":
            if _walk(document, parts) != operation["value"]:
                raise KustomizeError(f"test failed at {operation['path']}")
        elif op == "add":
            value = copy.deepcopy(operation["value"])
            if isinstance(parent, list):
                parent.insert(len(parent) if key == "-" else int(key), value)
            else:
                parent[key] = value
        elif op == "replace":
            _walk(document, parts)  # must exist
            parent[int(key) if isinstance(parent, list) else key] = copy.deepcopy(
                operation["value"]
            )
        elif op == "remove":
            _walk(document, parts)
            del parent[int(key) if isinstance(parent, list) else key]
        else:
            raise KustomizeError(f"unsupported patch op {op!r}")


def _matches(resource: Doc, target: Doc) -> bool:
    group, _, version = resource["apiVersion"].rpartition("/")
    wanted = {
        "group": group,
        "version": version,
        "kind": resource["kind"],
        "name": resource["metadata"]["name"],
    }
    return all(wanted[key] == value for key, value in target.items())


def pod_containers(resource: Doc) -> Iterator[Doc]:
    pod = resource.get("spec", {}).get("template", {}).get("spec", {})
    yield from pod.get("initContainers", [])
    yield from pod.get("containers", [])


def _set_image(container: Doc, rule: Doc) -> None:
    image = str(container["image"])
    name, tag = image, ""
    if ":" in image.rsplit("/", 1)[-1]:  # a tag, not a registry port
        name, tag = image.rsplit(":", 1)
    if name != rule["name"]:
        return
    new_name, new_tag = str(rule.get("newName", name)), str(rule.get("newTag", tag))
    container["image"] = f"{new_name}:{new_tag}" if new_tag else new_name


def render(directory: Path) -> list[Doc]:
    """Render a kustomization that uses only resources, namespace, images and patches."""
    spec = load_yaml(directory / "kustomization.yaml")
    unknown = set(spec) - KNOWN_FIELDS
    if unknown:
        raise KustomizeError(f"{directory}: fields this renderer does not know: {unknown}")
    resources: list[Doc] = []
    for entry in spec.get("resources", []):
        path = (directory / entry).resolve()
        resources += render(path) if path.is_dir() else load_yaml_all(path)
    for patch in spec.get("patches", []):
        operations = load_yaml(directory / patch["path"])
        if not isinstance(operations, list):
            raise KustomizeError(f"{patch['path']}: only JSON 6902 patches are supported")
        targets = [resource for resource in resources if _matches(resource, patch["target"])]
        if len(targets) != 1:
            raise KustomizeError(f"{patch['path']}: {len(targets)} targets, expected 1")
        apply_json_patch(targets[0], operations)
    for rule in spec.get("images", []):
        for resource in resources:
            for container in pod_containers(resource):
                _set_image(container, rule)
    if "namespace" in spec:
        for resource in resources:
            resource["metadata"]["namespace"] = spec["namespace"]
    return resources
