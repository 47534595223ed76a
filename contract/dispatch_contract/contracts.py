"""The wire contract: every tensor's name, dtype and shape, defined once.

`config.pbtxt` files, the ONNX graph, the client and the library all refer to
these names; `tests/unit/test_contracts.py` checks each config against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import Final

import numpy as np

__all__ = [
    "CANDIDATE_RIDER_INDEX",
    "DEFAULT_OBJECTIVE_WEIGHTS",
    "DISPATCH_ENSEMBLE_INPUTS",
    "DISPATCH_ENSEMBLE_OUTPUTS",
    "DISPATCH_OUTPUTS",
    "ENCODER_OUTPUTS",
    "FEATURE_ENTRY_INPUTS",
    "FEATURE_ENTRY_MODEL_NAME",
    "FEATURE_ENTRY_OUTPUTS",
    "FEATURE_LAYOUT_VERSION",
    "HARD_CONSTRAINTS",
    "KNOWN_CONSTRAINTS",
    "MAX_CANDIDATES",
    "MAX_ID_BYTES",
    "MAX_ORDERS",
    "MAX_PAIRS",
    "MAX_RIDERS",
    "MODEL_INPUTS",
    "MODEL_OUTPUTS",
    "MODEL_VERSION_TAG",
    "NUM_PAIR_FEATURES",
    "OBJECTIVES",
    "ORDER_FALLBACK_LEVEL",
    "ORDER_MODEL_VERSION",
    "PAIR_FEATURES",
    "PAIR_FEATURE_NAMES",
    "PAIR_OBJECTIVES",
    "RESOLVER_WINDOW_INPUTS",
    "ROUTER_INPUTS",
    "ROUTER_OUTPUTS",
    "ROUTING_INPUTS",
    "ROUTING_OUTPUTS",
    "TRITON_TO_NUMPY",
    "WINDOW_INPUTS",
    "CoordSystem",
    "OrderConstraint",
    "TensorSpec",
    "Vehicle",
    "spec_by_name",
]


@dataclass(frozen=True)
class TensorSpec:
    """One tensor as Triton sees it; -1 is a variable dimension."""

    name: str
    triton_dtype: str  # e.g. "FP32", "BYTES" (the KServe v2 spelling)
    dims: tuple[int, ...]
    optional: bool = False
    doc: str = ""

    @property
    def numpy_dtype(self) -> np.dtype[np.generic]:
        return np.dtype(TRITON_TO_NUMPY[self.triton_dtype])


TRITON_TO_NUMPY: Final[dict[str, type[np.generic]]] = {
    "BOOL": np.bool_,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}

# ---- limits a window must respect (documented in docs/contract.md) ----------------------------
MAX_ORDERS: Final = 1024
MAX_RIDERS: Final = 8192
MAX_ID_BYTES: Final = 64
MAX_CANDIDATES: Final = 32
# dispatch_model's max_batch_size must hold one whole window's pairs.
MAX_PAIRS: Final = MAX_ORDERS * MAX_CANDIDATES


class CoordSystem(IntEnum):
    """Datum of the lat/lon inputs; everything downstream works in WGS-84."""

    WGS84 = 0
    GCJ02 = 1
    BD09 = 2


class OrderConstraint(IntFlag):
    """Bits of ORDER_CONSTRAINTS. THERMAL_BOX and LARGE_ITEM are hard constraints."""

    THERMAL_BOX = 1  # rider must carry a thermal box (RIDER_EQUIPMENT bit)
    LARGE_ITEM = 2  # needs a car
    FRAGILE = 4  # slower handling, no hard rule
    PRIORITY = 8  # premium order, no hard rule


KNOWN_CONSTRAINTS: Final = int(
    OrderConstraint.THERMAL_BOX
    | OrderConstraint.LARGE_ITEM
    | OrderConstraint.FRAGILE
    | OrderConstraint.PRIORITY
)
HARD_CONSTRAINTS: Final = int(OrderConstraint.THERMAL_BOX | OrderConstraint.LARGE_ITEM)


class Vehicle(IntEnum):
    EBIKE = 0
    MOTORBIKE = 1
    CAR = 2


# Objective columns of PAIR_OBJECTIVES, in order.
OBJECTIVES: Final = ("eta_minutes", "ontime_probability", "cost_cny")
DEFAULT_OBJECTIVE_WEIGHTS: Final = (0.45, 0.35, 0.20)  # latency, on-time, cost

# ---- pair feature layout (float32 [P, F]); shipped with each model version ------------
FEATURE_LAYOUT_VERSION: Final = "v1"
PAIR_FEATURE_NAMES: Final[tuple[str, ...]] = (
    "pickup_distance_km",  # rider -> pickup, haversine
    "trip_distance_km",  # pickup -> drop-off, haversine
    "approach_bearing_sin",  # bearing rider -> pickup
    "approach_bearing_cos",
    "trip_bearing_sin",  # bearing pickup -> drop-off
    "trip_bearing_cos",
    "rider_zone_east_km",  # centre of the rider's geohash-5 zone, km east of city centre
    "rider_zone_north_km",
    "pickup_zone_east_km",
    "pickup_zone_north_km",
    "dropoff_zone_east_km",
    "dropoff_zone_north_km",
    "hour_sin",  # local hour of the dispatch time
    "hour_cos",
    "is_weekend",
    "order_age_minutes",  # dispatch time - created-at
    "promised_minutes",
    "slack_minutes",  # promised - age
    "needs_thermal_box",
    "large_item",
    "fragile",
    "priority",
    "rider_load",
    "rider_capacity",
    "rider_load_ratio",
    "vehicle_ebike",
    "vehicle_motorbike",
    "vehicle_car",
)
NUM_PAIR_FEATURES: Final = len(PAIR_FEATURE_NAMES)

# ---- the dispatch window: inputs of the `dispatch` ensemble and `feature_encoder` ---------
B, R, P, N, K = -1, -1, -1, -1, -1  # variable dims, named for readability

WINDOW_INPUTS: Final[tuple[TensorSpec, ...]] = (
    TensorSpec("ORDER_IDS", "BYTES", (B,), doc="order id, 1..64 UTF-8 bytes, unique"),
    TensorSpec("ORDER_USER_IDS", "BYTES", (B,), doc="user/tenant id, 1..64 bytes"),
    TensorSpec("ORDER_PICKUP", "FP64", (B, 2), doc="pickup [lat, lon] degrees, COORD_SYSTEM"),
    TensorSpec("ORDER_DROPOFF", "FP64", (B, 2), doc="drop-off [lat, lon] degrees"),
    TensorSpec("ORDER_CREATED_AT", "INT64", (B,), doc="creation time, unix seconds"),
    TensorSpec("ORDER_PROMISED_MINUTES", "FP32", (B,), doc="promised delivery minutes, (0, 240]"),
    TensorSpec("ORDER_CONSTRAINTS", "INT32", (B,), doc="OrderConstraint bitmask"),
    TensorSpec("RIDER_IDS", "BYTES", (R,), doc="rider id, 1..64 bytes, unique"),
    TensorSpec("RIDER_POSITION", "FP64", (R, 2), doc="rider [lat, lon] degrees"),
    TensorSpec("RIDER_LOAD", "INT32", (R,), doc="orders the rider carries now, >= 0"),
    TensorSpec("RIDER_CAPACITY", "INT32", (R,), doc="most orders the rider may carry, >= 0"),
    TensorSpec("RIDER_VEHICLE", "INT32", (R,), doc="Vehicle: 0 e-bike, 1 motorbike, 2 car"),
    TensorSpec("RIDER_EQUIPMENT", "INT32", (R,), doc="bit 1: carries a thermal box"),
    TensorSpec("COORD_SYSTEM", "BYTES", (1,), doc="WGS84 | GCJ02 | BD09"),
    TensorSpec("DISPATCH_TIME", "INT64", (1,), doc="the window's decision time, unix seconds"),
    TensorSpec(
        "OBJECTIVE_WEIGHTS",
        "FP32",
        (3,),
        optional=True,
        doc="weights of latency, on-time, cost; >= 0, sum > 0; default 0.45/0.35/0.20",
    ),
)

# ---- intermediate tensors between the steps ----------------------------------------------
PAIR_FEATURES = TensorSpec("PAIR_FEATURES", "FP32", (P, NUM_PAIR_FEATURES))
CANDIDATE_RIDER_INDEX = TensorSpec(
    "CANDIDATE_RIDER_INDEX", "INT32", (B, N), doc="row of RIDER_* per candidate, -1 = none"
)
PAIR_OBJECTIVES = TensorSpec(
    "PAIR_OBJECTIVES", "FP32", (P, 3), doc="per pair: ETA minutes, on-time probability, cost CNY"
)

ENCODER_OUTPUTS: Final = (PAIR_FEATURES, CANDIDATE_RIDER_INDEX)
MODEL_INPUTS: Final = (PAIR_FEATURES,)
MODEL_OUTPUTS: Final = (PAIR_OBJECTIVES,)

RESOLVER_WINDOW_INPUTS: Final = ("RIDER_IDS", "RIDER_LOAD", "RIDER_CAPACITY", "OBJECTIVE_WEIGHTS")

# ---- the answer: outputs of `topk_resolver` and the `dispatch` ensemble ------------------
DISPATCH_OUTPUTS: Final[tuple[TensorSpec, ...]] = (
    TensorSpec(
        "TOPK_RIDER_IDS", "BYTES", (B, K), doc="best riders per order, best first; b'' pads"
    ),
    TensorSpec("TOPK_RIDER_INDEX", "INT32", (B, K), doc="row of RIDER_* per Top-K slot; -1 pads"),
    TensorSpec("TOPK_SCORE", "FP32", (B, K), doc="weighted score in [0, 1]; 0 pads"),
    TensorSpec("TOPK_ETA_MINUTES", "FP32", (B, K), doc="predicted minutes to delivery"),
    TensorSpec("TOPK_ONTIME_PROBABILITY", "FP32", (B, K), doc="predicted P(on time)"),
    TensorSpec("TOPK_COST", "FP32", (B, K), doc="predicted delivery cost, CNY"),
    TensorSpec("ASSIGNED_RIDER_IDS", "BYTES", (B,), doc="assigned rider; b'' = unassigned"),
    TensorSpec("ASSIGNED_RIDER_INDEX", "INT32", (B,), doc="row of RIDER_*; -1 = unassigned"),
    TensorSpec("ASSIGNED_SCORE", "FP32", (B,), doc="score of the assigned pair; 0 = unassigned"),
)


# ---- server-side canary: `dispatch_router` between feature_encoder and topk_resolver ----
MODEL_VERSION_TAG = TensorSpec(
    "MODEL_VERSION_TAG",
    "BYTES",
    (1,),
    optional=True,
    doc="optional A/B tag forcing a dispatch_model version: stable | canary | a version number",
)
ORDER_MODEL_VERSION = TensorSpec(
    "ORDER_MODEL_VERSION",
    "INT32",
    (B,),
    doc="dispatch_model version that scored the order; 0 = the rule-based dispatcher",
)
ORDER_FALLBACK_LEVEL = TensorSpec(
    "ORDER_FALLBACK_LEVEL",
    "INT32",
    (B,),
    doc="0 chosen version answered, 1 stable retry answered, 2 rule-based dispatcher answered, "
    "3 chosen version answered on CPU instances (no healthy GPU: device fallback L2)",
)
ROUTING_INPUTS: Final = (MODEL_VERSION_TAG,)
ROUTING_OUTPUTS: Final = (ORDER_MODEL_VERSION, ORDER_FALLBACK_LEVEL)
ROUTER_INPUTS: Final = (
    PAIR_FEATURES,
    CANDIDATE_RIDER_INDEX,
    next(spec for spec in WINDOW_INPUTS if spec.name == "ORDER_USER_IDS"),
    MODEL_VERSION_TAG,
)
ROUTER_OUTPUTS: Final = (PAIR_OBJECTIVES, *ROUTING_OUTPUTS)
# The `dispatch` ensemble: the window plus the optional tag in; the resolver's answer plus
# the per-order routing outputs out (DISPATCH_OUTPUTS stays the resolver's own outputs).
DISPATCH_ENSEMBLE_INPUTS: Final = (*WINDOW_INPUTS, *ROUTING_INPUTS)
DISPATCH_ENSEMBLE_OUTPUTS: Final = (*DISPATCH_OUTPUTS, *ROUTING_OUTPUTS)


def spec_by_name(name: str) -> TensorSpec:
    for spec in (
        *WINDOW_INPUTS,
        *ENCODER_OUTPUTS,
        *MODEL_OUTPUTS,
        *DISPATCH_OUTPUTS,
        *ROUTING_INPUTS,
        *ROUTING_OUTPUTS,
    ):
        if spec.name == name:
            return spec
    raise KeyError(name)


# ---- the feature-level entry point: the `dispatch_features` ensemble ----------------------
# For co-located feature services that already hold pair features: the caller encodes the
# window (layout of the served dispatch_model versions, `v1` above), and the ensemble runs
# the same dispatch_router -> topk_resolver steps as `dispatch`, so canary routing, fallback
# and the answer are those of `dispatch` for the same window. ORDER_USER_IDS is needed for
# the per-user canary routing.
FEATURE_ENTRY_MODEL_NAME: Final = "dispatch_features"
FEATURE_ENTRY_INPUTS: Final[tuple[TensorSpec, ...]] = (
    TensorSpec(
        PAIR_FEATURES.name,
        PAIR_FEATURES.triton_dtype,
        PAIR_FEATURES.dims,
        doc="one row per candidate pair, P = B x N rows in CANDIDATE_RIDER_INDEX order",
    ),
    CANDIDATE_RIDER_INDEX,
    *(spec for spec in WINDOW_INPUTS if spec.name == "ORDER_USER_IDS"),
    *(spec for spec in WINDOW_INPUTS if spec.name in RESOLVER_WINDOW_INPUTS),
    *ROUTING_INPUTS,
)
FEATURE_ENTRY_OUTPUTS: Final = DISPATCH_ENSEMBLE_OUTPUTS
