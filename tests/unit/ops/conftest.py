"""Fixtures shared by the `dispatch-admin` tests (test_admin.py, test_model_lifecycle.py:
``signer``, ``trusted_dir``, ``repo``) and the supervisor's (test_supervisor.py,
test_stub_healing.py, test_health_endpoint.py: ``supervisor``).

The repository is a copy in tmp_path of the committed configs and version 1 of the model;
version 2 is the same ONNX file (agrees with 1), version 3 a random contract model (does
not). Keys are throwaway.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from supervisor_stand_ins import FakeServer

from dispatch_service.core.paths import MODEL_REPOSITORY
from dispatch_service.core.repository_layout import (
    ENCODER_MODEL,
    RESOLVER_MODEL,
    SCORING_MODEL,
    model_layout,
)
from dispatch_service.core.signing import generate_private_key, public_key_pem, sign_version
from dispatch_service.ops.supervisor import Supervisor
from dispatch_service.ops.supervisor_state import SupervisorSettings

MODEL = SCORING_MODEL


@pytest.fixture
def signer() -> Any:
    return generate_private_key()


@pytest.fixture
def trusted_dir(tmp_path: Path, signer: Any) -> Path:
    folder = tmp_path / "trusted"
    folder.mkdir()
    (folder / "ops.pub").write_bytes(public_key_pem(signer.public_key()))
    return folder


@pytest.fixture
def repo(tmp_path: Path, signer: Any, contract_model: Path) -> Path:
    root = tmp_path / "repo"
    for name in (ENCODER_MODEL, RESOLVER_MODEL):
        target = model_layout(root, name)
        target.folder.mkdir(parents=True)
        shutil.copy(model_layout(MODEL_REPOSITORY, name).config, target.config)
    source = model_layout(MODEL_REPOSITORY, MODEL)
    scoring = model_layout(root, MODEL)
    scoring.folder.mkdir(parents=True)
    # The committed config with a known policy: serve the latest version only.
    config = [
        line
        for line in source.config.read_text().splitlines()
        if not line.startswith("version_policy")
    ]
    config.append("version_policy: { latest: { num_versions: 1 } }")
    scoring.config.write_text("\n".join(config) + "\n")
    for version in (1, 2):
        scoring.version(version).mkdir()
        shutil.copy(source.onnx(1), scoring.onnx(version))
        shutil.copy(source.python_model(1), scoring.python_model(version))
    scoring.version(3).mkdir()
    shutil.copy(contract_model, scoring.onnx(3))
    for version in (1, 2, 3):
        sign_version(scoring.version(version), signer)
    return root


@pytest.fixture
def supervisor() -> Iterator[Supervisor]:
    """A started supervisor over a server that runs nothing; its watchers wait an hour."""
    settings = SupervisorSettings(health_port=0, check_every_s=3600, poll_s=3600)
    supervised = Supervisor(FakeServer(), settings, report=lambda line: None).start()
    yield supervised
    supervised.stop()
