"""`make perf`: its report names only the tools the run used and its real duration."""

from __future__ import annotations

import pytest

from perf import run_perf_analyzer
from perf.report import render_report
from perf.results import BenchResults, Series


def tools_line(results: BenchResults) -> str:
    [line] = [ln for ln in render_report(results).splitlines() if ln.startswith("Tools:")]
    return line


def test_a_perf_analyzer_sweep_names_perf_analyzer_and_triton_only() -> None:
    results = BenchResults("s", "gRPC sweep (make perf)", host={"perf_analyzer": "pa 2.51"})
    results.series.append(Series("grpc", "small"))
    results.duration_s = 42.4
    line = tools_line(results)
    assert "pa 2.51" in line and "Triton" in line
    assert "locust" not in line and "loadgen" not in line
    assert "Duration 42 s." in render_report(results)


def test_a_bench_with_every_tool_names_them_all() -> None:
    results = BenchResults("s", "full", host={"perf_analyzer": "pa", "locust": "2.1"})
    results.series += [Series("grpc", "small"), Series("fastapi_json", "small")]
    results.locust = {"users": 8}
    line = tools_line(results)
    assert "pa" in line and "perf.loadgen" in line and "locust 2.1" in line


@pytest.mark.parametrize(
    "argv",
    [["--grpc-port", "9001"], ["--url", "h:1", "--http-port", "1", "--grpc-port", "2",
                               "--metrics-port", "3"]],
)  # fmt: skip
def test_fixed_ports_come_as_three_and_never_with_a_url(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        run_perf_analyzer.main(argv)
    assert info.value.code == 2
    assert "go together, without --url" in capsys.readouterr().err
