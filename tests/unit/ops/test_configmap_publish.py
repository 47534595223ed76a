"""Publishing the fleet document into the launchers' ConfigMap: the API server's request, as a
local HTTP server (standing in for the Kubernetes API server) receives it, and its refusals."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from dispatch_service.core.signing import TrustedKeys, generate_private_key
from dispatch_service.ops.configmap_publish import ConfigMapPublisher, PublishError
from dispatch_service.ops.fleet_revisions import canary_share, deployed, write_revision
from dispatch_service.ops.fleet_state import FleetState, StateStore
from dispatch_service.ops.rollout_controller import RolloutController
from dispatch_service.outcomes.sql_store import open_store
from dispatch_service.routing.settings import RouterSettings

KEY = generate_private_key()
TRUSTED = TrustedKeys.from_public_keys(KEY.public_key())
FILES = FleetState(0, (1, 2), RouterSettings(stable_version=1), note="files")


class ApiServer:
    """Records each request; answers ``status`` (200 unless a test sets it)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": json.loads(body)}
                )
                self.send_response(outer.status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"kind": "Status", "message": "configmaps is forbidden"}')

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


@pytest.fixture
def api() -> Iterator[ApiServer]:
    server = ApiServer()
    yield server
    server.http.shutdown()
    server.http.server_close()


def store_with_revision(tmp_path: Path) -> StateStore:
    store = StateStore(tmp_path / "fleet")
    store.path.mkdir()
    write_revision(store, deployed(2, 10), "canary", KEY, trusted=TRUSTED, initial=lambda: FILES)
    return store


def test_the_signed_bytes_replace_the_configmap(tmp_path: Path, api: ApiServer) -> None:
    store = store_with_revision(tmp_path)
    ConfigMapPublisher("dispatch-fleet-state", "dispatch", "t0ken", api=api.url).publish(store)
    (request,) = api.requests
    assert request["path"] == "/api/v1/namespaces/dispatch/configmaps/dispatch-fleet-state"
    assert request["headers"]["Authorization"] == "Bearer t0ken"
    body = request["body"]
    assert body["metadata"] == {"name": "dispatch-fleet-state", "namespace": "dispatch"}
    assert body["data"]["fleet-state.json"].encode() == store.read()  # byte for byte


def test_a_refusal_names_the_configmap_and_the_answer(tmp_path: Path, api: ApiServer) -> None:
    store = store_with_revision(tmp_path)
    api.status = 403
    publisher = ConfigMapPublisher("dispatch-fleet-state", "dispatch", "t0ken", api=api.url)
    with pytest.raises(PublishError, match=r"dispatch/dispatch-fleet-state: HTTP 403: .*forbidden"):
        publisher.publish(store)
    with pytest.raises(PublishError, match="no document"):
        publisher.publish(StateStore(tmp_path / "empty"))
    with pytest.raises(PublishError, match="publishing runs in a pod"):
        ConfigMapPublisher.in_cluster("x", folder=tmp_path / "no-service-account")


def test_the_controller_publishes_each_new_revision_once_and_retries_a_failure(
    tmp_path: Path, api: ApiServer
) -> None:
    store = store_with_revision(tmp_path)
    publisher = ConfigMapPublisher("dispatch-fleet-state", "dispatch", "t", api=api.url)
    controller = RolloutController(
        store, open_store(tmp_path / "o.sqlite3"), KEY, TRUSTED, "pod", publish=publisher.publish
    )
    api.status = 503
    assert controller.tick() is None  # no rollout; the stored revision's publish failed
    assert len(api.requests) == 1 and controller.book.published() is None
    api.status = 200
    controller.tick()
    controller.tick()
    assert len(api.requests) == 2 and controller.book.published() == 1
    write_revision(store, canary_share(30), "wider", KEY, trusted=TRUSTED)  # by an operator
    controller.tick()
    assert len(api.requests) == 3 and controller.book.published() == 2
