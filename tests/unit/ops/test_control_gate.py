"""The launcher's control endpoint (dispatch_service.ops.control_gate) over a recording
stand-in for Triton: what it refuses never reaches Triton, what it passes is sent as parsed.

A small signed repository in tmp_path: ``scorer`` (a Python model, versions 1 and 2, all
served), signed with conftest's ``signer``. The expected digests are computed here with
hashlib from the raw bytes.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dispatch_service.core.repository_layout import model_layout
from dispatch_service.core.signing import TrustedKeys, sign_version
from dispatch_service.ops.control_gate import ControlGate, GateAnswer, code_identity
from dispatch_service.ops.verified_load import LoadVerifier

KEY = "operator-key"
# Triton's name for an uploaded file: ``file:`` and its path in the model's folder.
UPLOAD = f"file:{model_layout(Path(), 'scorer').python_model(1).as_posix().split('/', 1)[1]}"
HEADERS = {"admin-key": KEY}
CONFIG = """name: "scorer"
backend: "python"
max_batch_size: 8
version_policy: { all {} }
parameters { key: "top_k" value { string_value: "5" } }
"""


class Triton:
    """Records what the gate sends; answers 200."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes | None, bool]] = []

    def __call__(self, method: str, path: str, body: bytes | None, *, admin: bool) -> GateAnswer:
        self.sent.append((method, path, body, admin))
        return GateAnswer(200, b"{}")


@pytest.fixture
def repo(tmp_path: Path, signer: Ed25519PrivateKey) -> Path:
    root = tmp_path / "repo"
    layout = model_layout(root, "scorer")
    layout.folder.mkdir(parents=True)
    layout.config.write_text(CONFIG)
    for version in (1, 2):
        layout.version(version).mkdir()
        layout.python_model(version).write_text(f"VERSION = {version}\n")
        sign_version(layout.version(version), signer)
    return root


def gate(
    repo: Path, signer: Ed25519PrivateKey | None = None
) -> tuple[ControlGate, Triton, list[str]]:
    triton, lines = Triton(), list[str]()
    verifier = None
    if signer is not None:
        verifier = LoadVerifier(repo, TrustedKeys.from_public_keys(signer.public_key()))
    control = ControlGate(KEY, triton, repository=repo, verifier=verifier, report=lines.append)
    return control, triton, lines


def load(control: ControlGate, body: Any, model: str = "scorer") -> GateAnswer:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return control.handle("POST", f"/v2/repository/models/{model}/load", HEADERS, data)


def error(answer: GateAnswer) -> str:
    return str(json.loads(answer.body)["error"])


def events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines]


def running_config(**changes: Any) -> dict[str, Any]:
    """The config as Triton reports it (its defaults filled in), with ``changes``."""
    config = {
        "name": "scorer",
        "platform": "",
        "backend": "python",
        "runtime": "",
        "default_model_filename": "model.py",
        "max_batch_size": 8,
        "version_policy": {"all": {}},
        "parameters": {"top_k": {"string_value": "5"}},
        "model_repository_agents": {"agents": []},
        "cc_model_filenames": {},
    }
    return config | changes


def test_a_load_that_uploads_files_is_refused_with_the_files_digest(repo: Path) -> None:
    control, triton, lines = gate(repo)
    code = b"import os; os.system('id')\n"
    body = {
        "parameters": {
            "config": json.dumps(running_config()),
            UPLOAD: base64.b64encode(code).decode(),
        }
    }
    answer = load(control, body)
    assert answer.status == 403
    assert "uploads files" in error(answer) and f"'{UPLOAD}'" in error(answer)
    assert triton.sent == []
    (logged,) = events(lines)
    assert logged["event"] == "control_refused" and logged["model"] == "scorer"
    assert logged["files"] == {UPLOAD: hashlib.sha256(code).hexdigest()}


def test_a_duplicated_parameters_key_sends_triton_only_what_was_checked(repo: Path) -> None:
    """Parsers differ on duplicate keys; Triton gets the gate's own serialization."""
    control, triton, _ = gate(repo)
    raw = b'{"parameters": {"%s": "eA=="}, "parameters": {}}' % UPLOAD.encode()
    assert load(control, raw).status == 200
    assert triton.sent == [("POST", "/v2/repository/models/scorer/load", b"{}", True)]


@pytest.mark.parametrize(
    "headers",
    [{}, {"admin-key": "wrong"}, {"admin-key": KEY + "x"}],
    ids=["none", "wrong", "longer"],
)
def test_control_requests_need_the_operators_key(repo: Path, headers: dict[str, str]) -> None:
    control, triton, lines = gate(repo)
    for path in ("/v2/repository/index", "/v2/repository/models/scorer/unload", "/v2/logging"):
        answer = control.handle("POST", path, headers, b"{}")
        assert answer.status == 403 and "admin-key" in error(answer)
    assert triton.sent == []
    assert all(e["reason"] == "no or wrong admin key" for e in events(lines))


def test_a_plain_load_and_an_override_of_parameters_and_versions_pass(repo: Path) -> None:
    control, triton, _ = gate(repo)
    assert load(control, {}).status == 200
    changed = running_config(
        version_policy={"specific": {"versions": [1]}},
        parameters={"top_k": {"string_value": "3"}, "_reload_mark": {"string_value": "1"}},
        instance_group=[{"kind": "KIND_CPU", "count": 3}],
    )
    assert load(control, {"parameters": {"config": json.dumps(changed)}}).status == 200
    plain, override = triton.sent
    assert plain == ("POST", "/v2/repository/models/scorer/load", b"{}", True)
    assert override[2] is not None
    assert json.loads(json.loads(override[2])["parameters"]["config"]) == changed


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"backend": "onnxruntime"}, "backend"),
        ({"platform": "onnxruntime_onnx"}, "platform"),
        ({"runtime": "/tmp/evil.py"}, "runtime"),
        ({"default_model_filename": "../../evil.py"}, "default_model_filename"),
        (
            {"model_repository_agents": {"agents": [{"name": "checksum"}]}},
            "model_repository_agents",
        ),
        (
            {"parameters": {"EXECUTION_ENV_PATH": {"string_value": "/tmp/env.tar.gz"}}},
            "EXECUTION_ENV_PATH",
        ),
    ],
)
def test_an_override_may_not_change_the_code_a_model_runs(
    repo: Path, change: dict[str, Any], field: str
) -> None:
    control, triton, lines = gate(repo)
    answer = load(control, {"parameters": {"config": json.dumps(running_config(**change))}})
    assert answer.status == 403 and f"may not change {field!r}" in error(answer)
    assert triton.sent == []
    assert events(lines)[0]["field"] == field


def test_code_identity_fills_tritons_defaults() -> None:
    assert code_identity({"backend": "python"}) == code_identity(running_config())
    assert code_identity({"backend": "onnxruntime"})["default_model_filename"] == "model.onnx"


def test_a_verified_server_refuses_a_load_of_a_changed_version(
    repo: Path, signer: Ed25519PrivateKey
) -> None:
    control, triton, lines = gate(repo, signer)
    assert load(control, {}).status == 200
    changed = model_layout(repo, "scorer").python_model(2)
    changed.write_text("VERSION = 'not signed'\n")
    answer = load(control, {})
    assert answer.status == 403 and "scorer version 2 does not verify" in error(answer)
    # Only version 1 served: it verifies, so that load passes.
    only_one = running_config(version_policy={"specific": {"versions": [1]}})
    assert load(control, {"parameters": {"config": json.dumps(only_one)}}).status == 200
    assert len(triton.sent) == 2
    refusal = next(e for e in events(lines) if e["event"] == "model_load_refused")
    assert refusal["version"] == 2 and refusal["file"] == "model.py"
    assert refusal["file_sha256"] == hashlib.sha256(changed.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"not json", 400, "not JSON"),
        (b"[1]", 400, "JSON object"),
        ({"parameters": []}, 400, "'parameters' must be a JSON object"),
        ({"parameters": {"config": 5}}, 400, "'config' must be a string"),
        ({"parameters": {"config": "{"}}, 400, "'config' is not JSON"),
        ({"parameters": {"config": '{"name": "other"}'}}, 400, "names another model"),
        ({"parameters": {"poll": "true"}}, 400, "'poll' is not accepted"),
    ],
)
def test_a_malformed_load_is_refused_naming_the_rule(
    repo: Path, body: Any, status: int, words: str
) -> None:
    control, triton, _ = gate(repo)
    answer = load(control, body)
    assert answer.status == status and words in error(answer)
    assert triton.sent == []


def test_triton_gets_the_model_name_as_checked(repo: Path) -> None:
    control, triton, _ = gate(repo)
    assert load(control, {}, model="%73corer").status == 200
    assert triton.sent[0][1] == "/v2/repository/models/scorer/load"


@pytest.mark.parametrize("model", ["..%2F..%2Fetc", "%2Ftmp", "no%20such"])
def test_a_model_name_outside_the_repository_is_refused(repo: Path, model: str) -> None:
    control, triton, _ = gate(repo)
    assert load(control, {}, model=model).status == 400
    assert load(control, {}, model="absent").status == 404
    assert triton.sent == []


def test_settings_that_name_a_file_are_refused(repo: Path) -> None:
    control, triton, _ = gate(repo)
    for path, name in (("/v2/logging", "log_file"), ("/v2/trace/setting", "trace_file")):
        answer = control.handle("POST", path, HEADERS, json.dumps({name: "/etc/x"}).encode())
        assert answer.status == 403 and name in error(answer)
    assert triton.sent == []
    body = json.dumps({"log_verbose_level": 1}).encode()
    assert control.handle("POST", "/v2/logging", HEADERS, body).status == 200
    assert control.handle("GET", "/v2/models/scorer/trace/setting", HEADERS, None).status == 200
    assert triton.sent == [
        ("POST", "/v2/logging", body, True),
        ("GET", "/v2/models/scorer/trace/setting", None, True),
    ]


def test_other_gets_pass_through_without_the_key_and_inference_is_not_served(
    repo: Path,
) -> None:
    control, triton, _ = gate(repo)
    assert control.handle("GET", "/v2/models/scorer/config?x=1", {}, None).status == 200
    assert triton.sent == [("GET", "/v2/models/scorer/config?x=1", None, False)]
    for method, path in (("POST", "/v2/models/scorer/infer"), ("GET", "/admin")):
        assert control.handle(method, path, HEADERS, b"{}").status == 404
    answer = control.handle("GET", "/v2/repository/models/scorer/load", HEADERS, None)
    assert answer.status == 405
    assert len(triton.sent) == 1


def test_refusal_lines_are_rate_limited_and_clip_client_text(repo: Path) -> None:
    control, _, lines = gate(repo)
    for _ in range(200):
        control.handle("POST", "/v2/repository/index", {"admin-key": "x"}, b"{}")
    assert 1 <= len(lines) <= 25
    control, _, lines = gate(repo)
    name = "file:" + "A" * 100_000
    load(control, {"parameters": {name: "eA=="}})
    assert len(lines[0]) < 1_000
