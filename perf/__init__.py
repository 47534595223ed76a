"""Capacity measurements of the dispatch service: perf_analyzer, load loops, references.

`make bench` runs `perf.bench`; `make perf` runs `perf.run_perf_analyzer`. Pure helpers
(input-data files, CSV parsing, statistics, ratios, report rendering) are unit-tested in
tests/unit/test_bench.py; nothing here is imported by the service itself.
"""
