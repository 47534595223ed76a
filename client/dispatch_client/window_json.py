"""A dispatch window as JSON, for people and tools, and the request tensors it stands for.

The wire speaks tensors (`dispatch_contract.contracts.WINDOW_INPUTS`); people and scripts
write JSON. This module maps one onto the other and back, checking only *structure and
types* so that every mistake is reported with the JSON path that holds it. Value rules
(latitude range, capacity >= 0, unique ids, window size, ...) are the server's job, so a
window that parses here may still be refused there, with the server's own message.

Schema (all keys lower case; unknown or repeated keys are errors, so a misspelt optional
key is not silently ignored)::

    {
      "coord_system": "WGS84" | "GCJ02" | "BD09",   # optional, default "WGS84"
      "dispatch_time": 1764400000,                  # unix seconds, integer
      "objective_weights": [0.45, 0.35, 0.20],      # optional: latency, on-time, cost
      "model_version_tag": "canary",                # optional: "stable" | "canary" | a
                                                    # version number (string or integer);
                                                    # forces the dispatch_model version
      "orders": [
        {
          "id": "o-1",                              # string
          "user_id": "u-9",                         # string
          "pickup": [31.2304, 121.4737],            # [lat, lon] numbers; may be left
          "dropoff": [31.2243, 121.4768],           # out where the address is given
          "pickup_address": "徐汇区漕溪北路88号",    # optional: the server geocodes it
          "dropoff_address": "静安寺",              # when pickup / dropoff is left out
          "city": "上海",                            # optional: the addresses' city
          "created_at": 1764399700,                 # unix seconds, integer
          "promised_minutes": 30,                   # number
          "constraints": ["THERMAL_BOX", "FRAGILE"] # optional, default 0: an integer
                                                    # bitmask or a list of names from
                                                    # THERMAL_BOX, LARGE_ITEM, FRAGILE,
                                                    # PRIORITY
        }
      ],
      "riders": [
        {
          "id": "r-1",                              # string
          "position": [31.2310, 121.4700],          # [lat, lon] numbers
          "load": 1,                                # optional, default 0; integer
          "capacity": 3,                            # integer
          "vehicle": "EBIKE",                       # "EBIKE" | "MOTORBIKE" | "CAR" or 0 | 1 | 2
          "equipment": ["THERMAL_BOX"]              # optional, default 0: an integer
                                                    # bitmask or a list of names
        }
      ]
    }

The optional top-level keys are the contract's optional inputs (`OPTIONAL_INPUT_KEYS`):
left out, the server applies its default (weights 0.45/0.35/0.20; routing by user). New
optional inputs (a deadline, a priority) get a key there and one converter each.

Names (coord system, constraints, vehicle, equipment) are case-insensitive. Integers must
fit the tensor's type (INT32 or INT64) and numbers the FP32/FP64 range, since the wire
cannot carry them otherwise. NaN and Infinity are not JSON and are refused.

A broken rule raises `WindowJSONError`, e.g. ``orders[3].pickup: must be [lat, lon]
numbers``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dispatch_client.errors import WindowJSONError
from dispatch_contract import (
    MODEL_VERSION_TAG,
    WINDOW_INPUTS,
    CoordSystem,
    OrderConstraint,
    Vehicle,
)

__all__ = [
    "OPTIONAL_INPUT_KEYS",
    "ROOT",
    "WindowJSONError",
    "window_document",
    "window_from_dict",
    "window_from_json",
    "window_to_dict",
    "window_to_json",
]

ROOT: Final = "window"

_SPECS: Final = {spec.name: spec for spec in (*WINDOW_INPUTS, MODEL_VERSION_TAG)}
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_FP32_MAX: Final = float(np.finfo(np.float32).max)

# RIDER_EQUIPMENT shares the thermal-box bit with ORDER_CONSTRAINTS (contracts: "bit 1").
_EQUIPMENT_BITS: Final = {"THERMAL_BOX": int(OrderConstraint.THERMAL_BOX)}
_CONSTRAINT_BITS: Final = {c.name: int(c) for c in OrderConstraint if c.name is not None}
_VEHICLES: Final = {v.name: int(v) for v in Vehicle}

# Top-level key -> the optional request tensor it fills (absent key: no tensor is sent).
# Deadline and priority inputs, once the contract has them, are added here (and in
# `_OPTIONAL_CONVERTERS`, `window_to_dict` and the CLI's options).
OPTIONAL_INPUT_KEYS: Final = {
    "objective_weights": "OBJECTIVE_WEIGHTS",
    "model_version_tag": MODEL_VERSION_TAG.name,
}
_TOP_FIELDS: Final = ("coord_system", "dispatch_time", *OPTIONAL_INPUT_KEYS, "orders", "riders")
# Optional order keys carried as text tensors (ORDER_TEXT's address columns on the wire).
ADDRESS_KEYS: Final = {
    "pickup_address": "ORDER_PICKUP_ADDRESS",
    "dropoff_address": "ORDER_DROPOFF_ADDRESS",
    "city": "ORDER_CITY",
}
_ORDER_FIELDS: Final = (
    "id",
    "user_id",
    "pickup",
    "dropoff",
    "created_at",
    "promised_minutes",
    "constraints",
    *ADDRESS_KEYS,
)
_REQUIRED_ORDER_FIELDS: Final = ("id", "user_id", "created_at", "promised_minutes")
_NO_POINT: Final = [float("nan"), float("nan")]
_RIDER_FIELDS: Final = ("id", "position", "load", "capacity", "vehicle", "equipment")


# ---- JSON text -> tensors ---------------------------------------------------------------


class _Object(dict[str, Any]):
    """A JSON object that remembers keys it saw twice, so the error can name its path."""

    duplicates: tuple[str, ...] = ()


def _object_hook(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object()
    repeated: list[str] = []
    for key, value in pairs:
        if key in obj:
            repeated.append(key)
        obj[key] = value
    obj.duplicates = tuple(repeated)
    return obj


def _refuse_constant(name: str) -> Any:
    raise WindowJSONError(ROOT, f"{name} is not valid JSON; numbers must be finite")


def window_from_json(text: str | bytes) -> dict[str, NDArray[Any]]:
    """Parse a window document into request tensors (see the module docstring)."""
    return window_from_dict(window_document(text))


def window_document(text: str | bytes) -> Any:
    """Decode a window document's JSON, refusing repeated keys, NaN and Infinity.

    The result goes to `window_from_dict`; in between a caller may set keys (the CLI's
    options do).
    """
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WindowJSONError(ROOT, f"must be UTF-8 text (bad byte at {exc.start})") from None
    try:
        data = json.loads(text, object_pairs_hook=_object_hook, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise WindowJSONError(
            ROOT, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    return data


def window_from_dict(data: Any) -> dict[str, NDArray[Any]]:
    """Turn an already decoded window document into request tensors.

    Keys follow `WINDOW_INPUTS`; an optional tensor (OBJECTIVE_WEIGHTS,
    MODEL_VERSION_TAG) is present only when the document gives its key, so the server
    applies its default otherwise.
    """
    top = _fields(ROOT, data, _TOP_FIELDS, required=("dispatch_time", "orders", "riders"))
    coord = _coord_system("coord_system", top.get("coord_system", CoordSystem.WGS84.name))
    dispatch_time = _integer("dispatch_time", top["dispatch_time"], _INT64)

    orders = [_order_fields(path, item) for path, item in _items("orders", top["orders"])]
    riders = [
        _fields(path, item, _RIDER_FIELDS, required=("id", "position", "capacity", "vehicle"))
        for path, item in _items("riders", top["riders"])
    ]

    def column(
        rows: list[dict[str, Any]],
        prefix: str,
        key: str,
        convert: Callable[[str, Any], Any],
        default: Any = None,
    ) -> list[Any]:
        return [
            convert(f"{prefix}[{i}].{key}", row.get(key, default)) for i, row in enumerate(rows)
        ]

    tensors: dict[str, NDArray[Any]] = {
        "ORDER_IDS": _tensor("ORDER_IDS", column(orders, "orders", "id", _text)),
        "ORDER_USER_IDS": _tensor("ORDER_USER_IDS", column(orders, "orders", "user_id", _text)),
        "ORDER_PICKUP": _tensor(
            "ORDER_PICKUP", column(orders, "orders", "pickup", _latlon, _NO_POINT)
        ),
        "ORDER_DROPOFF": _tensor(
            "ORDER_DROPOFF", column(orders, "orders", "dropoff", _latlon, _NO_POINT)
        ),
        "ORDER_CREATED_AT": _tensor(
            "ORDER_CREATED_AT", column(orders, "orders", "created_at", _int64)
        ),
        "ORDER_PROMISED_MINUTES": _tensor(
            "ORDER_PROMISED_MINUTES", column(orders, "orders", "promised_minutes", _float32)
        ),
        "ORDER_CONSTRAINTS": _tensor(
            "ORDER_CONSTRAINTS", column(orders, "orders", "constraints", _constraints, 0)
        ),
        "RIDER_IDS": _tensor("RIDER_IDS", column(riders, "riders", "id", _text)),
        "RIDER_POSITION": _tensor("RIDER_POSITION", column(riders, "riders", "position", _latlon)),
        "RIDER_LOAD": _tensor("RIDER_LOAD", column(riders, "riders", "load", _int32, 0)),
        "RIDER_CAPACITY": _tensor("RIDER_CAPACITY", column(riders, "riders", "capacity", _int32)),
        "RIDER_VEHICLE": _tensor("RIDER_VEHICLE", column(riders, "riders", "vehicle", _vehicle)),
        "RIDER_EQUIPMENT": _tensor(
            "RIDER_EQUIPMENT", column(riders, "riders", "equipment", _equipment, 0)
        ),
        "COORD_SYSTEM": _tensor("COORD_SYSTEM", [coord.encode("ascii")]),
        "DISPATCH_TIME": _tensor("DISPATCH_TIME", [dispatch_time]),
    }
    for key, name in ADDRESS_KEYS.items():
        if any(key in row for row in orders):  # else the lean wire form: no address columns
            tensors[name] = _tensor(name, column(orders, "orders", key, _text, ""))
    for key, name in OPTIONAL_INPUT_KEYS.items():
        if top.get(key) is not None:
            tensors[name] = _tensor(name, _OPTIONAL_CONVERTERS[key](key, top[key]))
    return tensors


def _order_fields(path: str, item: Any) -> dict[str, Any]:
    """One order's keys; its pickup and drop-off may be left out where the address is given
    (the server geocodes it)."""
    fields = _fields(path, item, _ORDER_FIELDS, required=_REQUIRED_ORDER_FIELDS)
    for end in ("pickup", "dropoff"):
        if end not in fields and not fields.get(f"{end}_address"):
            raise WindowJSONError(f"{path}.{end}", f"is required unless {end}_address is given")
    return fields


def _tensor(name: str, values: list[Any]) -> NDArray[Any]:
    """Build one tensor with the contract's dtype; empty lists keep the row width."""
    spec = _SPECS[name]
    if spec.triton_dtype == "BYTES":
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array
    array = np.array(values, dtype=spec.numpy_dtype)
    if len(spec.dims) == 2:
        array = array.reshape(-1, spec.dims[1])
    return array


def _fields(
    path: str, value: Any, allowed: tuple[str, ...], required: tuple[str, ...]
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WindowJSONError(path, f"must be an object, got {_kind(value)}")
    prefix = "" if path == ROOT else f"{path}."
    duplicates = getattr(value, "duplicates", ())
    if duplicates:
        raise WindowJSONError(f"{prefix}{duplicates[0]}", "is given more than once")
    for key in value:
        if key not in allowed:
            raise WindowJSONError(
                f"{prefix}{key}", f"unknown field; expected one of {', '.join(allowed)}"
            )
    for key in required:
        if key not in value:
            raise WindowJSONError(f"{prefix}{key}", "is required")
    return value


def _items(path: str, value: Any) -> list[tuple[str, Any]]:
    if not isinstance(value, list):
        raise WindowJSONError(path, f"must be a list of objects, got {_kind(value)}")
    return [(f"{path}[{i}]", item) for i, item in enumerate(value)]


def _kind(value: Any) -> str:
    """JSON's own name for a value's type, so messages read in the document's terms."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(path: str, value: Any, bounds: tuple[int, int]) -> int:
    if not _is_int(value):
        raise WindowJSONError(path, f"must be an integer, got {_kind(value)}")
    bits = 32 if bounds == _INT32 else 64
    if not bounds[0] <= value <= bounds[1]:
        raise WindowJSONError(path, f"must fit a {bits}-bit signed integer")
    return int(value)


def _int32(path: str, value: Any) -> int:
    return _integer(path, value, _INT32)


def _int64(path: str, value: Any) -> int:
    return _integer(path, value, _INT64)


def _float64(path: str, value: Any) -> float:
    if not _is_number(value):
        raise WindowJSONError(path, f"must be a number, got {_kind(value)}")
    try:
        return float(value)
    except OverflowError:
        raise WindowJSONError(path, "must be a number within the FP64 range") from None


def _float32(path: str, value: Any) -> float:
    number = _float64(path, value)
    if abs(number) > _FP32_MAX:
        raise WindowJSONError(path, "must be a number within the FP32 range")
    return number


def _text(path: str, value: Any) -> bytes:
    if not isinstance(value, str):
        raise WindowJSONError(path, f"must be a string, got {_kind(value)}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise WindowJSONError(path, "must be valid Unicode (no lone surrogates)") from None


def _latlon(path: str, value: Any) -> list[float]:
    if not (isinstance(value, list) and len(value) == 2 and all(map(_is_number, value))):
        raise WindowJSONError(path, "must be [lat, lon] numbers")
    return [_float64(f"{path}[{i}]", v) for i, v in enumerate(value)]


def _weights(path: str, value: Any) -> list[float]:
    if not (isinstance(value, list) and len(value) == 3 and all(map(_is_number, value))):
        raise WindowJSONError(path, "must be [latency, ontime, cost] numbers")
    return [_float32(f"{path}[{i}]", v) for i, v in enumerate(value)]


def _version_tag(path: str, value: Any) -> list[bytes]:
    """One tag: the server checks its value (stable, canary or a version number >= 1)."""
    if _is_int(value):
        if value < 1:
            raise WindowJSONError(path, "must be 'stable', 'canary' or a version number >= 1")
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise WindowJSONError(
            path, f"must be 'stable', 'canary' or a version number, got {_kind(value)}"
        )
    return [_text(path, value)]


_OPTIONAL_CONVERTERS: Final[dict[str, Callable[[str, Any], list[Any]]]] = {
    "objective_weights": _weights,
    "model_version_tag": _version_tag,
}


def _name(path: str, value: str, known: Mapping[str, int], what: str) -> int:
    key = value.strip().upper()
    if key not in known:
        raise WindowJSONError(
            path, f"unknown {what} {value[:32]!r}; expected one of {', '.join(known)}"
        )
    return known[key]


def _bitmask(path: str, value: Any, known: Mapping[str, int], what: str) -> int:
    """An integer bitmask as is, or the OR of a list of flag names."""
    if _is_int(value):
        return _int32(path, value)
    if isinstance(value, list):
        mask = 0
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise WindowJSONError(f"{path}[{i}]", f"must be a {what} name, got {_kind(item)}")
            mask |= _name(f"{path}[{i}]", item, known, what)
        return mask
    raise WindowJSONError(
        path, f"must be an integer bitmask or a list of {what} names, got {_kind(value)}"
    )


def _constraints(path: str, value: Any) -> int:
    return _bitmask(path, value, _CONSTRAINT_BITS, "constraint")


def _equipment(path: str, value: Any) -> int:
    return _bitmask(path, value, _EQUIPMENT_BITS, "equipment")


def _vehicle(path: str, value: Any) -> int:
    if isinstance(value, str):
        return _name(path, value, _VEHICLES, "vehicle")
    if _is_int(value):
        return _int32(path, value)
    raise WindowJSONError(path, f"must be EBIKE, MOTORBIKE, CAR or 0, 1, 2, got {_kind(value)}")


def _coord_system(path: str, value: Any) -> str:
    if not isinstance(value, str):
        raise WindowJSONError(path, f"must be a string, got {_kind(value)}")
    known = {c.name: int(c) for c in CoordSystem}
    return CoordSystem(_name(path, value, known, "coordinate system")).name


# ---- tensors -> JSON --------------------------------------------------------------------


def window_to_json(tensors: Mapping[str, ArrayLike], *, indent: int | None = 2) -> str:
    """Render request tensors as a window document that `window_from_json` reads back."""
    return json.dumps(window_to_dict(tensors), indent=indent, ensure_ascii=False)


def window_to_dict(tensors: Mapping[str, ArrayLike]) -> dict[str, Any]:
    """Request tensors as a window document (a dict); flags and vehicles become names.

    Raises `WindowJSONError` naming the tensor when one is missing or mis-shaped.
    """
    orders = _rows(
        tensors,
        (
            "ORDER_IDS",
            *(n for n in _SPECS if n.startswith("ORDER_") and not _SPECS[n].optional),
            *(n for n in ADDRESS_KEYS.values() if tensors.get(n) is not None),
        ),
    )
    riders = _rows(tensors, ("RIDER_IDS", *(n for n in _SPECS if n.startswith("RIDER_"))))
    coord = _as_text("COORD_SYSTEM", _column(tensors, "COORD_SYSTEM").reshape(-1)[0])
    time = _column(tensors, "DISPATCH_TIME").reshape(-1)
    document: dict[str, Any] = {"coord_system": coord, "dispatch_time": int(time[0])}
    if tensors.get("OBJECTIVE_WEIGHTS") is not None:
        weights = _column(tensors, "OBJECTIVE_WEIGHTS").reshape(-1)
        document["objective_weights"] = [_short_float(w) for w in weights]
    if tensors.get(MODEL_VERSION_TAG.name) is not None:
        tag = np.asarray(tensors[MODEL_VERSION_TAG.name], dtype=object).reshape(-1)
        if tag.size != 1:
            raise WindowJSONError(MODEL_VERSION_TAG.name, "must hold exactly one value")
        document["model_version_tag"] = _as_text(MODEL_VERSION_TAG.name, tag[0])
    document["orders"] = [_order_document(i, row) for i, row in enumerate(orders)]
    document["riders"] = [
        {
            "id": _as_text(f"RIDER_IDS[{i}]", row["RIDER_IDS"]),
            "position": [float(v) for v in row["RIDER_POSITION"]],
            "load": int(row["RIDER_LOAD"]),
            "capacity": int(row["RIDER_CAPACITY"]),
            "vehicle": _vehicle_name(int(row["RIDER_VEHICLE"])),
            "equipment": _flag_names(int(row["RIDER_EQUIPMENT"]), _EQUIPMENT_BITS),
        }
        for i, row in enumerate(riders)
    ]
    return document


def _column(tensors: Mapping[str, ArrayLike], name: str) -> NDArray[Any]:
    value = tensors.get(name)
    if value is None:
        raise WindowJSONError(name, "is required but missing")
    array = np.asarray(value)
    dims = _SPECS[name].dims
    if array.ndim != len(dims):
        raise WindowJSONError(name, f"must have {len(dims)} dimension(s), got shape {array.shape}")
    if array.ndim == 2 and array.shape[1] != _SPECS[name].dims[1]:
        raise WindowJSONError(name, f"must have {_SPECS[name].dims[1]} columns")
    if name in ("COORD_SYSTEM", "DISPATCH_TIME") and array.size != 1:
        raise WindowJSONError(name, "must hold exactly one value")
    return array


def _order_document(i: int, row: dict[str, Any]) -> dict[str, Any]:
    """One order's keys; a NaN point (to be geocoded) is left out, empty addresses too."""
    order: dict[str, Any] = {
        "id": _as_text(f"ORDER_IDS[{i}]", row["ORDER_IDS"]),
        "user_id": _as_text(f"ORDER_USER_IDS[{i}]", row["ORDER_USER_IDS"]),
    }
    for key, name in (("pickup", "ORDER_PICKUP"), ("dropoff", "ORDER_DROPOFF")):
        point = [float(v) for v in row[name]]
        if not all(map(math.isnan, point)):
            order[key] = point
    order["created_at"] = int(row["ORDER_CREATED_AT"])
    order["promised_minutes"] = _short_float(row["ORDER_PROMISED_MINUTES"])
    order["constraints"] = _flag_names(int(row["ORDER_CONSTRAINTS"]), _CONSTRAINT_BITS)
    for key, name in ADDRESS_KEYS.items():
        text = _as_text(f"{name}[{i}]", row[name]) if name in row else ""
        if text:
            order[key] = text
    return order


def _rows(tensors: Mapping[str, ArrayLike], names: tuple[str, ...]) -> list[dict[str, Any]]:
    """Columns of one entity (orders or riders) zipped into rows, checking their lengths."""
    unique = tuple(dict.fromkeys(names))
    columns = {name: _column(tensors, name) for name in unique}
    count = columns[unique[0]].shape[0]
    for name, array in columns.items():
        if array.shape[0] != count:
            raise WindowJSONError(
                name, f"must have {count} rows like {unique[0]}, got {array.shape[0]}"
            )
    return [{name: columns[name][i] for name in unique} for i in range(count)]


def _as_text(path: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except (TypeError, UnicodeDecodeError):
        raise WindowJSONError(path, "must be UTF-8 text") from None


def _short_float(value: Any) -> float:
    """The shortest decimal that reads back as the same FP32 value (30.0, not 30.000001)."""
    return float(str(np.float32(value)))


def _flag_names(mask: int, known: Mapping[str, int]) -> list[str] | int:
    """Names when every set bit has one, so the output stays readable; else the integer."""
    names = [name for name, bit in known.items() if mask & bit]
    if mask < 0 or sum(known[n] for n in names) != mask:
        return mask
    return names


def _vehicle_name(value: int) -> str | int:
    try:
        return Vehicle(value).name
    except ValueError:
        return value
