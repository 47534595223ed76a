"""`dispatch-client` end to end with an in-memory transport: output, exit codes, one-line errors."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatch_client.cli import EXIT_INPUT, EXIT_OK, EXIT_SERVER, main
from dispatch_client.connect import ProtocolName
from dispatch_client.errors import DispatchConnectionError, DispatchServerError
from dispatch_client.transport import Transport

Array = np.ndarray[Any, Any]
EXAMPLE = Path(__file__).resolve().parents[3] / "client" / "examples" / "window_small.json"


class FakeServer:
    """A transport factory whose transport answers like `dispatch` (Top-1 = first rider)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error
        self.built: list[tuple[str, str | None, float]] = []
        self.models: list[str] = []
        self.inputs: list[dict[str, Array]] = []
        self.closed = 0

    def __call__(self, protocol: ProtocolName, url: str | None, timeout_s: float) -> Transport:
        self.built.append((protocol, url, timeout_s))
        return self

    def infer(
        self, model_name: str, inputs: dict[str, Array], output_names: Sequence[str]
    ) -> dict[str, Array]:
        self.models.append(model_name)
        self.inputs.append(inputs)
        if self.error is not None:
            raise self.error
        n = len(inputs["ORDER_IDS"])
        first = inputs["RIDER_IDS"][0]
        return {
            "TOPK_RIDER_IDS": np.array([[first, b""]] * n, dtype=object),
            "TOPK_RIDER_INDEX": np.array([[0, -1]] * n, np.int32),
            "TOPK_SCORE": np.full((n, 2), 0.5, np.float32),
            "TOPK_ETA_MINUTES": np.full((n, 2), 20, np.float32),
            "TOPK_ONTIME_PROBABILITY": np.full((n, 2), 0.9, np.float32),
            "TOPK_COST": np.full((n, 2), 7, np.float32),
            "ASSIGNED_RIDER_IDS": np.array([first] + [b""] * (n - 1), dtype=object),
            "ASSIGNED_RIDER_INDEX": np.array([0] + [-1] * (n - 1), np.int32),
            "ASSIGNED_SCORE": np.array([0.5] + [0.0] * (n - 1), np.float32),
        }

    def close(self) -> None:
        self.closed += 1


def one_error_line(err: str) -> str:
    assert err.startswith("error: "), err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err[len("error: ") : -1]


def test_prints_the_result_json(capsys: pytest.CaptureFixture[str]) -> None:
    server = FakeServer()
    code = main([str(EXAMPLE)], transport_factory=server)
    out, err = capsys.readouterr()

    assert code == EXIT_OK
    assert err == ""
    result = json.loads(out)
    assert [o["order_id"] for o in result["orders"]] == ["order-1001", "order-1002", "order-1003"]
    assert result["orders"][0]["assigned_rider_id"] == "rider-a"
    assert result["orders"][0]["top_k"] == [
        {
            "rider_id": "rider-a",
            "score": 0.5,
            "eta_minutes": 20.0,
            "ontime_probability": 0.9,
            "cost": 7.0,
        }
    ]
    assert result["orders"][1]["assigned_rider_id"] is None
    assert server.built == [("http", None, 60.0)]
    assert server.models == ["dispatch"]
    assert server.inputs[0]["ORDER_CONSTRAINTS"].tolist() == [1, 4, 0]
    assert server.closed == 1


def test_options_reach_the_transport_and_model(capsys: pytest.CaptureFixture[str]) -> None:
    server = FakeServer()
    argv = ["--protocol", "grpc", "--url", "triton:9001", "--model", "dispatch_b", "--timeout"]
    code = main([*argv, "2.5", str(EXAMPLE)], transport_factory=server)

    assert code == EXIT_OK
    assert server.built == [("grpc", "triton:9001", 2.5)]
    assert server.models == ["dispatch_b"]


@pytest.mark.parametrize("argv", [["-"], []])
def test_reads_stdin(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = EXAMPLE.read_bytes()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8"))
    assert main(argv, transport_factory=FakeServer()) == EXIT_OK
    assert len(json.loads(capsys.readouterr().out)["orders"]) == 3


def test_reads_a_text_only_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(EXAMPLE.read_text(encoding="utf-8")))
    assert main(["-"], transport_factory=FakeServer()) == EXIT_OK
    assert json.loads(capsys.readouterr().out)["orders"][2]["order_id"] == "order-1003"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "<stdin>: window: invalid JSON at line 1 column 2: "),
        ("", "<stdin>: window: invalid JSON at line 1 column 1: Expecting value"),
        ('{"dispatch_time": 1, "orders": [], "riders": 5}', "<stdin>: riders: must be a list"),
        (
            '{"dispatch_time": 1, "riders": [], "orders": [{"id": "a", "user_id": "u",'
            ' "pickup": [1], "dropoff": [1, 2], "created_at": 1, "promised_minutes": 1}]}',
            "<stdin>: orders[0].pickup: must be [lat, lon] numbers",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    text: str,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = FakeServer()
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    code = main([], transport_factory=server)
    out, err = capsys.readouterr()

    assert code == EXIT_INPUT
    assert out == ""
    assert one_error_line(err).startswith(message)
    assert server.built == []  # nothing sent


def test_bad_field_in_a_file_names_file_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    doc["riders"][4]["vehicle"] = "TRUCK"
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc), encoding="utf-8")

    assert main([str(path)], transport_factory=FakeServer()) == EXIT_INPUT
    assert one_error_line(capsys.readouterr().err) == (
        f"{path}: riders[4].vehicle: unknown vehicle 'TRUCK'; expected one of EBIKE, MOTORBIKE, CAR"
    )


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "nope.json"
    assert main([str(path)], transport_factory=FakeServer()) == EXIT_INPUT
    assert one_error_line(capsys.readouterr().err) == (
        f"cannot read {path}: No such file or directory"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--protocol", "ftp"], "argument --protocol: invalid choice: 'ftp'"),
        (["--timeout", "0"], "argument --timeout: must be > 0 seconds, got '0'"),
        (["--timeout", "soon"], "argument --timeout: must be a number of seconds, got 'soon'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["a.json", "b.json"], "unrecognized arguments: b.json"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv, transport_factory=FakeServer()) == EXIT_INPUT
    out, err = capsys.readouterr()
    assert out == ""
    line = one_error_line(err)
    assert line.startswith(message)
    assert line.endswith("(see dispatch-client --help)")


def test_url_with_scheme_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    # The real factory: building a transport does not connect, so no network here.
    assert main(["--url", "http://localhost:8000", str(EXAMPLE)]) == EXIT_INPUT
    assert one_error_line(capsys.readouterr().err) == (
        "--url: url must be host:port without a scheme, got 'http://localhost:8000'"
    )


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            DispatchServerError(
                "in ensemble 'dispatch', ORDER_PICKUP: latitude must be within [-90.0, 90.0]\n"
                "(row 3)",
                "400",
            ),
            "in ensemble 'dispatch', ORDER_PICKUP: latitude must be within [-90.0, 90.0] (row 3)",
        ),
        (
            DispatchConnectionError("cannot reach localhost:8000 over HTTP: Connection refused"),
            "cannot reach localhost:8000 over HTTP: Connection refused",
        ),
        (RuntimeError("boom\nsecond line"), "unexpected RuntimeError: boom second line"),
    ],
)
def test_server_and_connection_errors_are_one_line_and_exit_1(
    error: Exception, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server = FakeServer(error=error)
    assert main([str(EXAMPLE)], transport_factory=server) == EXIT_SERVER
    out, err = capsys.readouterr()
    assert out == ""
    assert one_error_line(err) == message
    assert server.closed == 1


def test_help_goes_to_stdout_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert out.startswith("usage: dispatch-client")
    assert "--protocol {http,grpc,grpc-shm}" in out
    assert err == ""
