"""Behaviour of dispatch_service.domain.planar, against hand-drawn figures."""

from __future__ import annotations

import numpy as np
import shapely

from dispatch_service.domain import planar

SQUARE = np.array([[0.0, 0.0], [4.0, 0.0], [4.0, 4.0], [0.0, 4.0], [0.0, 0.0]])
ZIGZAG = np.array([[-10.0, 0.0], [0.0, 1.0], [10.0, -1.0]])  # a line across the plane


def _counts(start: np.ndarray, end: np.ndarray, polyline: np.ndarray) -> np.ndarray:
    """How many segments of ``polyline`` each leg cuts."""
    return planar.segment_cuts(start, end, polyline[:-1], polyline[1:]).sum(axis=1)


def test_a_leg_out_of_a_ring_cuts_it_once_and_through_it_twice() -> None:
    start = np.array([[2.0, 2.0], [-1.0, 2.0], [1.0, 1.0], [-1.0, -1.0]])
    end = np.array([[6.0, 2.0], [6.0, 2.0], [3.0, 3.0], [-1.0, 9.0]])
    np.testing.assert_array_equal(_counts(start, end, SQUARE), [1, 2, 0, 0])


def test_a_leg_through_a_vertex_is_counted_by_which_side_its_ends_are() -> None:
    # Through the corner (4, 4) from inside to outside, and grazing it from outside.
    start = np.array([[3.0, 3.0], [3.0, 5.0]])
    end = np.array([[5.0, 5.0], [5.0, 3.0]])
    assert _counts(start, end, SQUARE)[0] % 2 == 1
    assert _counts(start, end, SQUARE)[1] % 2 == 0


def test_sides_of_an_open_line() -> None:
    start = np.array([[0.0, 5.0], [0.0, 5.0], [-5.0, 3.0]])
    end = np.array([[0.0, -5.0], [3.0, 4.0], [5.0, -3.0]])
    # north to south crosses; north to north does not; the third goes over both bends.
    counts = _counts(start, end, ZIGZAG)
    np.testing.assert_array_equal(counts % 2, [1, 0, 1])
    assert _counts(np.zeros((0, 2)), np.zeros((0, 2)), ZIGZAG).shape == (0,)


def test_the_cuts_agree_with_shapelys_intersections() -> None:
    """On random legs against a zigzag and a ring, the number of segments a leg cuts is the
    number of points where shapely finds it meets the line (GEOS, not this module)."""
    rng = np.random.default_rng(5)
    for line in (ZIGZAG, SQUARE):
        start, end = rng.uniform(-12.0, 12.0, (400, 2)), rng.uniform(-12.0, 12.0, (400, 2))
        legs = shapely.linestrings(np.stack((start, end), axis=1))
        met = shapely.get_num_coordinates(shapely.intersection(legs, shapely.LineString(line)))
        np.testing.assert_array_equal(_counts(start, end, line), met)


def test_kept_segment_lines_give_the_same_cuts() -> None:
    """A map keeps its segments' lines (`segment_lines`); passing them changes nothing, also
    for legs through the vertices, along the segments and of zero length."""
    rng = np.random.default_rng(0)
    seg_start, seg_end = SQUARE[:-1], SQUARE[1:]
    points = np.concatenate((SQUARE, rng.uniform(-2.0, 6.0, (40, 2)), [[2.0, 0.0], [4.0, 2.0]]))
    start = points[rng.integers(0, points.shape[0], 300)]
    end = np.concatenate((points[rng.integers(0, points.shape[0], 299)], start[:1]))
    lines = planar.segment_lines(seg_start, seg_end)
    np.testing.assert_array_equal(
        planar.segment_cuts(start, end, seg_start, seg_end, lines),
        planar.segment_cuts(start, end, seg_start, seg_end),
    )
    # through the corner (4, 4) from inside out: exactly one of its two segments is cut
    cuts = planar.segment_cuts(np.array([[3.0, 3.0]]), np.array([[5.0, 5.0]]), seg_start, seg_end)
    assert int(cuts.sum()) == 1
