"""Which of a window's legs cut which barrier segments: the one piece of plane geometry on
the encoder's request path that is not shapely's.

A leg crosses a barrier when it cuts an odd number of the barrier's segments (the
project's rule, `domain.roads`; a barrier may end inside the area, as a river at its
confluence, so "which side" is not enough). Here every leg is tested against every segment
of a city's map at once, in a few matrix products over (east_km, north_km). shapely has no
vectorised count of a line's crossings: building a small window's 21 legs as geometries and
querying an STRtree of Beijing's 21 segments took 3.4 times this module's CPU time (123 vs
36 us), and a per-leg `intersection` is one GEOS call per leg and barrier. Service areas,
their overlaps, the crossings' distance to their course and the registry's schema are
shapely's and pydantic's (`domain.cities`, `domain.registry_file`).
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "FloatArray",
    "segment_cuts",
    "segment_lines",
]

FloatArray = NDArray[np.float64]
_CLOCKWISE: Final = np.array([1.0, -1.0])


def segment_lines(seg_start: FloatArray, seg_end: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Each segment's line as `segment_cuts` tests sides of it: ([S, 2] normals, [1, S]
    offsets). A map's segments are fixed: computed once when the map is read."""
    seg_normal = np.stack((seg_end[:, 1] - seg_start[:, 1], seg_start[:, 0] - seg_end[:, 0]), 1)
    seg_offset = np.sum(seg_normal * seg_start, axis=1)[None, :]
    return seg_normal, seg_offset


def segment_cuts(
    start: FloatArray,
    end: FloatArray,
    seg_start: FloatArray,
    seg_end: FloatArray,
    lines: tuple[FloatArray, FloatArray] | None = None,
) -> NDArray[np.bool_]:
    """[L, S]: whether leg l (start [L, 2] -> end [L, 2]) cuts segment s ([S, 2] -> [S, 2]).

    Each side test is half-open (a point on a line counts as right of it), so a leg through
    the vertex shared by two segments cuts exactly one of them. Each side is the sign of a
    cross product, written as products with the lines' normals so that the [L, S] tables
    take a few matrix products rather than a broadcast per term. ``lines``: the segments'
    `segment_lines`, when the caller keeps them (the same values either way).
    """
    # (end - start) turned clockwise: (dy, -dx), exactly the differences (end_y - start_y,
    # start_x - end_x) as IEEE subtraction is symmetric, in one multiplication
    leg_normal = (end - start)[:, ::-1] * _CLOCKWISE
    leg_offset = np.add.reduce(leg_normal * start, axis=1)[:, None]  # np.sum, without its wrapper
    seg_normal, seg_offset = segment_lines(seg_start, seg_end) if lines is None else lines
    # left of a -> b means a negative normal product (normal = direction turned clockwise)
    p_left = leg_normal @ seg_start.T < leg_offset
    q_left = leg_normal @ seg_end.T < leg_offset
    a_left = start @ seg_normal.T < seg_offset
    b_left = end @ seg_normal.T < seg_offset
    return np.asarray((p_left != q_left) & (a_left != b_left))
