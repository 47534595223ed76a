"""Triton's model-repository API over HTTP: index, load (with a config override), unload.

Used by the verified start (`server`) and by `dispatch-admin`. With a server started with an
admin key (`ServerOptions.admin_key`), these endpoints answer 403 unless the request carries
the header ``admin-key: <key>``; a refusal raises `ModelControlError` with ``status`` 403.

A load with a config override replaces the model's configuration live: Triton keeps the old
versions serving until the new ones are ready, and a failed load leaves the model as it was.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Any

from dispatch_contract.keys import ADMIN_KEY_HEADER
from dispatch_service.core.settings import RELOAD_MARK_PARAMETER

__all__ = [
    "ADMIN_KEY_HEADER",
    "ModelControlError",
    "load_model",
    "model_config",
    "ready_versions",
    "repository_index",
    "unload_model",
    "update_logging",
    "with_reload_mark",
    "with_versions",
    "without_reload_mark",
]


class ModelControlError(RuntimeError):
    """Triton refused or failed a request; ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _base(http_url: str) -> str:
    return http_url if http_url.startswith(("http://", "https://")) else f"http://{http_url}"


def _request(
    http_url: str,
    path: str,
    body: Mapping[str, Any] | None,
    admin_key: str | None,
    timeout_s: float,
) -> Any:
    headers = {"Content-Type": "application/json"}
    if admin_key:
        headers[ADMIN_KEY_HEADER] = admin_key
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{_base(http_url)}{path}",
        data=data,
        headers=headers,
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            detail = str(json.loads(detail).get("error", detail))
        raise ModelControlError(f"HTTP {exc.code}: {detail}", exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        raise ModelControlError(f"no answer from {http_url}: {exc}") from None
    return json.loads(text) if text.strip() else None


def repository_index(
    http_url: str, admin_key: str | None = None, timeout_s: float = 30.0
) -> list[dict[str, Any]]:
    """Every model the repository holds, with ``version`` and ``state`` where loaded."""
    index = _request(http_url, "/v2/repository/index", {}, admin_key, timeout_s)
    return list(index or [])


def ready_versions(
    http_url: str, model: str, admin_key: str | None = None, timeout_s: float = 30.0
) -> tuple[int, ...]:
    """The versions of ``model`` Triton serves now (state READY), ascending."""
    return tuple(
        sorted(
            int(entry["version"])
            for entry in repository_index(http_url, admin_key, timeout_s)
            if entry.get("name") == model and entry.get("state") == "READY" and "version" in entry
        )
    )


def update_logging(
    http_url: str, settings: Mapping[str, Any], admin_key: str | None = None, timeout_s: float = 5.0
) -> None:
    """Change Triton's log settings (``/v2/logging``, e.g. ``{"log_verbose_level": 1}``)."""
    _request(http_url, "/v2/logging", dict(settings), admin_key, timeout_s)


def model_config(http_url: str, model: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """The configuration a loaded model runs with (Triton's JSON form)."""
    config = _request(http_url, f"/v2/models/{model}/config", None, None, timeout_s)
    if not isinstance(config, dict):
        raise ModelControlError(f"{model}: no configuration returned")
    return config


def with_versions(config: Mapping[str, Any], versions: Iterable[int]) -> dict[str, Any]:
    """A copy of ``config`` whose version policy serves exactly ``versions``."""
    chosen = sorted(set(versions))
    if not chosen:
        raise ValueError("a version policy needs at least one version")
    return {**config, "version_policy": {"specific": {"versions": chosen}}}


def with_reload_mark(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``config`` with a new reload mark (`core.settings.RELOAD_MARK_PARAMETER`):
    loaded, it makes Triton build every instance of the model anew."""
    parameters = dict(config.get("parameters") or {})
    parameters[RELOAD_MARK_PARAMETER] = {"string_value": str(time.time_ns())}
    return {**config, "parameters": parameters}


def without_reload_mark(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` as its deploy left it: without the reload mark of a stub's recovery."""
    parameters = config.get("parameters") or {}
    rest = {k: v for k, v in parameters.items() if k != RELOAD_MARK_PARAMETER}
    return {**config, "parameters": rest} if "parameters" in config else dict(config)


def load_model(
    http_url: str,
    model: str,
    config: Mapping[str, Any] | None = None,
    admin_key: str | None = None,
    timeout_s: float = 300.0,
) -> None:
    """Load (or reload) ``model``; with ``config`` that configuration replaces the file's."""
    body: dict[str, Any] = {}
    if config is not None:
        body["parameters"] = {"config": json.dumps(config)}
    _request(http_url, f"/v2/repository/models/{model}/load", body, admin_key, timeout_s)


def unload_model(
    http_url: str, model: str, admin_key: str | None = None, timeout_s: float = 300.0
) -> None:
    _request(http_url, f"/v2/repository/models/{model}/unload", {}, admin_key, timeout_s)
