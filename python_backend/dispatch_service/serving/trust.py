"""What a model trusts, as the launcher configured it: the keys it verifies its artifacts
against, and the priority key a window must carry to enter the priority lane.

The launcher (`ops.server`) verifies the repository before Triton starts and, when it does,
puts the trusted keys folder in the server's environment (`signing.TRUSTED_KEYS_ENV`); the
backend stubs inherit it. A model that reads artifacts (the cpu profile's `dispatch_model`,
`dispatch_fused`) reads it here, once, in `initialize`: this is the edge where the server's
environment enters the library. It is not a config parameter on purpose: a config override
in a load request could then turn verification off.

The priority lane (`dispatch_priority`) serves only windows sent with the priority key
(`dispatch_contract.keys`): Triton hands the model the header as a request parameter, and
the model compares its SHA-256 with the digest the launcher put in the environment. Triton
2.51 gives a Python model no caller address and no connection, only what the request
carries: a caller is told apart by its key, nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from dispatch_contract.keys import PRIORITY_KEY_DIGEST_ENV, PRIORITY_KEY_HEADER
from dispatch_service.core.signing import TRUSTED_KEYS_ENV, SigningError, TrustedKeys

__all__ = ["PRIORITY_REFUSED", "PriorityEntitlement", "model_trust", "priority_entitlement"]

PRIORITY_REFUSED: Final = (
    "the priority lane takes only windows sent with the priority key (header "
    f"{PRIORITY_KEY_HEADER!r}): send this window to dispatch_fused or dispatch"
)


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


@dataclass(frozen=True)
class PriorityEntitlement:
    """Admits a request that carries the priority key (compared by its SHA-256)."""

    digest: str  # hex SHA-256 of the key

    def admits(self, request: Any) -> bool:
        """Whether the request's parameters carry the key (a request that cannot say: no)."""
        try:
            text = request.parameters()
        except Exception:
            return False
        if not isinstance(text, str) or PRIORITY_KEY_HEADER not in text:
            return False
        try:
            presented = json.loads(text).get(PRIORITY_KEY_HEADER)
        except (ValueError, AttributeError):
            return False
        if not isinstance(presented, str):
            return False
        found = hashlib.sha256(presented.encode()).hexdigest()
        return hmac.compare_digest(found, self.digest)


def priority_entitlement(environ: Mapping[str, str] | None = None) -> PriorityEntitlement:
    """The launcher's priority key digest. Without one (a server not started by the
    launcher) no key is accepted: the lane is closed, not open."""
    digest = (os.environ if environ is None else environ).get(PRIORITY_KEY_DIGEST_ENV, "")
    return PriorityEntitlement(digest.strip().lower() or "-")
