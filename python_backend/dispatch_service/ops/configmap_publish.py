"""Publishing a fleet revision to Kubernetes: the signed document written into the ConfigMap
that every launcher pod mounts (deploy/k8s/base/fleet-state.yaml), from inside the cluster.

On Kubernetes the store of record is a folder on the writer's side (a PersistentVolume of
the rollout controller's pod, deploy/k8s/base/rollout-controller.yaml); the pods read the
ConfigMap. After each revision the writer replaces the ConfigMap's ``fleet-state.json`` with
the document's bytes, as they were signed: nothing is re-encoded, so each pod verifies
exactly what was signed. The request is the API server's plain ``PUT`` of the ConfigMap
with the pod's service-account token (a Role that may ``get`` and ``update`` that one
ConfigMap), over TLS checked against the cluster's CA.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from dispatch_service.ops.fleet_state import STATE_FILE, StateStore

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "ConfigMapPublisher",
    "PublishError",
]

SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
IN_CLUSTER_API: Final = "https://kubernetes.default.svc"
TIMEOUT_S: Final = 10.0


class PublishError(RuntimeError):
    """The ConfigMap was not replaced (the revision is stored, the pods do not see it yet)."""


@dataclass(frozen=True)
class ConfigMapPublisher:
    """Replaces ConfigMap ``name`` in ``namespace`` with the store's current document."""

    name: str
    namespace: str
    token: str
    api: str = IN_CLUSTER_API
    context: ssl.SSLContext | None = None

    @classmethod
    def in_cluster(cls, name: str, folder: Path = SERVICE_ACCOUNT_DIR) -> ConfigMapPublisher:
        """The pod's own service account: its token, namespace and the cluster's CA."""
        try:
            token = (folder / "token").read_text().strip()
            namespace = (folder / "namespace").read_text().strip()
        except OSError as exc:
            raise PublishError(
                f"no service account in {folder} ({exc}): publishing runs in a pod"
            ) from None
        context = ssl.create_default_context(cafile=str(folder / "ca.crt"))
        return cls(name, namespace, token, context=context)

    def publish(self, store: StateStore) -> None:
        data = store.read()
        if data is None:
            raise PublishError(f"no document in {store.path} to publish")
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "data": {STATE_FILE: data.decode("utf-8")},
        }
        request = urllib.request.Request(
            f"{self.api}/api/v1/namespaces/{self.namespace}/configmaps/{self.name}",
            data=json.dumps(body).encode(),
            method="PUT",
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": "application/json",
                "Accept": "application/json",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self.context):
                return
        except urllib.error.HTTPError as exc:
            with exc:
                detail = exc.read(500).decode("utf-8", "replace")
            raise PublishError(
                f"ConfigMap {self.namespace}/{self.name}: HTTP {exc.code}: {detail}"
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            raise PublishError(f"ConfigMap {self.namespace}/{self.name}: {exc}") from None
