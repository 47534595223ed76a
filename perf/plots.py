"""PNG plots of a benchmark (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

from perf.results import ENTRY_POINTS, FUSED_MODEL, BenchResults, EntryPoint

__all__ = [
    "plot_size",
]

_STYLES = (("p50_ms", "-", "p50"), ("p95_ms", "--", "p95"), ("p99_ms", ":", "p99"))
# One hue per transport (matplotlib's tab20 pairs): the dispatch ensemble in the dark shade
# with round markers, dispatch_fused in the light shade with square markers.
_HUES = ("grpc", "grpc_shm", "http_binary", "http_json", "fastapi_json", "fastapi_arrays")


def _look(entry: EntryPoint) -> tuple[int, str]:
    """(tab20 color index, marker) of an entry point's lines."""
    fused = entry.model == FUSED_MODEL
    hue = _HUES.index(entry.transport) if entry.transport in _HUES else len(_HUES)
    return 2 * hue + int(fused), "s" if fused else "o"


def plot_size(results: BenchResults, size: str, path: Path) -> None:
    """Latency (p50/p95/p99) and throughput against concurrency, one line per entry point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (latency, throughput) = plt.subplots(1, 2, figsize=(13, 4.8))
    info = results.windows.get(size, {})
    figure.suptitle(
        f"{size} windows ({info.get('orders', '?')} orders x {info.get('riders', '?')} riders)"
        f" - {results.stamp}, {results.mode} run"
    )
    colors = matplotlib.colormaps["tab20"]
    for entry in ENTRY_POINTS.values():
        series = results.find(entry.key, size)
        if series is None or not series.rows:
            continue
        rows = sorted(series.rows, key=lambda row: row.concurrency)
        xs = [row.concurrency for row in rows]
        shade, marker = _look(entry)
        color = colors(shade)
        for field, style, name in _STYLES:
            latency.plot(
                xs,
                [getattr(row, field) for row in rows],
                linestyle=style,
                marker=marker if name == "p50" else None,
                color=color,
                label=entry.label if name == "p50" else None,
            )
        throughput.plot(
            xs,
            [row.throughput_per_s for row in rows],
            marker=marker,
            color=color,
            label=entry.label,
        )
    stats = results.limits.get(size)
    if stats is not None:
        latency.axhline(
            stats.single.p50_ms, color="black", linestyle="-.", label="in-process p50 (1 thread)"
        )
        throughput.axhline(
            stats.multi_windows_per_s,
            color="black",
            linestyle="-.",
            label=f"in-process limit ({stats.processes} processes)",
        )
    levels = sorted(
        {row.concurrency for s in results.series if s.size == size for row in s.rows} or {1}
    )
    for axis in (latency, throughput):
        axis.set_xscale("log", base=2)
        axis.set_xticks(levels, [str(level) for level in levels])
        axis.minorticks_off()
        axis.set_xlabel("concurrency (requests in flight)")
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize=7)
    latency.set_yscale("log")
    latency.set_ylabel("latency, ms (p50 solid, p95 dashed, p99 dotted)")
    throughput.set_ylabel("windows per second")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
