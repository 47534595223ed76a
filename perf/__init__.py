"""Capacity measurements of the dispatch service: perf_analyzer, load loops, references.

`make bench` runs `perf.bench`; `make bench-overload` runs `perf.overload_bench` (open-loop
overload on separate cores); `make perf` runs `perf.run_perf_analyzer`. Pure helpers
(input-data files, CSV parsing, statistics, ratios, report rendering) are unit-tested in
tests/unit/perf_harness/; nothing here is imported by the service itself. The modules are
scripts and their helpers, imported by module name: nothing is re-exported here.
"""

__all__: list[str] = []
