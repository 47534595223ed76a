"""The wire contract: every tensor's name, dtype and shape, defined once.

`config.pbtxt` files, the ONNX graph, the client and the library all refer to
these names; `tests/unit/test_contracts.py` checks each config against them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import IntEnum, IntFlag
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "ASSIGNED_OBJECTIVES",
    "CANDIDATE_RIDER_INDEX",
    "CONTRACT_VERSION",
    "DECISION_RECORD_INPUTS",
    "DEFAULT_OBJECTIVE_WEIGHTS",
    "DISPATCH_ENSEMBLE_INPUTS",
    "DISPATCH_ENSEMBLE_OUTPUTS",
    "DISPATCH_OUTPUTS",
    "ENCODER_INPUTS",
    "ENCODER_OUTPUTS",
    "FEATURE_ENTRY_INPUTS",
    "FEATURE_ENTRY_MODEL_NAME",
    "FEATURE_ENTRY_OUTPUTS",
    "FEATURE_LAYOUT_VERSION",
    "HARD_CONSTRAINTS",
    "KNOWN_CONSTRAINTS",
    "MAX_ADDRESS_BYTES",
    "MAX_CANDIDATES",
    "MAX_CITY_BYTES",
    "MAX_ID_BYTES",
    "MAX_ORDERS",
    "MAX_PAIRS",
    "MAX_RIDERS",
    "MAX_WINDOW_BATCH",
    "MAX_WIRE_TENSORS",
    "MODEL_INPUTS",
    "MODEL_OUTPUTS",
    "MODEL_VERSION_TAG",
    "NUM_PAIR_FEATURES",
    "OBJECTIVES",
    "ORDER_FALLBACK_LEVEL",
    "ORDER_FIELDS",
    "ORDER_FIELD_COLUMNS",
    "ORDER_FIELD_SOURCES",
    "ORDER_LOCATION_SOURCE",
    "ORDER_MODEL_VERSION",
    "ORDER_TEXT",
    "ORDER_TEXT_COLUMNS",
    "ORDER_TEXT_SOURCES",
    "ORDER_USER_IDS",
    "PAIR_FEATURES",
    "PAIR_FEATURE_NAMES",
    "PAIR_OBJECTIVES",
    "PRIORITY_LANE_MODEL_NAME",
    "RESOLVER_INPUTS",
    "RESOLVER_OUTPUTS",
    "RIDER_FIELDS",
    "RIDER_FIELD_COLUMNS",
    "RIDER_FIELD_SOURCES",
    "ROUTER_INPUTS",
    "ROUTER_OUTPUTS",
    "ROUTING_INPUTS",
    "ROUTING_OUTPUTS",
    "STACKING_INPUTS",
    "TOPK_OBJECTIVES",
    "TOPK_OBJECTIVE_COLUMNS",
    "TRITON_TO_NUMPY",
    "WINDOW_CITY",
    "WINDOW_FIELDS",
    "WINDOW_FIELD_COLUMNS",
    "WINDOW_INPUTS",
    "WIRE_DISPATCH_INPUTS",
    "WIRE_DISPATCH_OUTPUTS",
    "WIRE_WINDOW_INPUTS",
    "CoordSystem",
    "LocationSource",
    "OrderConstraint",
    "TensorSpec",
    "Vehicle",
    "batched",
    "coord_system_code",
    "declared_by_ensemble",
    "pack_order_text",
    "pack_window",
    "spec_by_name",
    "wire_shape",
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
MAX_ADDRESS_BYTES: Final = 256  # each of ORDER_TEXT's two address columns
MAX_CITY_BYTES: Final = 64  # ORDER_TEXT's city column
MAX_CANDIDATES: Final = 32
# dispatch_model's max_batch_size must hold one whole window's pairs.
MAX_PAIRS: Final = MAX_ORDERS * MAX_CANDIDATES


class CoordSystem(IntEnum):
    """Datum of the lat/lon inputs; everything downstream works in WGS-84."""

    WGS84 = 0
    GCJ02 = 1
    BD09 = 2


class LocationSource(IntEnum):
    """How a pickup or drop-off point was found (ORDER_LOCATION_SOURCE)."""

    GIVEN = 0  # the request carried coordinates
    CACHE = 1  # geocoded earlier: the geocoding cache
    GEOCODER = 2  # a geocoding provider answered within the window's deadline
    GAZETTEER = 3  # matched offline: district (cpca), road or place of the city gazetteer


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
# Latency, on-time, cost. Chosen by the users' measure: the fewest late orders among the
# weightings whose mean delivery is never significantly slower (95 % CI) than one fixed
# baseline, the rule ETA at (0.8, 0, 0.2), in any city and regime; `make evaluate` judges
# nine candidates by it (docs/model-lifecycle.md#the-default-objective). More on-time weight
# makes scarce windows significantly slower; callers who put promises first send their own.
DEFAULT_OBJECTIVE_WEIGHTS: Final = (0.725, 0.075, 0.20)

# ---- pair feature layout (float32 [P, F]); shipped with each model version ------------
# v3: positions relative to the window's own city, and the city map's road columns.
FEATURE_LAYOUT_VERSION: Final = "v3"
PAIR_FEATURE_NAMES: Final[tuple[str, ...]] = (
    "pickup_distance_km",  # rider -> pickup, haversine
    "trip_distance_km",  # pickup -> drop-off, haversine
    "approach_bearing_sin",  # bearing rider -> pickup
    "approach_bearing_cos",
    "trip_bearing_sin",  # bearing pickup -> drop-off
    "trip_bearing_cos",
    "rider_zone_east_km",  # centre of the rider's geohash-7 zone, km east of its city's centre
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
    # From the window's city map (the registry): barriers crossed, the km their best
    # crossings add, and the free-flow minutes on the road for the rider's vehicle.
    "approach_barrier_crossings",  # rider -> pickup
    "trip_barrier_crossings",  # pickup -> drop-off
    "approach_detour_km",
    "trip_detour_km",
    "approach_route_minutes",
    "trip_route_minutes",
)
NUM_PAIR_FEATURES: Final = len(PAIR_FEATURE_NAMES)

# ---- the dispatch window, one tensor per field: the library's form of a window ----------
# (what `window_from_tensors` validates and the client builds from JSON). On the wire (v2,
# below) these are packed into ORDER_FIELDS, RIDER_FIELDS and WINDOW_FIELDS.
B, R, P, N, K = -1, -1, -1, -1, -1  # variable dims, named for readability

WINDOW_INPUTS: Final[tuple[TensorSpec, ...]] = (
    TensorSpec("ORDER_IDS", "BYTES", (B,), doc="order id, 1..64 UTF-8 bytes, unique"),
    TensorSpec("ORDER_USER_IDS", "BYTES", (B,), doc="user/tenant id, 1..64 bytes"),
    TensorSpec(
        "ORDER_PICKUP",
        "FP64",
        (B, 2),
        doc="pickup [lat, lon] degrees, COORD_SYSTEM; both NaN: geocode ORDER_PICKUP_ADDRESS",
    ),
    TensorSpec(
        "ORDER_DROPOFF",
        "FP64",
        (B, 2),
        doc="drop-off [lat, lon] degrees; both NaN: geocode ORDER_DROPOFF_ADDRESS",
    ),
    TensorSpec("ORDER_CREATED_AT", "INT64", (B,), doc="creation time, unix seconds"),
    TensorSpec("ORDER_PROMISED_MINUTES", "FP32", (B,), doc="promised delivery minutes, (0, 240]"),
    TensorSpec("ORDER_CONSTRAINTS", "INT32", (B,), doc="OrderConstraint bitmask"),
    TensorSpec(
        "ORDER_PICKUP_ADDRESS",
        "BYTES",
        (B,),
        optional=True,
        doc="pickup address, UTF-8, at most 256 bytes; b'' = not given",
    ),
    TensorSpec(
        "ORDER_DROPOFF_ADDRESS",
        "BYTES",
        (B,),
        optional=True,
        doc="drop-off address, UTF-8, at most 256 bytes; b'' = not given",
    ),
    TensorSpec(
        "ORDER_CITY",
        "BYTES",
        (B,),
        optional=True,
        doc="the addresses' city, a name or an adcode, at most 64 bytes; b'' = not given",
    ),
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
        doc="weights of latency, on-time, cost; >= 0, sum > 0; default 0.8/0/0.2",
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

ORDER_LOCATION_SOURCE = TensorSpec(
    "ORDER_LOCATION_SOURCE",
    "INT32",
    (B, 2),
    doc="per order, pickup then drop-off: how the point was found; 0 coordinates given, "
    "1 geocoding cache, 2 geocoder, 3 gazetteer rule match",
)

# The city the encoder found serving the window: dispatch_router routes the
# window with that city's settings, and every entry point that encodes the window answers
# with it (a window no registered city serves is refused, so every answer names one). A
# request that carries none (dispatch_features, whose client encodes the window) is routed
# with the global settings.
WINDOW_CITY = TensorSpec(
    "WINDOW_CITY",
    "BYTES",
    (1,),
    doc="the id of the registered city that served the window (`docs/cities.md`; its routing "
    "and metrics label)",
)

ENCODER_OUTPUTS: Final = (
    PAIR_FEATURES,
    CANDIDATE_RIDER_INDEX,
    ORDER_LOCATION_SOURCE,
    WINDOW_CITY,
)
MODEL_INPUTS: Final = (PAIR_FEATURES,)
MODEL_OUTPUTS: Final = (PAIR_OBJECTIVES,)


# ---- the answer, one tensor per field (v1): the library's `Resolution.as_tensors` ---------
# On the wire (v2, below) the ids are dropped and the objectives packed in TOPK_OBJECTIVES.
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
ORDER_USER_IDS: Final = next(spec for spec in WINDOW_INPUTS if spec.name == "ORDER_USER_IDS")
# The order's text on the wire (v2): one BYTES matrix, a column per field. Only the user id
# is required; columns may be left off from the right (a window without addresses sends
# [B, 1]). The routing key is its first column: each order is routed by its user's bucket.
ORDER_TEXT_COLUMNS: Final = (
    "user_id",  # user/tenant id, 1..64 bytes
    "pickup_address",  # UTF-8, at most MAX_ADDRESS_BYTES; b"" = not given
    "dropoff_address",
    "city",  # name or adcode of the addresses' city; b"" = not given
)
# Which logical window tensor (WINDOW_INPUTS) each column carries, in column order.
ORDER_TEXT_SOURCES: Final = (
    "ORDER_USER_IDS",
    "ORDER_PICKUP_ADDRESS",
    "ORDER_DROPOFF_ADDRESS",
    "ORDER_CITY",
)
ORDER_TEXT = TensorSpec(
    "ORDER_TEXT",
    "BYTES",
    (B, -1),
    doc="per order, ORDER_TEXT_COLUMNS (1 to 4 of them, left to right)",
)
ROUTING_INPUTS: Final = (MODEL_VERSION_TAG,)
ROUTING_OUTPUTS: Final = (ORDER_MODEL_VERSION, ORDER_FALLBACK_LEVEL)
ROUTER_INPUTS: Final = (
    PAIR_FEATURES,
    CANDIDATE_RIDER_INDEX,
    ORDER_TEXT,
    MODEL_VERSION_TAG,
    replace(WINDOW_CITY, optional=True),  # absent: the global routing settings
)
ROUTER_OUTPUTS: Final = (PAIR_OBJECTIVES, *ROUTING_OUTPUTS)


# ==== contract v2: what crosses the wire ==================================================
# At most 9 tensors per request in and out of every window-level model: the window's numbers
# packed into FP64 matrices with the column layouts below, ids as BYTES, answers as rider
# indices (rows of RIDER_IDS; the client maps them back to ids) and objective matrices.
# Every window-level model declares `max_batch_size` > 0, so every tensor below is sent with
# a leading batch dimension of 1 per request (one window per request): ORDER_FIELDS [B, 7]
# goes out as [1, B, 7]. Triton may then gather several windows into one `execute`
# (`allow_ragged_batch`: windows of different sizes batch together). `dims` below are the
# per-window dims, as the config.pbtxt files declare them (without the batch dimension).
CONTRACT_VERSION: Final = 2
# Most windows Triton gathers into one execute of a window-level model.
MAX_WINDOW_BATCH: Final = 64

# Column layouts. Integer columns (created_at, constraints, load, ...) must hold whole
# numbers (FP64 is exact for integers up to 2**53, far above every limit).
ORDER_FIELD_COLUMNS: Final = (
    "pickup_lat",  # degrees, COORD_SYSTEM datum
    "pickup_lon",
    "dropoff_lat",
    "dropoff_lon",
    "created_at",  # unix seconds (whole)
    "promised_minutes",  # (0, 240]
    "constraints",  # OrderConstraint bitmask (whole)
)
RIDER_FIELD_COLUMNS: Final = (
    "lat",  # degrees, COORD_SYSTEM datum
    "lon",
    "load",  # orders carried now, >= 0 (whole)
    "capacity",  # most orders the rider may carry, >= 0 (whole)
    "vehicle",  # Vehicle: 0 e-bike, 1 motorbike, 2 car
    "equipment",  # bit 1: carries a thermal box (whole)
)
WINDOW_FIELD_COLUMNS: Final = (
    "dispatch_time",  # the window's decision time, unix seconds (whole, > 0)
    "coord_system",  # CoordSystem: 0 WGS84, 1 GCJ02, 2 BD09
)
TOPK_OBJECTIVE_COLUMNS: Final = (
    "score",  # weighted score in [0, 1]; 0 pads
    "eta_minutes",  # predicted minutes to delivery
    "ontime_probability",  # predicted P(on time)
    "cost",  # predicted delivery cost, CNY
)
# Which logical window tensor (WINDOW_INPUTS) each column carries, in column order.
ORDER_FIELD_SOURCES: Final = (
    ("ORDER_PICKUP", 0),
    ("ORDER_PICKUP", 1),
    ("ORDER_DROPOFF", 0),
    ("ORDER_DROPOFF", 1),
    ("ORDER_CREATED_AT", None),
    ("ORDER_PROMISED_MINUTES", None),
    ("ORDER_CONSTRAINTS", None),
)
RIDER_FIELD_SOURCES: Final = (
    ("RIDER_POSITION", 0),
    ("RIDER_POSITION", 1),
    ("RIDER_LOAD", None),
    ("RIDER_CAPACITY", None),
    ("RIDER_VEHICLE", None),
    ("RIDER_EQUIPMENT", None),
)

_WINDOW_SPECS = {spec.name: spec for spec in WINDOW_INPUTS}
ORDER_FIELDS = TensorSpec(
    "ORDER_FIELDS", "FP64", (B, len(ORDER_FIELD_COLUMNS)), doc="per order, ORDER_FIELD_COLUMNS"
)
RIDER_FIELDS = TensorSpec(
    "RIDER_FIELDS", "FP64", (R, len(RIDER_FIELD_COLUMNS)), doc="per rider, RIDER_FIELD_COLUMNS"
)
WINDOW_FIELDS = TensorSpec(
    "WINDOW_FIELDS", "FP64", (len(WINDOW_FIELD_COLUMNS),), doc="WINDOW_FIELD_COLUMNS"
)
WIRE_WINDOW_INPUTS: Final[tuple[TensorSpec, ...]] = (
    _WINDOW_SPECS["ORDER_IDS"],
    ORDER_TEXT,
    ORDER_FIELDS,
    _WINDOW_SPECS["RIDER_IDS"],
    RIDER_FIELDS,
    WINDOW_FIELDS,
    _WINDOW_SPECS["OBJECTIVE_WEIGHTS"],
)
# The encoder needs the window without the weights (they are the resolver's).
ENCODER_INPUTS: Final = tuple(s for s in WIRE_WINDOW_INPUTS if s.name != "OBJECTIVE_WEIGHTS")

TOPK_OBJECTIVES = TensorSpec(
    "TOPK_OBJECTIVES",
    "FP32",
    (B, K, len(TOPK_OBJECTIVE_COLUMNS)),
    doc="per Top-K slot, TOPK_OBJECTIVE_COLUMNS; 0 pads",
)
# The assigned pair's figures: the assignment looks past the Top-K list (every candidate),
# so the assigned rider is not always one of the listed ones.
ASSIGNED_OBJECTIVES = TensorSpec(
    "ASSIGNED_OBJECTIVES",
    "FP32",
    (B, len(OBJECTIVES)),
    doc="ETA minutes, on-time probability, cost CNY of the assigned pair (OBJECTIVES, at the "
    "load it rides with); 0 = unassigned",
)
_V1_OUTPUTS = {spec.name: spec for spec in DISPATCH_OUTPUTS}
RESOLVER_OUTPUTS: Final[tuple[TensorSpec, ...]] = (
    _V1_OUTPUTS["TOPK_RIDER_INDEX"],
    TOPK_OBJECTIVES,
    _V1_OUTPUTS["ASSIGNED_RIDER_INDEX"],
    _V1_OUTPUTS["ASSIGNED_SCORE"],
    ASSIGNED_OBJECTIVES,
)
# What the stack-aware resolution needs besides: each pair's features (scored
# again with the rider's extra load), the version that scored each order (it scores them
# again) and the orders' creation times (a rider carries its new orders in that order).
# Optional: a request without them is resolved with its stand-alone objectives.
STACKING_INPUTS: Final[tuple[TensorSpec, ...]] = (
    replace(PAIR_FEATURES, optional=True),
    replace(ORDER_MODEL_VERSION, optional=True),
    replace(ORDER_FIELDS, optional=True),  # created_at column
)
# What the `dispatch` ensemble's decision records need besides (the resolver ends the
# ensemble and records them): the routing key, the window's city and decision time, each
# order's fallback level. Optional: a request without them records no decision.
DECISION_RECORD_INPUTS: Final[tuple[TensorSpec, ...]] = (
    replace(ORDER_TEXT, optional=True),
    replace(WINDOW_CITY, optional=True),
    replace(WINDOW_FIELDS, optional=True),
    replace(ORDER_FALLBACK_LEVEL, optional=True),
)
RESOLVER_INPUTS: Final[tuple[TensorSpec, ...]] = (
    PAIR_OBJECTIVES,
    CANDIDATE_RIDER_INDEX,
    _WINDOW_SPECS["RIDER_IDS"],  # the tie-break hashes the ids
    RIDER_FIELDS,  # load and capacity columns
    _WINDOW_SPECS["OBJECTIVE_WEIGHTS"],
    *STACKING_INPUTS,
    # Exact ties between orders are broken by their ids, not their rows (the answer
    # must not depend on how the caller lists the window). Optional: without it, by row.
    replace(_WINDOW_SPECS["ORDER_IDS"], optional=True),
    *DECISION_RECORD_INPUTS,
)
# The priority lane: `dispatch_fused` on stubs of its own at the server's CPU priority, with
# the same tensors and answer. Level-1 windows go there (`DispatchClient` sends them): Triton's
# priority levels order a queue, but on a busy server a level-1 window sent to `dispatch` or
# `dispatch_fused` still waits for a free instance and shares its batch with bulk windows.
PRIORITY_LANE_MODEL_NAME: Final = "dispatch_priority"
# `dispatch`, `dispatch_fused` and `dispatch_priority`: 8 tensors in, 9 out.
WIRE_DISPATCH_INPUTS: Final = (*WIRE_WINDOW_INPUTS, *ROUTING_INPUTS)
WIRE_DISPATCH_OUTPUTS: Final = (
    *RESOLVER_OUTPUTS,
    *ROUTING_OUTPUTS,
    ORDER_LOCATION_SOURCE,
    WINDOW_CITY,
)
MAX_WIRE_TENSORS: Final = 9
# The `dispatch` ensemble (and `dispatch_fused`): the packed window plus the optional tag in;
# the resolver's answer, the per-order routing outputs and where the points and the window
# were located out.
DISPATCH_ENSEMBLE_INPUTS: Final = WIRE_DISPATCH_INPUTS
DISPATCH_ENSEMBLE_OUTPUTS: Final = WIRE_DISPATCH_OUTPUTS


def declared_by_ensemble(specs: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
    """``specs`` as an ensemble's config declares them: every input optional.

    Triton 2.51 runs no step of an ensemble request that lacks a required input but carries
    an optional one, and answers "unexpected deadlock" without naming the tensor. Declared
    optional, the request reaches the first step that needs the tensor, and that step's
    input check refuses it by name. Clients still must send what ``specs`` requires.
    """
    return tuple(replace(spec, optional=True) for spec in specs)


def wire_shape(spec: TensorSpec) -> str:
    """The shape a request sends for `spec`, batch dimension first: e.g. "[1, B, 7]"."""
    return "[" + ", ".join(["1", *("*" if d == -1 else str(d) for d in spec.dims)]) + "]"


def pack_window(tensors: Mapping[str, Any]) -> dict[str, NDArray[Any]]:
    """The logical window tensors (WINDOW_INPUTS names, plus MODEL_VERSION_TAG) -> the v2
    wire tensors, without the batch dimension. Only packs; value rules are the server's.

    COORD_SYSTEM may be a name (b"GCJ02") or the CoordSystem code; absent means WGS84.
    Raises KeyError naming a missing required tensor, ValueError for an unknown datum.
    """
    out: dict[str, NDArray[Any]] = {}
    for name in ("ORDER_IDS", "RIDER_IDS"):
        out[name] = np.asarray(tensors[name], dtype=object).reshape(-1)
    out[ORDER_TEXT.name] = pack_order_text(tensors)
    for spec, sources in ((ORDER_FIELDS, ORDER_FIELD_SOURCES), (RIDER_FIELDS, RIDER_FIELD_SOURCES)):
        columns = []
        for source, column in sources:
            array = np.asarray(tensors[source], dtype=np.float64)
            columns.append(array[..., column] if column is not None else array.reshape(-1))
        out[spec.name] = np.stack(columns, axis=-1)
    coord = tensors.get("COORD_SYSTEM")
    time_value = np.asarray(tensors["DISPATCH_TIME"]).reshape(-1)
    out[WINDOW_FIELDS.name] = np.array(
        [float(time_value[0]), float(coord_system_code(coord))], dtype=np.float64
    )
    for name in ("OBJECTIVE_WEIGHTS", MODEL_VERSION_TAG.name):
        value = tensors.get(name)
        if value is not None:
            dtype = object if name == MODEL_VERSION_TAG.name else np.float32
            out[name] = np.asarray(value, dtype=dtype).reshape(-1)
    return out


def pack_order_text(tensors: Mapping[str, Any]) -> NDArray[np.object_]:
    """ORDER_TEXT from the logical tensors: the user ids, then the address columns up to the
    last one given (absent ones in between are b""); [B, 1] when no address is given."""
    users = np.asarray(tensors[ORDER_TEXT_SOURCES[0]], dtype=object).reshape(-1)
    columns = [users]
    for name in ORDER_TEXT_SOURCES[1:]:
        value = tensors.get(name)
        columns.append(
            np.full(users.shape, b"", dtype=object)
            if value is None
            else np.asarray(value, dtype=object).reshape(-1)
        )
    while len(columns) > 1 and all(len(item) == 0 for item in columns[-1].tolist()):
        columns.pop()
    out = np.empty((users.shape[0], len(columns)), dtype=object)
    for index, column in enumerate(columns):
        out[:, index] = column
    return out


def coord_system_code(value: Any) -> int:
    """A datum given as a name (str/bytes, any case, "-" ignored) or a code -> its code."""
    if value is None:
        return int(CoordSystem.WGS84)
    item = np.asarray(value).reshape(-1)[0] if not isinstance(value, str | bytes) else value
    if isinstance(item, bytes):
        item = item.decode("utf-8", errors="replace")
    if isinstance(item, str):
        key = item.strip().upper().replace("-", "")
        if key not in CoordSystem.__members__:
            allowed = ", ".join(c.name for c in CoordSystem)
            raise ValueError(f"COORD_SYSTEM must be one of {allowed}, got {item!r}")
        return int(CoordSystem[key])
    return int(CoordSystem(int(item)))


def batched(tensors: Mapping[str, NDArray[Any]]) -> dict[str, NDArray[Any]]:
    """One window's wire tensors with the leading batch dimension of 1 every request carries."""
    return {name: np.asarray(value)[np.newaxis] for name, value in tensors.items()}


def spec_by_name(name: str) -> TensorSpec:
    for spec in (
        *WINDOW_INPUTS,
        *ENCODER_OUTPUTS,
        *MODEL_OUTPUTS,
        *DISPATCH_OUTPUTS,
        *ROUTING_INPUTS,
        *ROUTING_OUTPUTS,
        ORDER_TEXT,
        ORDER_FIELDS,
        RIDER_FIELDS,
        WINDOW_FIELDS,
        TOPK_OBJECTIVES,
        ASSIGNED_OBJECTIVES,
    ):
        if spec.name == name:
            return spec
    raise KeyError(name)


# ---- the feature-level entry point: the `dispatch_features` ensemble ----------------------
# For co-located feature services that already hold pair features: the caller encodes the
# window (layout of the served dispatch_model versions, `v1` above), and the ensemble runs
# the same dispatch_router -> topk_resolver steps as `dispatch`, so canary routing, fallback
# and the answer are those of `dispatch` for the same window. ORDER_TEXT carries the user
# ids the per-user canary routing needs (its address columns are not read: no encoder runs).
FEATURE_ENTRY_MODEL_NAME: Final = "dispatch_features"
FEATURE_ENTRY_INPUTS: Final[tuple[TensorSpec, ...]] = (
    TensorSpec(
        PAIR_FEATURES.name,
        PAIR_FEATURES.triton_dtype,
        PAIR_FEATURES.dims,
        doc="one row per candidate pair, P = B x N rows in CANDIDATE_RIDER_INDEX order",
    ),
    CANDIDATE_RIDER_INDEX,
    ORDER_TEXT,
    _WINDOW_SPECS["RIDER_IDS"],
    RIDER_FIELDS,
    _WINDOW_SPECS["OBJECTIVE_WEIGHTS"],
    *ROUTING_INPUTS,
    replace(
        ORDER_FIELDS,
        optional=True,
        doc="optional, ORDER_FIELD_COLUMNS: with it the resolution is stack-aware, as in "
        "`dispatch` (the resolver reads created_at); without it, stand-alone objectives",
    ),
)
FEATURE_ENTRY_OUTPUTS: Final = (*RESOLVER_OUTPUTS, *ROUTING_OUTPUTS)
