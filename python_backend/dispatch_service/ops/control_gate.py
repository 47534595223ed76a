"""The launcher's control endpoint: the one way operators reach Triton's model repository,
logging and trace settings.

Triton knows only the launcher's own admin key (`ServerOptions.admin_key`, fresh at every
launcher start); operators send the same HTTP requests to the launcher's port with theirs.
The gate checks each request before Triton sees it, because Triton cannot be told to refuse
what would run code:

- a load that uploads files (``file:`` parameters) is refused: Triton writes them and runs
  their code before anything could verify it. A load reads the repository's own files;
- a config override may change how a model runs (versions, parameters, instances, batching)
  but not which code it runs: backend, platform, runtime, file names, repository agents and
  the Python execution environment must stay the repository config's;
- on a verified server every version the load would serve is verified from the files as
  they are now (`verified_load.LoadVerifier`); one that does not verify refuses the load;
- logging and trace settings that name a file are refused (a file written anywhere the
  server may write).

Every refusal answers 4xx with a message naming the parameter or the rule, and is logged
(rate-limited, client text clipped) with the digest of what was refused. What passes is
sent again as the gate parsed it, never as the client's bytes, so Triton reads what was
checked. GET requests that are not control requests (model config, readiness, metadata)
are passed through as they are; inference and shared memory go to Triton's own ports.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from dispatch_contract.keys import ADMIN_KEY_HEADER
from dispatch_service.core.log_text import LogRateLimit, clip
from dispatch_service.ops.verified_load import LoadVerifier, read_config

__all__ = [
    "MAX_CONTROL_BODY_BYTES",
    "ControlGate",
    "GateAnswer",
    "Upstream",
    "code_identity",
    "triton_upstream",
]

# A load's body is a config override (a few KiB); more is refused before it is read.
MAX_CONTROL_BODY_BYTES: Final = 1 << 20
_MODEL_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_REPOSITORY: Final = re.compile(
    r"/v2/repository/(?:index|models/(?P<model>[^/]+)/(?P<op>load|unload))"
)
_SETTINGS: Final = re.compile(
    r"/v2/(?:logging|trace/setting|models/(?P<model>[^/]+)/trace/setting)"
)
_DEFAULT_FILENAMES: Final = {"python": "model.py", "onnxruntime": "model.onnx"}
_EXECUTION_ENV: Final = "EXECUTION_ENV_PATH"


@dataclass(frozen=True)
class GateAnswer:
    status: int
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def error(cls, status: int, message: str) -> GateAnswer:
        """Triton's own error form, so a client reads both alike."""
        return cls(status, json.dumps({"error": message}).encode())


class Upstream(Protocol):
    """Sends one request to Triton's HTTP port; ``admin`` adds the launcher's key."""

    def __call__(
        self, method: str, path: str, body: bytes | None, *, admin: bool
    ) -> GateAnswer: ...


def triton_upstream(http_url: str, admin_key: str, timeout_s: float = 300.0) -> Upstream:
    """Triton's HTTP port as an `Upstream` (a load may take minutes: ``timeout_s``)."""

    def send(method: str, path: str, body: bytes | None, *, admin: bool) -> GateAnswer:
        headers = {"Content-Type": "application/json"}
        if admin:
            headers[ADMIN_KEY_HEADER] = admin_key
        request = urllib.request.Request(
            f"http://{http_url}{path}", data=body, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                kind = response.headers.get("Content-Type", "application/json")
                return GateAnswer(int(response.status), response.read(), kind)
        except urllib.error.HTTPError as exc:
            kind = exc.headers.get("Content-Type", "application/json")
            return GateAnswer(int(exc.code), exc.read(), kind)
        except (urllib.error.URLError, OSError) as exc:
            return GateAnswer.error(502, f"Triton did not answer: {exc}")

    return send


def code_identity(config: Mapping[str, Any]) -> dict[str, Any]:
    """What decides which code a config runs, with Triton's defaults filled in (the config
    Triton reports names ``model.py`` where the file names nothing)."""
    backend = str(config.get("backend") or "")
    parameters = config.get("parameters") or {}
    env = parameters.get(_EXECUTION_ENV) if isinstance(parameters, Mapping) else None
    agents = config.get("model_repository_agents") or {}
    if isinstance(agents, Mapping):
        agents = agents.get("agents") or []
    return {
        "backend": backend,
        "platform": str(config.get("platform") or ""),
        "runtime": str(config.get("runtime") or ""),
        "default_model_filename": str(
            config.get("default_model_filename") or _DEFAULT_FILENAMES.get(backend, "")
        ),
        "cc_model_filenames": dict(config.get("cc_model_filenames") or {}),
        "model_repository_agents": agents,
        _EXECUTION_ENV: env.get("string_value") if isinstance(env, Mapping) else env,
    }


class _RefusedError(Exception):
    def __init__(self, status: int, message: str, **logged: Any) -> None:
        super().__init__(message)
        self.status = status
        self.logged = logged


@dataclass
class ControlGate:
    """Checks and forwards control requests; see the module docstring."""

    operator_key: str = field(repr=False)
    upstream: Upstream
    repository: Path
    profile: str = "cpu"
    verifier: LoadVerifier | None = None  # a verified server's
    report: Callable[[str], None] = print
    _log_limit: LogRateLimit = field(default_factory=LogRateLimit)

    def handle(
        self, method: str, path: str, headers: Mapping[str, str], body: bytes | None
    ) -> GateAnswer:
        bare = urllib.parse.urlsplit(path).path
        repository = _REPOSITORY.fullmatch(bare)
        settings = _SETTINGS.fullmatch(bare)
        if repository is None and settings is None:
            if method == "GET" and bare.startswith("/v2"):
                return self.upstream("GET", path, None, admin=False)
            return GateAnswer.error(
                404,
                f"{method} {clip(bare)}: this port takes model-repository, logging and trace "
                "requests (and passes other GETs on); send inference to Triton's ports",
            )
        key = headers.get(ADMIN_KEY_HEADER) or ""
        if not hmac.compare_digest(key.encode(), self.operator_key.encode()):
            self._log("control_refused", path=clip(bare), reason="no or wrong admin key")
            message = f"This API is restricted, expecting header '{ADMIN_KEY_HEADER}'"
            return GateAnswer.error(403, message)
        sent: bytes | None
        try:
            if repository is not None:
                if method != "POST":
                    raise _RefusedError(405, f"{clip(bare)} takes POST")
                bare, sent = self._repository_request(repository["model"], repository["op"], body)
            else:
                sent = None if method == "GET" else _settings_body(body)
        except _RefusedError as refusal:
            self._log("control_refused", path=clip(bare), reason=str(refusal), **refusal.logged)
            return GateAnswer.error(refusal.status, str(refusal))
        return self.upstream(method, bare, sent, admin=True)

    # -- repository ------------------------------------------------------------------------
    def _repository_request(
        self, model: str | None, op: str | None, body: bytes | None
    ) -> tuple[str, bytes]:
        """The path and body to send Triton: the model named as checked, the body as parsed."""
        request = _json_object(body)
        if model is None:
            return "/v2/repository/index", json.dumps(request).encode()
        model = urllib.parse.unquote(model)
        if not _MODEL_NAME.fullmatch(model):
            rule = "letters, digits, '_', '.', '-' only"
            raise _RefusedError(400, f"model name {clip(model)!r}: {rule}")
        path = f"/v2/repository/models/{model}/{op}"
        parameters = request.get("parameters", {})
        if not isinstance(parameters, dict):
            raise _RefusedError(400, "'parameters' must be a JSON object")
        if op == "unload":
            return path, json.dumps(request).encode()
        uploads = sorted(name for name in parameters if name.startswith("file:"))
        if uploads:
            raise _RefusedError(
                403,
                f"{model}: a load that uploads files is refused (parameter {clip(uploads[0])!r}); "
                "put the files in the repository, signed, and load them from there",
                model=model,
                files={clip(n): _upload_digest(parameters[n]) for n in uploads[:16]},
            )
        unknown = sorted(set(parameters) - {"config"})
        if unknown:
            raise _RefusedError(
                400, f"{model}: load parameter {clip(unknown[0])!r} is not accepted (only 'config')"
            )
        override = _config_override(model, parameters.get("config"))
        self._check_load(model, override)
        if override is None:
            return path, b"{}"
        return path, json.dumps({"parameters": {"config": json.dumps(override)}}).encode()

    def _check_load(self, model: str, override: dict[str, Any] | None) -> None:
        folder = self.repository / model
        if not folder.is_dir():
            raise _RefusedError(404, f"{model}: no such model in the repository")
        signed = read_config(folder, self.profile)
        if override is not None:
            ours, theirs = code_identity(signed), code_identity(override)
            changed = [name for name in ours if ours[name] != theirs[name]]
            if changed:
                raise _RefusedError(
                    403,
                    f"{model}: a config override may not change {changed[0]!r} "
                    "(the code a model runs is the repository's)",
                    model=model,
                    field=changed[0],
                )
        if self.verifier is None:
            return
        check = self.verifier.check(model, override or signed)
        if check.clean:
            return
        for line in self.verifier.refusal_lines(check):
            self.report(line)
        first = check.refused[0]
        raise _RefusedError(
            403,
            f"{model} version {first.version} does not verify ({first.outcome.value}: "
            f"{clip(first.reason, 200)}): load refused, the versions serving keep serving",
            model=model,
            version=first.version,
        )

    def _log(self, event: str, **fields: Any) -> None:
        dropped = self._log_limit.admit()
        if dropped is None:
            return
        if dropped:
            fields["lines_dropped"] = dropped
        self.report(json.dumps({"event": event, **fields}))


def _json_object(body: bytes | None) -> dict[str, Any]:
    if not body:
        return {}
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        raise _RefusedError(400, "the request body is not JSON") from None
    if not isinstance(parsed, dict):
        raise _RefusedError(400, "the request body must be a JSON object")
    return parsed


def _config_override(model: str, text: object) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise _RefusedError(400, f"{model}: parameter 'config' must be a string of JSON")
    try:
        config = json.loads(text)
    except (ValueError, RecursionError):
        raise _RefusedError(400, f"{model}: parameter 'config' is not JSON") from None
    if not isinstance(config, dict):
        raise _RefusedError(400, f"{model}: parameter 'config' must be a JSON object")
    if config.get("name", model) != model:
        raise _RefusedError(400, f"{model}: the config override names another model")
    return config


def _settings_body(body: bytes | None) -> bytes:
    settings = _json_object(body)
    named = sorted(name for name in settings if name.endswith("_file"))
    if named:
        rule = "it names a file on the server"
        raise _RefusedError(403, f"setting {clip(named[0])!r} is refused: {rule}")
    return json.dumps(settings).encode()


def _upload_digest(value: object) -> str:
    """SHA-256 of an uploaded file (of the text sent when it is not base64), for the
    refusal's log line: it compares with ``sha256sum`` of the file."""
    text = str(value)
    try:
        data = base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        data = text.encode()
    return hashlib.sha256(data).hexdigest()
