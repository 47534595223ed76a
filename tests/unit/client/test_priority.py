"""Priorities and deadlines: what the client sends, and what it refuses before sending."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatch_client.cli import EXIT_INPUT, main
from dispatch_client.client import DispatchClient
from dispatch_client.priority import BULK, PREMIUM, STANDARD, PriorityMap
from dispatch_client.window_json import window_from_dict

Array = np.ndarray[Any, Any]
EXAMPLE = Path(__file__).resolve().parents[3] / "client" / "examples" / "window_small.json"


class Options:
    """A transport that answers an empty K and remembers each call's options."""

    def __init__(self) -> None:
        self.options: list[dict[str, Any]] = []
        self.models: list[str] = []

    def infer(
        self,
        model_name: str,
        inputs: dict[str, Array],
        output_names: Sequence[str],
        *,
        request_id: str = "",
        **options: Any,
    ) -> dict[str, Array]:
        self.options.append(options)
        self.models.append(model_name)
        n = inputs["ORDER_IDS"].shape[1]
        answer = {
            "TOPK_RIDER_INDEX": np.full((n, 1), -1, np.int32),
            "TOPK_OBJECTIVES": np.zeros((n, 1, 4), np.float32),
            "ASSIGNED_RIDER_INDEX": np.full(n, -1, np.int32),
            "ASSIGNED_SCORE": np.zeros(n, np.float32),
        }
        return {name: value[np.newaxis] for name, value in answer.items()}

    def close(self) -> None:
        pass


def window(users: Sequence[str], constraints: Sequence[int] | None = None) -> dict[str, Array]:
    orders = [
        {
            "id": f"o{i}",
            "user_id": user,
            "pickup": [31.23, 121.47],
            "dropoff": [31.22, 121.48],
            "created_at": 1764399700,
            "promised_minutes": 30,
            "constraints": 0 if constraints is None else constraints[i],
        }
        for i, user in enumerate(users)
    ]
    riders = [{"id": "r", "position": [31.23, 121.47], "capacity": 2, "vehicle": "EBIKE"}]
    return window_from_dict({"dispatch_time": 1764400000, "orders": orders, "riders": riders})


KEY = "the-priority-key"
TENANTS = PriorityMap(default=STANDARD, tenants={"premium-co": PREMIUM, "redispatch": BULK})


def test_nothing_set_sends_no_options_so_the_model_defaults_apply() -> None:
    transport = Options()
    DispatchClient(transport).dispatch(window(["u"]))
    assert transport.options == [{}]


def test_the_most_urgent_order_sets_the_window_level() -> None:
    transport = Options()
    client = DispatchClient(transport, priorities=TENANTS, priority_key=KEY)
    client.dispatch(window(["redispatch"]))
    client.dispatch(window(["redispatch", "someone"]))
    client.dispatch(window(["redispatch", "premium-co"]))
    client.dispatch(window(["redispatch"], constraints=[8]))  # a PRIORITY order
    # Level 1 goes to the lane, at the lane's default level.
    assert [o.get("priority") for o in transport.options] == [BULK, STANDARD, None, None]
    assert transport.models == ["dispatch", "dispatch", "dispatch_priority", "dispatch_priority"]


def test_level_1_windows_go_to_the_priority_lane_and_the_others_to_the_entry_point() -> None:
    transport = Options()
    client = DispatchClient(
        transport, model_name="dispatch_fused", priorities=TENANTS, priority_key=KEY
    )
    client.dispatch(window(["redispatch"]))
    client.dispatch(window(["premium-co"]))
    client.dispatch(window(["someone"], constraints=[8]))  # a PRIORITY order
    client.dispatch(window(["someone"]))
    assert transport.models == [
        "dispatch_fused",
        "dispatch_priority",
        "dispatch_priority",
        "dispatch_fused",
    ]
    assert [o.get("priority") for o in transport.options] == [BULK, None, None, STANDARD]
    # The key goes only to the lane.
    assert [o.get("priority_key") for o in transport.options] == [None, KEY, KEY, None]
    DispatchClient(transport, priority=PREMIUM, priority_key=KEY).dispatch(window(["u"]))
    DispatchClient(transport).dispatch(window(["u"], constraints=[8]))  # no level asked for
    assert transport.models[4:] == ["dispatch_priority", "dispatch"]


def test_without_the_priority_key_a_level_1_window_goes_out_at_level_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Level 1 is an entitlement: without the key a client sends its level-1 windows at
    level 2 to its entry point (the lane would refuse them)."""
    monkeypatch.delenv("DISPATCH_PRIORITY_KEY", raising=False)
    monkeypatch.delenv("DISPATCH_PRIORITY_KEY_FILE", raising=False)
    transport = Options()
    DispatchClient(transport, priority=PREMIUM).dispatch(window(["u"]))
    assert transport.models == ["dispatch"] and transport.options == [{"priority": STANDARD}]
    # The key from the environment, or from the file it names (mode 0600).
    monkeypatch.setenv("DISPATCH_PRIORITY_KEY", "from-env")
    DispatchClient(transport, priority=PREMIUM).dispatch(window(["u"]))
    monkeypatch.delenv("DISPATCH_PRIORITY_KEY")
    key_file = tmp_path / "priority.key"
    key_file.write_text("from-file\n")
    key_file.chmod(0o600)
    monkeypatch.setenv("DISPATCH_PRIORITY_KEY_FILE", str(key_file))
    DispatchClient(transport, priority=PREMIUM).dispatch(window(["u"]))
    assert transport.models[1:] == ["dispatch_priority", "dispatch_priority"]
    assert [o.get("priority_key") for o in transport.options[1:]] == ["from-env", "from-file"]


def test_without_a_lane_a_level_1_window_goes_to_the_entry_point() -> None:
    transport = Options()
    client = DispatchClient(transport, priority=PREMIUM, priority_lane=None, priority_key=KEY)
    client.dispatch(window(["u"]))
    assert transport.models == ["dispatch"] and transport.options == [{"priority": PREMIUM}]


def test_a_fixed_priority_and_a_deadline_reach_the_transport() -> None:
    transport = Options()
    client = DispatchClient(transport, priority=BULK, deadline_ms=2.5, priorities=TENANTS)
    client.dispatch(window(["premium-co"]))  # the fixed level wins over the map
    assert transport.options == [{"priority": BULK, "timeout_us": 2500}]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"deadline_ms": 0}, "deadline_ms must be within"),
        ({"deadline_ms": -5}, "deadline_ms must be within"),
        ({"deadline_ms": float("nan")}, "deadline_ms must be within"),
        ({"deadline_ms": 86_400_000}, r"deadline_ms must be within \(0, 60000\]"),
        ({"priority": 0}, "priority must be 1 .* 2 .* or 3"),
        ({"priority": 4}, r"priority must be 1 .* or 3 \(bulk\), got 4"),
    ],
)
def test_a_bad_deadline_or_level_is_refused_naming_it(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DispatchClient(Options(), **kwargs)


def test_the_priority_map_file_is_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "tenants.json"
    path.write_text(json.dumps({"default": 3, "tenants": {"vip": 1}}))
    loaded = PriorityMap.from_file(path)
    assert loaded.default == BULK and loaded.level_of(window(["vip"])) == PREMIUM
    path.write_text(json.dumps({"default": 2, "tenants": {"vip": 7}}))
    with pytest.raises(ValueError, match=r"tenants\['vip'\] must be 1 .* got 7"):
        PriorityMap.from_file(path)
    path.write_text(json.dumps({"deflt": 2}))
    with pytest.raises(ValueError, match="unknown priority map key"):
        PriorityMap.from_file(path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--deadline-ms", "0"], "error: --deadline-ms: deadline_ms must be within"),
        (["--priority", "9"], "error: --priority: priority must be 1"),
        (["--priority-map", "/nonexistent.json"], "error: --priority-map: priority map"),
    ],
)
def test_the_cli_refuses_bad_options_before_sending(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sent: list[str] = []

    def factory(*args: Any) -> Any:
        sent.append("built")
        return Options()

    assert main([*argv, str(EXAMPLE)], transport_factory=factory) == EXIT_INPUT
    assert capsys.readouterr().err.startswith(message)
    assert sent == []


def test_the_cli_sends_the_deadline_and_the_level(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    transport = Options()
    key_file = tmp_path / "priority.key"
    key_file.write_text(KEY)
    key_file.chmod(0o600)
    code = main(
        [
            "--deadline-ms",
            "150",
            "--priority",
            "1",
            "--priority-key-file",
            str(key_file),
            str(EXAMPLE),
        ],
        transport_factory=lambda *args: transport,
    )
    assert code == 0
    assert transport.options == [{"timeout_us": 150_000, "priority_key": KEY}]
    assert transport.models == ["dispatch_priority"]
    code = main(
        [
            "--priority",
            "1",
            "--priority-key-file",
            str(key_file),
            "--priority-lane",
            "",
            "--model",
            "dispatch_fused",
            str(EXAMPLE),
        ],
        transport_factory=lambda *args: transport,
    )
    assert code == 0 and transport.models[1:] == ["dispatch_fused"]
