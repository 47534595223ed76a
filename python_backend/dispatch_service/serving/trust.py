"""The trusted keys a model verifies its artifacts against, as the launcher configured them.

The launcher (`ops.server`) verifies the repository before Triton starts and, when it does,
puts the trusted keys folder in the server's environment (`signing.TRUSTED_KEYS_ENV`); the
backend stubs inherit it. A model that reads artifacts (the cpu profile's `dispatch_model`,
`dispatch_fused`) reads it here, once, in `initialize`: this is the edge where the server's
environment enters the library. It is not a config parameter on purpose: a config override
in a load request could then turn verification off.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dispatch_service.core.signing import TRUSTED_KEYS_ENV, SigningError, TrustedKeys

__all__ = ["model_trust"]


def model_trust(environ: Mapping[str, str] | None = None) -> TrustedKeys | None:
    """The trusted keys, or None when the server does not verify.

    Raises SigningError when verification is configured but no key can be read: the load
    then fails instead of running unverified.
    """
    folder = (os.environ if environ is None else environ).get(TRUSTED_KEYS_ENV, "")
    if not folder:
        return None
    trusted = TrustedKeys.from_directory(Path(folder))
    if not len(trusted):
        raise SigningError(f"no trusted keys (*.pub) in {folder} ({TRUSTED_KEYS_ENV})")
    return trusted
