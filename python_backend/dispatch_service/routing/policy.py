"""Which dispatch_model version each order of a window should get: user buckets and tags.

Each order is routed by its user id (``ORDER_TEXT[user_id]``): a stable 64-bit hash (FNV-1a,
then the MurmurHash3 finaliser so that similar ids spread evenly) picks one of 100 buckets,
and buckets ``0 .. canary_percent - 1`` go to the canary version, the rest to the stable one.
The hash is the same in every process and release (never Python's salted ``hash()``), so a
user always sees one version; raising the percentage only adds users to the canary, lowering
it only removes them. The stable and canary versions and the canary share may differ per
city (``RouterSettings.city_routes``): a window is routed with its city's, and a user's
bucket is the same in every city. A request may force a version with the optional
``MODEL_VERSION_TAG`` input: ``stable``, ``canary`` or a version number.

Served versions
    Both entry points route over the same set: the versions of the scoring model
    (`dispatch_model`) that Triton serves, as the control plane states them in the routing
    settings (``RouterSettings.scoring_versions``: a fleet revision's ``versions``, in the live
    routing file every entry point reads; before a revision, the versions the launcher
    verified where it refused some, else the versions the routing names). A canary that is
    not served is out of routing: its users get the stable version at level 0, and the
    ``canary`` tag means the stable version (`routable`). A tag naming a served version gets
    that version; a tag naming any other version is not called and the stable version
    answers at level 1 (`engine`). dispatch_fused further drops a version whose artifacts did
    not load or verify in its own process.

    (Asking Triton instead, ``pb_utils.is_model_ready``, was tried on the 2.51 build: asked
    during a model's warm-up at server start it aborts the server with
    ``boost::interprocess::lock_exception``.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import MODEL_VERSION_TAG
from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain.hashing import fnv1a_64
from dispatch_service.domain.ids import ids_as_bytes
from dispatch_service.domain.window_wire import USER_IDS_FIELD
from dispatch_service.routing.settings import ROUTING_BUCKETS, RouterSettings

__all__ = [
    "TAG_CANARY",
    "TAG_STABLE",
    "IsServed",
    "ServedVersions",
    "choose_versions",
    "parse_version_tag",
    "routable",
    "route_window",
    "user_buckets",
]

TAG_STABLE: Final = "stable"
TAG_CANARY: Final = "canary"

I32 = NDArray[np.int32]
IsServed = Callable[[int], bool]  # whether a scoring-model version is served now


class ServedVersions:
    """Whether each scoring-model version is served, asked at most once per version.

    One snapshot per request: every decision about one window (routing, retry, shadow) sees
    the same answer, and Triton is asked once per version, not once per call.
    """

    def __init__(self, ask: IsServed) -> None:
        self._ask = ask
        self._known: dict[int, bool] = {}

    def __call__(self, version: int) -> bool:
        known = self._known.get(version)
        if known is None:
            known = self._known[version] = version >= 1 and bool(self._ask(version))
        return known


def routable(settings: RouterSettings, served: IsServed) -> RouterSettings:
    """The settings routing applies now: the canary taken out while it is not served."""
    if settings.canary_version and not served(settings.canary_version):
        return dataclasses.replace(settings, canary_version=0, canary_percent=0)
    return settings


def route_window(
    user_ids: ArrayLike,
    tag: ArrayLike | None,
    settings: RouterSettings,
    served: IsServed,
    city: str | None = None,
) -> tuple[RouterSettings, I32]:
    """The settings in force and each order's version: the one decision both entry points use.

    ``city``: the window's city (a registry id; None: unknown, as for `dispatch_features`),
    whose own route applies (`RouterSettings.for_city`). Raises DispatchInputError for a bad
    ``MODEL_VERSION_TAG``.
    """
    effective = routable(settings.for_city(city), served)
    return effective, choose_versions(user_ids, effective, parse_version_tag(tag, effective))


_MIX1: Final = np.uint64(0xFF51AFD7ED558CCD)
_MIX2: Final = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFT: Final = np.uint64(33)


def user_buckets(user_ids: ArrayLike) -> NDArray[np.int64]:
    """Bucket in [0, 100) per user id; identical in every process (FNV-1a + fmix64)."""
    h = fnv1a_64(ids_as_bytes(USER_IDS_FIELD, user_ids))
    h = h ^ (h >> _SHIFT)
    h = h * _MIX1  # numpy arrays wrap modulo 2**64
    h = h ^ (h >> _SHIFT)
    h = h * _MIX2
    h = h ^ (h >> _SHIFT)
    buckets: NDArray[np.int64] = (h % np.uint64(ROUTING_BUCKETS)).astype(np.int64)
    return buckets


def parse_version_tag(tag: ArrayLike | None, settings: RouterSettings) -> int | None:
    """The version a ``MODEL_VERSION_TAG`` forces, or None when the request sets none.

    ``stable`` -> the stable version; ``canary`` -> the canary (the stable version while no
    canary runs); a decimal number -> that version, whether or not it is served (one that is
    not is never called: the stable version answers at level 1).
    """
    if tag is None:
        return None
    name = MODEL_VERSION_TAG.name
    values = ids_as_bytes(name, tag)
    if len(values) != 1:
        raise DispatchInputError(name, f"must have shape [1], got {len(values)} values", "shape")
    try:
        text = values[0].decode("ascii").strip().lower()
    except UnicodeDecodeError:
        raise DispatchInputError(name, "must be ASCII text", "dtype") from None
    if text == TAG_STABLE:
        return settings.stable_version
    if text == TAG_CANARY:
        return settings.canary_version or settings.stable_version
    if text.isdigit() and len(text) <= 9 and int(text) >= 1:
        return int(text)
    raise DispatchInputError(
        name, "must be 'stable', 'canary' or a version number >= 1", "unknown_value"
    )


def choose_versions(
    user_ids: ArrayLike, settings: RouterSettings, forced: int | None = None
) -> I32:
    """int32 [B]: the dispatch_model version that should score each order."""
    count = int(np.asarray(user_ids, dtype=object).reshape(-1).size)
    if forced is not None:
        return np.full(count, forced, dtype=np.int32)
    versions = np.full(count, settings.stable_version, dtype=np.int32)
    if settings.canary_version and settings.canary_percent:
        canary = user_buckets(user_ids) < settings.canary_percent
        versions[canary] = settings.canary_version
    return versions
