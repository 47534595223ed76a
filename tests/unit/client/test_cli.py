"""`dispatch-client` end to end with an in-memory transport: output, exit codes, one-line errors."""

from __future__ import annotations

import http.server
import io
import json
import threading
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from dispatch_client.cli import EXIT_INPUT, EXIT_OK, EXIT_SERVER, main
from dispatch_client.connect import ProtocolName, make_transport
from dispatch_client.errors import DispatchConnectionError, DispatchServerError
from dispatch_client.retry import DEFAULT_RETRY
from dispatch_client.transport import WRONG_PORT_HINTS, Transport
from dispatch_contract.version import product_version

Array = np.ndarray[Any, Any]
EXAMPLE = Path(__file__).resolve().parents[3] / "client" / "examples" / "window_small.json"


class FakeServer:
    """A transport factory whose transport answers like `dispatch` (Top-1 = first rider)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.request_ids: list[str] = []
        self.error = error
        self.built: list[tuple[str, str | None, float]] = []
        self.models: list[str] = []
        self.inputs: list[dict[str, Array]] = []
        self.closed = 0

    def __call__(self, protocol: ProtocolName, url: str | None, timeout_s: float) -> Transport:
        self.built.append((protocol, url, timeout_s))
        return self

    def infer(
        self,
        model_name: str,
        inputs: dict[str, Array],
        output_names: Sequence[str],
        *,
        request_id: str = "",
    ) -> dict[str, Array]:
        self.request_ids.append(request_id)
        self.models.append(model_name)
        self.inputs.append(inputs)
        if self.error is not None:
            raise self.error
        n = inputs["ORDER_IDS"].shape[1]  # [1, B]: one window per request (contract v2)
        objectives = np.zeros((n, 2, 4), np.float32)  # score, ETA, on-time, cost
        objectives[:, 0] = [0.5, 20, 0.9, 7]
        answer = {
            "TOPK_RIDER_INDEX": np.array([[0, -1]] * n, np.int32),
            "TOPK_OBJECTIVES": objectives,
            "ASSIGNED_RIDER_INDEX": np.array([0] + [-1] * (n - 1), np.int32),
            "ASSIGNED_SCORE": np.array([0.5] + [0.0] * (n - 1), np.float32),
        }
        return {name: value[np.newaxis] for name, value in answer.items()}

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
    assert server.inputs[0]["ORDER_FIELDS"][0, :, 6].tolist() == [1, 4, 0]  # constraints column
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


@pytest.mark.parametrize(
    ("url", "address", "tls"),
    [
        ("localhost:8000", "localhost:8000", False),
        ("http://localhost:8000", "localhost:8000", False),
        ("HTTP://localhost:8000/", "localhost:8000", False),
        ("https://triton.example:443", "triton.example:443", True),
    ],
)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_urls_take_an_http_or_https_scheme(
    url: str, address: str, tls: bool, protocol: str
) -> None:
    # The real transports: building one does not connect, so no network here.
    transport = make_transport(protocol, url)  # type: ignore[arg-type]
    assert (transport.url, transport.tls) == (address, tls)  # type: ignore[attr-defined]
    transport.close()


@pytest.mark.parametrize(
    "url",
    [
        "ftp://localhost:8000",
        "http://localhost:8000/v2",
        "http://",
        "127.0.0.1",
        "http://127.0.0.1",
        "localhost:99999",
    ],
)
def test_other_urls_are_bad_input(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", url, str(EXAMPLE)]) == EXIT_INPUT
    assert one_error_line(capsys.readouterr().err) == (
        f"--url: url must be host:port, http://host:port or https://host:port, got {url!r}"
    )


def test_grpc_shm_refuses_tls(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="server on this host"):
        make_transport("grpc-shm", "https://localhost:8001")


def test_optional_inputs_from_options_win_over_the_document(
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = FakeServer()
    argv = ["--weights", "0.5,0.3,0.2", "--version-tag", "canary", str(EXAMPLE)]
    assert main(argv, transport_factory=server) == EXIT_OK
    sent = server.inputs[0]
    assert sent["OBJECTIVE_WEIGHTS"][0].tolist() == pytest.approx([0.5, 0.3, 0.2])
    assert sent["MODEL_VERSION_TAG"].tolist() == [[b"canary"]]  # batch of 1


def test_optional_inputs_from_the_document(tmp_path: Path) -> None:
    doc = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    doc["model_version_tag"] = 2
    path = tmp_path / "w.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    server = FakeServer()
    assert main([str(path)], transport_factory=server) == EXIT_OK
    assert server.inputs[0]["MODEL_VERSION_TAG"].tolist() == [[b"2"]]
    assert server.inputs[0]["OBJECTIVE_WEIGHTS"][0].tolist() == pytest.approx([0.45, 0.35, 0.2])
    # Without the keys or options nothing optional is sent: the server's defaults apply.
    del doc["model_version_tag"], doc["objective_weights"]
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert main([str(path)], transport_factory=server) == EXIT_OK
    assert "MODEL_VERSION_TAG" not in server.inputs[1]
    assert "OBJECTIVE_WEIGHTS" not in server.inputs[1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--weights", "0.5,0.5"], "--weights: objective_weights: must be [latency, ontime"),
        (["--weights", "a,b,c"], "argument --weights: must be comma-separated numbers"),
        (["--version-tag", " "], "--version-tag: model_version_tag: must be 'stable', 'canary'"),
        (["--request-id", ""], "argument --request-id: must be printable, non-empty text"),
    ],
)
def test_bad_options_are_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server = FakeServer()
    assert main([*argv, str(EXAMPLE)], transport_factory=server) == EXIT_INPUT
    assert one_error_line(capsys.readouterr().err).startswith(message)
    assert server.built == []


def test_every_request_carries_a_request_id(capsys: pytest.CaptureFixture[str]) -> None:
    server = FakeServer()
    assert main(["--request-id", "caller-7", str(EXAMPLE)], transport_factory=server) == 0
    assert main([str(EXAMPLE)], transport_factory=server) == 0
    assert main([str(EXAMPLE)], transport_factory=server) == 0
    given, fresh, other = server.request_ids
    assert given == "caller-7"
    assert len(fresh) == 32 and int(fresh, 16) >= 0 and fresh != other


@pytest.mark.parametrize(
    ("status", "code"),
    [
        ("400", EXIT_INPUT),
        ("StatusCode.INVALID_ARGUMENT", EXIT_INPUT),
        ("404", EXIT_SERVER),
        ("StatusCode.NOT_FOUND", EXIT_SERVER),
        ("500", EXIT_SERVER),
        ("StatusCode.UNAVAILABLE", EXIT_SERVER),
        (None, EXIT_SERVER),
    ],
)
def test_the_server_refusing_the_input_exits_2_like_the_client_refusing_it(
    status: str | None, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    server = FakeServer(error=DispatchServerError("ORDER_PICKUP: latitude must be ...", status))
    argv = ["--request-id", "r-1", "--retries", "0", str(EXAMPLE)]
    assert main(argv, transport_factory=server) == code
    assert one_error_line(capsys.readouterr().err) == (
        "ORDER_PICKUP: latitude must be ... (request id r-1)"
    )


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (
            DispatchServerError("model 'dispatch' is not\nready", "StatusCode.UNAVAILABLE"),
            "model 'dispatch' is not ready (sent 3 times) (request id r-9)",
        ),
        (
            DispatchConnectionError("cannot reach localhost:8000 over HTTP: Connection refused"),
            "cannot reach localhost:8000 over HTTP: Connection refused (sent 3 times) "
            "(request id r-9)",
        ),
        (RuntimeError("boom\nsecond line"), "unexpected RuntimeError: boom second line"),
    ],
)
def test_server_and_connection_errors_are_one_line_and_exit_1(
    error: Exception, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server = FakeServer(error=error)
    assert main(["--request-id", "r-9", str(EXAMPLE)], transport_factory=server) == EXIT_SERVER
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
    text = " ".join(out.split())
    for default in (
        "(default: localhost:8000 for http, localhost:8001 for grpc and grpc-shm)",
        "(default: http)",
        "(default: dispatch)",
        "(default: 60)",
        "'-' reads stdin (default: -)",
        "default: a fresh 32-hex-digit id",
        "https://host:port (TLS",
        "--weights L,O,C",
        "--version-tag TAG",
        "Exit codes: 0 success; 2 invalid input",
    ):
        assert default in text, default


def test_a_refusal_without_work_is_sent_again_as_often_as_retries_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    refusal = DispatchServerError("Exceeds maximum queue size", "StatusCode.UNAVAILABLE")
    for retries, sends in (("0", 1), ("1", 2), (None, DEFAULT_RETRY.attempts)):
        server = FakeServer(error=refusal)
        option = [] if retries is None else ["--retries", retries]
        assert main([*option, "--request-id", "r-2", str(EXAMPLE)], transport_factory=server) == 1
        assert server.request_ids == ["r-2"] * sends  # one request, sent again under its id
        tries = f" (sent {sends} times)" if sends > 1 else ""
        assert one_error_line(capsys.readouterr().err) == (
            f"Exceeds maximum queue size{tries} (request id r-2)"
        )


@pytest.mark.parametrize("value", ["-1", "10"])
def test_retries_out_of_range_is_a_usage_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server = FakeServer()
    assert main(["--retries", value, str(EXAMPLE)], transport_factory=server) == EXIT_INPUT
    assert one_error_line(capsys.readouterr().err) == f"--retries: must be within 0..9, got {value}"
    assert server.request_ids == []


def test_version_prints_the_product_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == EXIT_OK  # not an abbreviation of --version-tag
    assert capsys.readouterr().out == f"dispatch-client {product_version()}\n"


def test_http_sent_to_a_grpc_port_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))  # a real gRPC server
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert main(["--url", f"127.0.0.1:{port}", "--retries", "0", str(EXAMPLE)]) == 1
    finally:
        server.stop(None)
    assert WRONG_PORT_HINTS["http"] in one_error_line(capsys.readouterr().err)


def test_grpc_sent_to_an_http_port_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)  # a real HTTP server
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"127.0.0.1:{server.server_address[1]}"
    try:
        args = ["--protocol", "grpc", "--url", url, "--retries", "0", "--timeout", "5"]
        assert main([*args, str(EXAMPLE)]) == 1
    finally:
        server.shutdown()
        server.server_close()
    assert WRONG_PORT_HINTS["grpc"] in one_error_line(capsys.readouterr().err)
