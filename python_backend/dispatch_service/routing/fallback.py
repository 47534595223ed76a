"""The rule-based dispatcher: the last link of the fallback chain, when no model answers.

Level 0: the chosen version answered. Level 1: it failed (error, timeout, unloaded, or an
answer of the wrong shape or with non-finite values) and the stable version answered a
retry. Level 2: the rule-based dispatcher (``rule_based_objectives``) answered, so that the
resolver picks the nearest feasible rider and still respects capacity. Orders whose chosen
version *is* the stable one skip level 1: retrying the version that just failed would only
double the wait. Level 3: the chosen version answered, but on CPU instances, because no GPU
of the node is healthy (``RouterSettings.cpu_scoring``, set by the GPU monitor's
device-level fallback L2); it takes the place of level 0 only.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_contract import NUM_PAIR_FEATURES, PAIR_FEATURE_NAMES, PAIR_FEATURES
from dispatch_service.core.errors import DispatchInputError

__all__ = [
    "RULE_BASED_VERSION",
    "RULE_COST_BASE_CNY",
    "RULE_COST_PER_KM_CNY",
    "RULE_HANDLING_MINUTES",
    "RULE_ONTIME_SPREAD_MINUTES",
    "RULE_SPEED_KMH",
    "FallbackLevel",
    "rule_based_objectives",
]

RULE_BASED_VERSION: Final = 0  # ORDER_MODEL_VERSION of an order the rule-based dispatcher scored

F32 = NDArray[np.float32]


class FallbackLevel(IntEnum):
    """ORDER_FALLBACK_LEVEL: which link of the chain answered an order."""

    CHOSEN = 0  # the routed (or forced) version
    STABLE_RETRY = 1  # the stable version, after the chosen one failed
    RULE_BASED = 2  # no model answered: the rule-based dispatcher
    CPU_SCORED = 3  # the chosen version, on CPU instances: no GPU healthy (device level L2)


_PICKUP_KM: Final = PAIR_FEATURE_NAMES.index("pickup_distance_km")
_TRIP_KM: Final = PAIR_FEATURE_NAMES.index("trip_distance_km")
_SLACK: Final = PAIR_FEATURE_NAMES.index("slack_minutes")
RULE_SPEED_KMH: Final = 15.0  # one speed for every vehicle: nearer always means sooner
RULE_HANDLING_MINUTES: Final = 4.0
RULE_ONTIME_SPREAD_MINUTES: Final = 8.0
RULE_COST_BASE_CNY: Final = 6.0
RULE_COST_PER_KM_CNY: Final = 1.2
_MAX_KM: Final = 20_000.0


def rule_based_objectives(features: ArrayLike) -> F32:
    """[P, 3] objectives from pair features alone, for when no model version answers.

    ETA is the pickup plus trip distance at a fixed speed plus handling time; on-time is a
    logistic of the order's slack minus that ETA; cost is a base fare plus a rate per km.
    Within one order only the pickup distance differs between candidates, and every
    objective worsens with it, so a nearer rider dominates a farther one and the resolver
    (Pareto-consistent) ranks each order's nearest feasible rider first.
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != NUM_PAIR_FEATURES:
        raise DispatchInputError(
            PAIR_FEATURES.name, f"must have shape [P, {NUM_PAIR_FEATURES}], got {x.shape}", "shape"
        )
    pickup = np.clip(np.nan_to_num(x[:, _PICKUP_KM], nan=_MAX_KM), 0.0, _MAX_KM)
    trip = np.clip(np.nan_to_num(x[:, _TRIP_KM], nan=0.0), 0.0, _MAX_KM)
    slack = np.clip(np.nan_to_num(x[:, _SLACK], nan=0.0), -1e6, 1e6)
    km = pickup + trip
    eta = km / RULE_SPEED_KMH * 60.0 + RULE_HANDLING_MINUTES
    z = np.clip((slack - eta) / RULE_ONTIME_SPREAD_MINUTES, -60.0, 60.0)
    ontime = 1.0 / (1.0 + np.exp(-z))
    cost = RULE_COST_BASE_CNY + RULE_COST_PER_KM_CNY * km
    out: F32 = np.stack([eta, ontime, cost], axis=1).astype(np.float32)
    return out
