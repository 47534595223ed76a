"""dispatch_service.offline.profiling: the per-operator table from an ONNX Runtime trace."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatch_service.core.repository_layout import ENCODER_MODEL, SCORING_MODEL, model_layout
from dispatch_service.domain.features import EncoderSettings
from dispatch_service.offline.profiling import (
    OperatorTime,
    RunTime,
    format_table,
    main,
    operator_table,
    profile_model,
    run_time,
)


def node(op: str, ts: int, dur: int, name: str | None = None) -> dict[str, Any]:
    return {
        "cat": "Node",
        "name": f"{name or op}_kernel_time",
        "ts": ts,
        "dur": dur,
        "ph": "X",
        "args": {"op_name": op, "provider": "CPUExecutionProvider"},
    }


def session(name: str, ts: int, dur: int) -> dict[str, Any]:
    return {"cat": "Session", "name": name, "ts": ts, "dur": dur, "ph": "X", "args": {}}


# Two runs of a three-node graph, as ONNX Runtime writes them (plus noise to ignore).
TRACE: list[dict[str, Any]] = [
    session("model_loading_uri", 0, 50),
    session("session_initialization", 60, 900),
    node("Gemm", 1000, 300, "fused_a"),
    node("Relu", 1310, 20),
    node("Gemm", 1340, 100, "Gemm_2"),
    {"cat": "Node", "name": "Gemm_2_fence_before", "ts": 1339, "dur": 1, "args": {}},
    session("SequentialExecutor::Execute", 995, 450),
    session("model_run", 990, 470),
    node("Gemm", 2000, 60, "fused_a"),
    node("Relu", 2070, 10),
    node("Gemm", 2090, 30, "Gemm_2"),
    session("model_run", 1995, 140),
]


def test_operator_table_sums_kernel_time_per_op_type() -> None:
    rows = operator_table(TRACE)
    assert [(r.op_type, r.count, r.total_us) for r in rows] == [
        ("Gemm", 4, 490),
        ("Relu", 2, 30),
    ]
    assert rows[0].share == pytest.approx(490 / 520)
    assert rows[1].share == pytest.approx(30 / 520)
    assert rows[0].mean_us == pytest.approx(122.5)
    assert sum(r.share for r in rows) == pytest.approx(1.0)


def test_warm_up_runs_are_left_out() -> None:
    rows = operator_table(TRACE, skip_runs=1)
    assert [(r.op_type, r.count, r.total_us) for r in rows] == [("Gemm", 2, 90), ("Relu", 1, 10)]
    assert run_time(TRACE) == RunTime(2, 610)
    assert run_time(TRACE, skip_runs=1) == RunTime(1, 140)
    assert operator_table(TRACE, skip_runs=5) == []
    assert run_time(TRACE, skip_runs=5) == RunTime(0, 0)


def test_ties_are_ordered_by_name_and_an_empty_trace_gives_an_empty_table() -> None:
    rows = operator_table([node("Sub", 1, 5), node("Add", 2, 5)])
    assert [r.op_type for r in rows] == ["Add", "Sub"]
    assert operator_table([]) == []
    assert RunTime(0, 0).mean_us == 0.0


def test_format_table_is_markdown_with_the_run_total() -> None:
    text = format_table(operator_table(TRACE), run_time(TRACE))
    lines = text.splitlines()
    assert lines[0] == "| op type | count | total us | mean us | share |"
    assert lines[2] == "| Gemm | 4 | 490 | 122.5 | 94.2 % |"
    assert lines[3] == "| Relu | 2 | 30 | 15.0 | 5.8 % |"
    assert lines[-1] == "2 runs, model_run 610 us in all (mean 305.0 us); operators 520 us"
    assert format_table([OperatorTime("X", 0, 0, 0.0)], RunTime(0, 0)).count("| X | 0 | 0 |") == 1


def test_profile_model_profiles_real_runs(tmp_path: Path, contract_model: Path) -> None:
    result = profile_model(
        contract_model,
        tmp_path / "out",
        windows=3,
        orders=4,
        riders=10,
        warmup=1,
        encoder=EncoderSettings(candidates_per_order=4),
    )
    assert result.trace.parent == tmp_path / "out" and result.trace.suffix == ".json"
    assert result.runs.runs == 3
    assert result.pairs_per_run == 16.0
    # the contract model: Gemm -> Relu -> Gemm -> Sigmoid -> Mul, possibly fused
    ops = {row.op_type for row in result.rows}
    assert ops and ops <= {"Gemm", "FusedGemm", "Relu", "Sigmoid", "Mul"}
    assert sum(row.count for row in result.rows) % 3 == 0  # every node in every counted run
    assert isinstance(json.loads(result.trace.read_text()), list)


def test_main_writes_the_report(
    tmp_path: Path, contract_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repository = tmp_path / "repo"
    scoring = model_layout(repository, SCORING_MODEL)
    encoder = model_layout(repository, ENCODER_MODEL)
    scoring.version(1).mkdir(parents=True)
    encoder.folder.mkdir()
    scoring.onnx(1).write_bytes(contract_model.read_bytes())
    scoring.config.write_text(
        'name: "dispatch_model"\n'
        'parameters [ { key: "intra_op_num_threads", value: { string_value: "1" } } ]\n'
    )
    encoder.config.write_text(
        'name: "feature_encoder"\n'
        'parameters [ { key: "candidates_per_order", value: { string_value: "3" } } ]\n'
    )
    args = ["--repository", str(repository), "--reports", str(tmp_path / "reports")]
    code = main([*args, "--windows", "2", "--orders", "5", "--riders", "8", "--warmup", "0"])
    assert code == 0
    (out_dir,) = (tmp_path / "reports").iterdir()
    assert out_dir.name.startswith("profile-")
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["runs"]["runs"] == 2 and summary["pairs_per_run"] == 15.0
    assert (out_dir / summary["trace"]).is_file()
    assert "| op type | count | total us | mean us | share |" in capsys.readouterr().out
    assert "| op type |" in (out_dir / "operators.md").read_text()
    assert main(["--repository", str(tmp_path / "nowhere")]) == 1
