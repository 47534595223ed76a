"""Window JSON <-> request tensors: contract dtypes and shapes, names, and error paths."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatch_client.window_json import (
    WindowJSONError,
    window_from_dict,
    window_from_json,
    window_to_dict,
    window_to_json,
)
from dispatch_contract import WINDOW_INPUTS, OrderConstraint, Vehicle

EXAMPLE = Path(__file__).resolve().parents[3] / "client" / "examples" / "window_small.json"


def base_window() -> dict[str, Any]:
    """Four orders and three riders, every optional field left out."""
    return {
        "dispatch_time": 1764400000,
        "orders": [
            {
                "id": f"o{i}",
                "user_id": "u1",
                "pickup": [31.23, 121.47],
                "dropoff": [31.22, 121.48],
                "created_at": 1764399700,
                "promised_minutes": 30,
            }
            for i in range(4)
        ],
        "riders": [
            {"id": f"r{i}", "position": [31.231, 121.471], "capacity": 3, "vehicle": "EBIKE"}
            for i in range(3)
        ],
    }


def parse(doc: Any) -> dict[str, np.ndarray[Any, Any]]:
    return window_from_json(json.dumps(doc))


# ---- the happy path ----------------------------------------------------------------------


def test_example_file_matches_the_contract_dtypes_and_shapes() -> None:
    tensors = window_from_json(EXAMPLE.read_text(encoding="utf-8"))

    given = [spec for spec in WINDOW_INPUTS if spec.name in tensors]
    # every required tensor; of the optional ones the weights (the file gives no address)
    assert [spec.name for spec in given] == [
        spec.name for spec in WINDOW_INPUTS if not spec.optional or spec.name == "OBJECTIVE_WEIGHTS"
    ]
    sizes = {"ORDER": 3, "RIDER": 6}
    for spec in given:
        array = tensors[spec.name]
        assert array.dtype == spec.numpy_dtype, spec.name
        assert array.ndim == len(spec.dims), spec.name
        for axis, dim in enumerate(spec.dims):
            if dim != -1:
                assert array.shape[axis] == dim, spec.name
        entity = spec.name.split("_")[0]
        if entity in sizes:
            assert array.shape[0] == sizes[entity], spec.name
    for name in ("ORDER_IDS", "ORDER_USER_IDS", "RIDER_IDS", "COORD_SYSTEM"):
        assert all(isinstance(v, bytes) for v in tensors[name].tolist()), name
    assert tensors["DISPATCH_TIME"].tolist() == [1764400000]
    assert tensors["COORD_SYSTEM"].tolist() == [b"WGS84"]


def test_example_file_passes_the_servers_gate() -> None:
    from dispatch_service.domain.window import window_from_tensors

    window = window_from_tensors(window_from_json(EXAMPLE.read_bytes()))
    assert window.num_orders == 3
    assert window.num_riders == 6


def test_defaults_fill_optional_fields_and_leave_out_weights() -> None:
    tensors = parse(base_window())

    assert "OBJECTIVE_WEIGHTS" not in tensors  # the server applies its defaults
    assert tensors["COORD_SYSTEM"].tolist() == [b"WGS84"]
    assert tensors["ORDER_CONSTRAINTS"].tolist() == [0, 0, 0, 0]
    assert tensors["RIDER_LOAD"].tolist() == [0, 0, 0]
    assert tensors["RIDER_EQUIPMENT"].tolist() == [0, 0, 0]
    assert tensors["ORDER_PICKUP"].shape == (4, 2)
    assert tensors["ORDER_PROMISED_MINUTES"].dtype == np.float32


def test_constraint_and_equipment_names_become_bitmasks() -> None:
    doc = base_window()
    doc["orders"][0]["constraints"] = ["THERMAL_BOX", "FRAGILE"]
    doc["orders"][1]["constraints"] = ["large_item", "Priority", "PRIORITY"]
    doc["orders"][2]["constraints"] = 5
    doc["orders"][3]["constraints"] = []
    doc["riders"][0]["equipment"] = ["THERMAL_BOX"]
    doc["riders"][1]["equipment"] = 1
    tensors = parse(doc)

    assert tensors["ORDER_CONSTRAINTS"].tolist() == [
        OrderConstraint.THERMAL_BOX | OrderConstraint.FRAGILE,
        OrderConstraint.LARGE_ITEM | OrderConstraint.PRIORITY,
        5,
        0,
    ]
    assert tensors["RIDER_EQUIPMENT"].tolist() == [1, 1, 0]


def test_vehicles_by_name_or_number_and_coord_system_case_insensitive() -> None:
    doc = base_window()
    doc["coord_system"] = "gcj02"
    doc["riders"][0]["vehicle"] = "car"
    doc["riders"][1]["vehicle"] = 1
    doc["riders"][2]["vehicle"] = "MOTORBIKE"
    tensors = parse(doc)

    assert tensors["COORD_SYSTEM"].tolist() == [b"GCJ02"]
    assert tensors["RIDER_VEHICLE"].tolist() == [Vehicle.CAR, Vehicle.MOTORBIKE, Vehicle.MOTORBIKE]


def test_weights_ids_and_bytes_input() -> None:
    doc = base_window()
    doc["objective_weights"] = [1, 0, 0.5]
    doc["orders"][0]["id"] = "订单-1"
    tensors = window_from_json(json.dumps(doc, ensure_ascii=False).encode("utf-8"))

    assert tensors["OBJECTIVE_WEIGHTS"].dtype == np.float32
    assert tensors["OBJECTIVE_WEIGHTS"].tolist() == [1.0, 0.0, 0.5]
    assert tensors["ORDER_IDS"][0] == "订单-1".encode()


def test_empty_lists_keep_the_row_width() -> None:
    doc = base_window()
    doc["orders"] = []
    tensors = parse(doc)  # "at least one order" is the server's rule

    assert tensors["ORDER_IDS"].shape == (0,)
    assert tensors["ORDER_PICKUP"].shape == (0, 2)
    assert tensors["ORDER_CONSTRAINTS"].dtype == np.int32


def test_value_ranges_are_left_to_the_server() -> None:
    doc = base_window()
    doc["orders"][0]["pickup"] = [999, -999]
    doc["orders"][1]["id"] = "o0"  # duplicate
    doc["orders"][2]["promised_minutes"] = 0
    doc["riders"][0]["capacity"] = -1
    doc["riders"][1]["vehicle"] = 7
    doc["riders"][2]["equipment"] = 64
    tensors = parse(doc)

    assert tensors["ORDER_PICKUP"][0].tolist() == [999.0, -999.0]
    assert tensors["RIDER_CAPACITY"][0] == -1
    assert tensors["RIDER_VEHICLE"][1] == 7


# ---- tensors -> JSON ---------------------------------------------------------------------


def test_window_to_json_round_trips() -> None:
    tensors = window_from_json(EXAMPLE.read_text(encoding="utf-8"))
    again = window_from_json(window_to_json(tensors))

    assert list(again) == list(tensors)
    for name, array in tensors.items():
        assert again[name].dtype == array.dtype, name
        assert again[name].tolist() == array.tolist(), name


def test_window_to_dict_uses_names_where_it_can() -> None:
    doc = base_window()
    doc["orders"][0]["constraints"] = ["THERMAL_BOX", "PRIORITY"]
    doc["orders"][1]["constraints"] = 64  # no name for this bit: stays a number
    doc["objective_weights"] = [0.45, 0.35, 0.2]
    doc["riders"][0]["equipment"] = ["THERMAL_BOX"]
    doc["riders"][1]["vehicle"] = 9
    out = window_to_dict(parse(doc))

    assert out["objective_weights"] == [0.45, 0.35, 0.2]  # FP32 shown at its shortest
    assert out["orders"][0]["constraints"] == ["THERMAL_BOX", "PRIORITY"]
    assert out["orders"][1]["constraints"] == 64
    assert out["orders"][2]["constraints"] == []
    assert out["orders"][0]["promised_minutes"] == 30.0
    assert out["riders"][0]["vehicle"] == "EBIKE"
    assert out["riders"][0]["equipment"] == ["THERMAL_BOX"]
    assert out["riders"][1]["vehicle"] == 9
    assert out["coord_system"] == "WGS84"


def test_window_to_dict_accepts_str_ids() -> None:
    tensors: dict[str, Any] = dict(parse(base_window()))
    tensors["ORDER_IDS"] = np.array(["a", "b", "c", "d"], dtype=object)
    assert [o["id"] for o in window_to_dict(tensors)["orders"]] == ["a", "b", "c", "d"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.pop("RIDER_CAPACITY"), "RIDER_CAPACITY: is required but missing"),
        (
            lambda t: t.update(ORDER_CREATED_AT=np.zeros(2, np.int64)),
            "ORDER_CREATED_AT: must have 4 rows like ORDER_IDS, got 2",
        ),
        (
            lambda t: t.update(RIDER_POSITION=np.zeros(3)),
            "RIDER_POSITION: must have 2 dimension(s), got shape (3,)",
        ),
        (
            lambda t: t.update(DISPATCH_TIME=np.array([1, 2], np.int64)),
            "DISPATCH_TIME: must hold exactly one value",
        ),
        (
            lambda t: t.update(ORDER_IDS=np.array([b"\xff", b"a", b"b", b"c"], dtype=object)),
            "ORDER_IDS[0]: must be UTF-8 text",
        ),
    ],
)
def test_window_to_dict_names_the_broken_tensor(
    change: Callable[[dict[str, Any]], object], message: str
) -> None:
    tensors: dict[str, Any] = dict(parse(base_window()))
    change(tensors)
    with pytest.raises(WindowJSONError) as info:
        window_to_dict(tensors)
    assert str(info.value) == message


# ---- malformed documents: each error names its field path ---------------------------------


def _set(path: tuple[Any, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


def _drop(path: tuple[Any, ...]) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        target: Any = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return change


KNOWN_CONSTRAINTS = "THERMAL_BOX, LARGE_ITEM, FRAGILE, PRIORITY"

MALFORMED: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("missing dispatch_time", _drop(("dispatch_time",)), "dispatch_time: is required"),
    (
        "float dispatch_time",
        _set(("dispatch_time",), 1764400000.5),
        "dispatch_time: must be an integer, got a number",
    ),
    (
        "bool dispatch_time",
        _set(("dispatch_time",), True),
        "dispatch_time: must be an integer, got a boolean",
    ),
    (
        "huge dispatch_time",
        _set(("dispatch_time",), 2**63),
        "dispatch_time: must fit a 64-bit signed integer",
    ),
    ("unknown top field", _set(("orderz",), []), "orderz: unknown field; expected one of"),
    ("coord not text", _set(("coord_system",), 1), "coord_system: must be a string, got a number"),
    (
        "coord unknown",
        _set(("coord_system",), "UTM"),
        "coord_system: unknown coordinate system 'UTM'; expected one of WGS84, GCJ02, BD09",
    ),
    (
        "two weights",
        _set(("objective_weights",), [1, 2]),
        "objective_weights: must be [latency, ontime, cost] numbers",
    ),
    (
        "text weight",
        _set(("objective_weights",), [1, "2", 3]),
        "objective_weights: must be [latency, ontime, cost] numbers",
    ),
    ("orders missing", _drop(("orders",)), "orders: is required"),
    (
        "orders an object",
        _set(("orders",), {}),
        "orders: must be a list of objects, got an object",
    ),
    ("order a string", _set(("orders", 1), "o1"), "orders[1]: must be an object, got a string"),
    ("pickup missing", _drop(("orders", 3, "pickup")), "orders[3].pickup: is required"),
    (
        "pickup one number",
        _set(("orders", 3, "pickup"), [31.2]),
        "orders[3].pickup: must be [lat, lon] numbers",
    ),
    (
        "pickup as text",
        _set(("orders", 3, "pickup"), ["31.2", 121.4]),
        "orders[3].pickup: must be [lat, lon] numbers",
    ),
    (
        "pickup booleans",
        _set(("orders", 3, "pickup"), [True, 1]),
        "orders[3].pickup: must be [lat, lon] numbers",
    ),
    (
        "dropoff an object",
        _set(("orders", 2, "dropoff"), {"lat": 1, "lon": 2}),
        "orders[2].dropoff: must be [lat, lon] numbers",
    ),
    (
        "pickup beyond FP64",
        _set(("orders", 0, "pickup"), [10**400, 1]),
        "orders[0].pickup[0]: must be a number within the FP64 range",
    ),
    ("id a number", _set(("orders", 0, "id"), 17), "orders[0].id: must be a string, got a number"),
    (
        "user id null",
        _set(("orders", 1, "user_id"), None),
        "orders[1].user_id: must be a string, got null",
    ),
    (
        "created_at text",
        _set(("orders", 2, "created_at"), "now"),
        "orders[2].created_at: must be an integer, got a string",
    ),
    (
        "promised text",
        _set(("orders", 0, "promised_minutes"), "30"),
        "orders[0].promised_minutes: must be a number, got a string",
    ),
    (
        "promised beyond FP32",
        _set(("orders", 0, "promised_minutes"), 1e39),
        "orders[0].promised_minutes: must be a number within the FP32 range",
    ),
    (
        "constraints a bare name",
        _set(("orders", 1, "constraints"), "FRAGILE"),
        "orders[1].constraints: must be an integer bitmask or a list of constraint names, "
        "got a string",
    ),
    (
        "constraint unknown",
        _set(("orders", 1, "constraints"), ["FRAGILE", "HOT"]),
        f"orders[1].constraints[1]: unknown constraint 'HOT'; expected one of {KNOWN_CONSTRAINTS}",
    ),
    (
        "constraint a number in a list",
        _set(("orders", 1, "constraints"), [1]),
        "orders[1].constraints[0]: must be a constraint name, got a number",
    ),
    (
        "constraints beyond INT32",
        _set(("orders", 1, "constraints"), 2**31),
        "orders[1].constraints: must fit a 32-bit signed integer",
    ),
    (
        "misspelt optional field",
        _set(("orders", 0, "constraint"), ["THERMAL_BOX"]),
        "orders[0].constraint: unknown field; expected one of id, user_id, pickup",
    ),
    ("riders missing", _drop(("riders",)), "riders: is required"),
    ("capacity missing", _drop(("riders", 2, "capacity")), "riders[2].capacity: is required"),
    ("vehicle missing", _drop(("riders", 0, "vehicle")), "riders[0].vehicle: is required"),
    (
        "vehicle unknown",
        _set(("riders", 0, "vehicle"), "TRUCK"),
        "riders[0].vehicle: unknown vehicle 'TRUCK'; expected one of EBIKE, MOTORBIKE, CAR",
    ),
    (
        "vehicle a float",
        _set(("riders", 1, "vehicle"), 1.5),
        "riders[1].vehicle: must be EBIKE, MOTORBIKE, CAR or 0, 1, 2, got a number",
    ),
    (
        "load text",
        _set(("riders", 1, "load"), "1"),
        "riders[1].load: must be an integer, got a string",
    ),
    (
        "capacity float",
        _set(("riders", 1, "capacity"), 2.0),
        "riders[1].capacity: must be an integer, got a number",
    ),
    (
        "equipment unknown",
        _set(("riders", 2, "equipment"), ["FRAGILE"]),
        "riders[2].equipment[0]: unknown equipment 'FRAGILE'; expected one of THERMAL_BOX",
    ),
    (
        "position missing",
        _drop(("riders", 1, "position")),
        "riders[1].position: is required",
    ),
    (
        "position three numbers",
        _set(("riders", 1, "position"), [1, 2, 3]),
        "riders[1].position: must be [lat, lon] numbers",
    ),
]


@pytest.mark.parametrize(
    ("change", "message"), [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED]
)
def test_malformed_field_names_its_path_and_rule(
    change: Callable[[dict[str, Any]], None], message: str
) -> None:
    doc = copy.deepcopy(base_window())
    change(doc)
    with pytest.raises(WindowJSONError) as info:
        parse(doc)
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "window: invalid JSON at line 1 column 2: "),
        ("", "window: invalid JSON at line 1 column 1: Expecting value"),
        ('{"dispatch_time": 1,\n "orders": [}', "window: invalid JSON at line 2 column 13: "),
        ("[]", "window: must be an object, got a list"),
        ("null", "window: must be an object, got null"),
        ('{"dispatch_time": NaN}', "window: NaN is not valid JSON; numbers must be finite"),
        ('{"dispatch_time": -Infinity}', "window: -Infinity is not valid JSON"),
        (
            '{"dispatch_time": 1, "dispatch_time": 2, "orders": [], "riders": []}',
            "dispatch_time: is given more than once",
        ),
        (
            '{"dispatch_time": 1, "riders": [], "orders": [{"id": "a", "id": "b"}]}',
            "orders[0].id: is given more than once",
        ),
        (
            '{"dispatch_time": 1, "riders": [], "orders": [{"id": "\\ud800", "user_id": "u",'
            ' "pickup": [1, 2], "dropoff": [1, 2], "created_at": 1, "promised_minutes": 1}]}',
            "orders[0].id: must be valid Unicode (no lone surrogates)",
        ),
    ],
)
def test_malformed_json_text(text: str, message: str) -> None:
    with pytest.raises(WindowJSONError) as info:
        window_from_json(text)
    assert str(info.value).startswith(message)


def test_invalid_utf8_bytes() -> None:
    with pytest.raises(WindowJSONError, match=r"^window: must be UTF-8 text \(bad byte at 1\)"):
        window_from_json(b'{\xff"dispatch_time": 1}')


def test_error_is_a_value_error_carrying_path_and_rule() -> None:
    doc = base_window()
    doc["orders"][3]["pickup"] = "here"
    with pytest.raises(ValueError) as info:
        window_from_dict(doc)
    error = info.value
    assert isinstance(error, WindowJSONError)
    assert error.path == "orders[3].pickup"
    assert error.rule == "must be [lat, lon] numbers"
    assert str(error) == "orders[3].pickup: must be [lat, lon] numbers"


@pytest.mark.parametrize(("tag", "sent"), [("canary", b"canary"), ("stable", b"stable"), (2, b"2")])
def test_a_model_version_tag_becomes_the_routing_input_and_round_trips(
    tag: Any, sent: bytes
) -> None:
    doc = base_window()
    doc["model_version_tag"] = tag
    tensors = parse(doc)
    assert tensors["MODEL_VERSION_TAG"].shape == (1,)
    assert tensors["MODEL_VERSION_TAG"].tolist() == [sent]
    assert window_to_dict(tensors)["model_version_tag"] == sent.decode()
    assert "MODEL_VERSION_TAG" not in parse(base_window())  # left out: the router decides


@pytest.mark.parametrize("tag", [0, -1, "", " ", 1.5, ["canary"], True])
def test_a_model_version_tag_of_the_wrong_kind_is_refused_with_its_key(tag: Any) -> None:
    doc = base_window()
    doc["model_version_tag"] = tag
    with pytest.raises(WindowJSONError, match="model_version_tag: must be 'stable', 'canary'"):
        parse(doc)


# ---- orders with addresses instead of coordinates ---------------------------------------------


def test_addresses_become_optional_text_tensors_and_missing_points_nan() -> None:
    doc = base_window()
    del doc["orders"][1]["pickup"]
    doc["orders"][1]["pickup_address"] = "徐汇区漕溪北路88号"
    doc["orders"][1]["city"] = "上海"
    doc["orders"][2]["dropoff_address"] = "静安寺"  # with coordinates too: they win
    tensors = parse(doc)
    assert np.isnan(tensors["ORDER_PICKUP"][1]).all()
    assert np.isfinite(tensors["ORDER_PICKUP"][[0, 2, 3]]).all()
    assert tensors["ORDER_PICKUP_ADDRESS"].tolist() == [
        b"",
        "徐汇区漕溪北路88号".encode(),
        b"",
        b"",
    ]
    assert tensors["ORDER_DROPOFF_ADDRESS"].tolist() == [b"", b"", "静安寺".encode(), b""]
    assert tensors["ORDER_CITY"].tolist() == [b"", "上海".encode(), b"", b""]
    back = window_to_dict(tensors)["orders"]
    assert "pickup" not in back[1] and back[1]["pickup_address"] == "徐汇区漕溪北路88号"
    assert back[2]["dropoff_address"] == "静安寺" and "pickup_address" not in back[0]
    assert parse(window_to_dict(tensors))["ORDER_CITY"].tolist() == tensors["ORDER_CITY"].tolist()


def test_a_window_without_addresses_sends_no_address_tensors() -> None:
    tensors = parse(base_window())
    assert not {"ORDER_PICKUP_ADDRESS", "ORDER_DROPOFF_ADDRESS", "ORDER_CITY"} & set(tensors)


@pytest.mark.parametrize("end", ["pickup", "dropoff"])
def test_a_point_may_be_left_out_only_when_its_address_is_given(end: str) -> None:
    doc = base_window()
    del doc["orders"][2][end]
    with pytest.raises(WindowJSONError) as caught:
        parse(doc)
    assert str(caught.value) == f"orders[2].{end}: is required unless {end}_address is given"


def test_an_address_must_be_a_string() -> None:
    doc = base_window()
    doc["orders"][0]["city"] = 310000
    with pytest.raises(WindowJSONError, match=r"orders\[0\]\.city: must be a string"):
        parse(doc)
