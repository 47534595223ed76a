"""The signing half of the model lifecycle: which version folders a server could load, and
signing them all (`dispatch-admin sign-repository`); the errors `dispatch-admin` maps to its
exit codes. Routing a version (canary, shadow, promote, rollback) is a fleet revision:
`fleet_revisions`.
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from dispatch_service.core.signing import Manifest, SigningError, artifact_files, sign_version
from dispatch_service.ops.verified_load import repository_models

__all__ = [
    "LifecycleError",
    "UsageError",
    "sign_repository",
    "signable_versions",
]


class UsageError(Exception):
    """Arguments, files or keys that cannot be used (exit 2)."""


class LifecycleError(Exception):
    """A check failed or the server refused (exit 1); the message is one line."""


def signable_versions(repository: Path) -> list[tuple[str, int]]:
    """Every version folder a server could load from ``repository``: (model, version).

    That is every numeric version folder of every model with a config, whatever its
    version policy says today (a deploy loads versions the policy does not serve, and
    `verify` checks every folder), except ensembles' (Triton reads nothing there) and folders
    with no files at all.
    """
    if not repository.is_dir():
        raise UsageError(f"{repository} is not a folder")
    found: list[tuple[str, int]] = []
    for name, entry in repository_models(repository).items():
        if entry.is_ensemble:
            continue
        for version in entry.versions:
            try:
                files = artifact_files(repository / name / str(version))
            except SigningError as exc:
                raise UsageError(f"{name} version {version}: {exc}") from None
            if files:
                found.append((name, version))
    return found


def sign_repository(
    repository: Path, private_key: Ed25519PrivateKey
) -> list[tuple[str, int, Manifest]]:
    """Sign every folder of `signable_versions`; returns what was signed, in order."""
    signed = []
    for model, version in signable_versions(repository):
        try:
            manifest = sign_version(repository / model / str(version), private_key)
        except (SigningError, OSError) as exc:
            raise UsageError(f"{model} version {version}: {exc}") from None
        signed.append((model, version, manifest))
    return signed
