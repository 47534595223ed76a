"""Plane geometry for city maps: which legs cross a polyline, which points lie in a polygon.

Vectorised over legs and segments (a window has up to 32k rider legs and a map a few dozen
barrier segments). Coordinates are any planar pair: (east_km, north_km) for barriers,
(lat, lon) degrees for service areas, where a city-sized polygon is flat enough.
"""

from __future__ import annotations

from typing import Final

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "FloatArray",
    "crossing_counts",
    "distance_to_polyline",
    "inner_box",
    "inside_polygon",
    "polygons_overlap",
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


def crossing_counts(start: FloatArray, end: FloatArray, polyline: FloatArray) -> NDArray[np.int64]:
    """[L]: how many segments of ``polyline`` [M, 2] the legs start [L, 2] -> end [L, 2] cut.

    The parity of the count tells whether the leg's ends lie on different sides of the
    polyline (of a closed ring: one inside, one outside); see `segment_cuts`.
    """
    if start.shape[0] == 0 or polyline.shape[0] < 2:
        return np.zeros(start.shape[0], dtype=np.int64)
    cuts = segment_cuts(start, end, polyline[:-1], polyline[1:])
    return np.asarray(np.count_nonzero(cuts, axis=1), dtype=np.int64)


def inside_polygon(points: FloatArray, ring: FloatArray) -> NDArray[np.bool_]:
    """[n]: whether each point [n, 2] lies inside the closed ring [V, 2] (first == last).

    Even-odd rule by a ray towards +infinity on the first axis; points exactly on an edge
    may fall either way.
    """
    if points.shape[0] == 0:
        return np.zeros(0, dtype=np.bool_)
    x, y = points[:, None, 0], points[:, None, 1]
    x1, y1 = ring[None, :-1, 0], ring[None, :-1, 1]
    x2, y2 = ring[None, 1:, 0], ring[None, 1:, 1]
    straddles = (y1 > y) != (y2 > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        at = x1 + (y - y1) * (x2 - x1) / (y2 - y1)
    hits = straddles & (x < at)
    return np.asarray(np.count_nonzero(hits, axis=1) % 2 == 1)


def distance_to_polyline(points: FloatArray, polyline: FloatArray) -> FloatArray:
    """[n]: shortest distance of each point [n, 2] to the polyline [M, 2]."""
    p, q = polyline[None, :-1, :], polyline[None, 1:, :]
    x = points[:, None, :]
    d = q - p
    length2 = np.sum(d * d, axis=-1)
    t = np.clip(np.sum((x - p) * d, axis=-1) / np.maximum(length2, 1e-300), 0.0, 1.0)
    nearest = p + t[..., None] * d
    return np.asarray(np.min(np.linalg.norm(x - nearest, axis=-1), axis=1))


def inner_box(ring: FloatArray, steps: int = 40) -> FloatArray:
    """[4] (low x, low y, high x, high y): a box inside the closed ring, around its
    vertices' mean, shrunk from the ring's bounding box until no edge of the ring cuts it
    and its corners lie inside (then every point of the box does). Empty (low > high) when
    none is found: a caller then tests each point."""
    lo, hi = ring.min(axis=0), ring.max(axis=0)
    middle = ring[:-1].mean(axis=0)
    for step in range(1, steps + 1):
        half = (hi - lo) * 0.5 * (1.0 - step / steps)
        box_lo, box_hi = middle - half, middle + half
        corners = np.array([box_lo, [box_hi[0], box_lo[1]], box_hi, [box_lo[0], box_hi[1]], box_lo])
        if inside_polygon(corners[:-1], ring).all() and not (
            crossing_counts(corners[:-1], corners[1:], ring).any()
        ):
            return np.concatenate((box_lo, box_hi))
    return np.array([1.0, 1.0, 0.0, 0.0])


def polygons_overlap(first: FloatArray, second: FloatArray) -> bool:
    """Whether two closed rings share any area: an edge of one cuts an edge of the other,
    or one lies inside the other."""
    edges = crossing_counts(first[:-1], first[1:], second)
    if bool(edges.any()):
        return True
    return bool(inside_polygon(first[:1], second)[0] or inside_polygon(second[:1], first)[0])
