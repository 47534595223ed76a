"""Behaviour of dispatch_service.domain.planar, against hand-drawn figures."""

from __future__ import annotations

import numpy as np

from dispatch_service.domain import planar

SQUARE = np.array([[0.0, 0.0], [4.0, 0.0], [4.0, 4.0], [0.0, 4.0], [0.0, 0.0]])
ZIGZAG = np.array([[-10.0, 0.0], [0.0, 1.0], [10.0, -1.0]])  # a line across the plane


def test_a_leg_out_of_a_ring_cuts_it_once_and_through_it_twice() -> None:
    start = np.array([[2.0, 2.0], [-1.0, 2.0], [1.0, 1.0], [-1.0, -1.0]])
    end = np.array([[6.0, 2.0], [6.0, 2.0], [3.0, 3.0], [-1.0, 9.0]])
    np.testing.assert_array_equal(planar.crossing_counts(start, end, SQUARE), [1, 2, 0, 0])


def test_a_leg_through_a_vertex_is_counted_by_which_side_its_ends_are() -> None:
    # Through the corner (4, 4) from inside to outside, and grazing it from outside.
    start = np.array([[3.0, 3.0], [3.0, 5.0]])
    end = np.array([[5.0, 5.0], [5.0, 3.0]])
    assert planar.crossing_counts(start, end, SQUARE)[0] % 2 == 1
    assert planar.crossing_counts(start, end, SQUARE)[1] % 2 == 0


def test_sides_of_an_open_line() -> None:
    start = np.array([[0.0, 5.0], [0.0, 5.0], [-5.0, 3.0]])
    end = np.array([[0.0, -5.0], [3.0, 4.0], [5.0, -3.0]])
    # north to south crosses; north to north does not; the third goes over both bends.
    counts = planar.crossing_counts(start, end, ZIGZAG)
    np.testing.assert_array_equal(counts % 2, [1, 0, 1])
    assert planar.crossing_counts(np.zeros((0, 2)), np.zeros((0, 2)), ZIGZAG).shape == (0,)


def test_inside_polygon() -> None:
    points = np.array([[2.0, 2.0], [5.0, 2.0], [-0.5, 3.0], [3.9, 0.1]])
    np.testing.assert_array_equal(planar.inside_polygon(points, SQUARE), [True, False, False, True])


def test_distance_to_polyline() -> None:
    points = np.array([[2.0, -3.0], [6.0, 4.0], [2.0, 2.0]])
    np.testing.assert_allclose(planar.distance_to_polyline(points, SQUARE), [3.0, 2.0, 2.0])


def test_polygons_overlap() -> None:
    shifted = SQUARE + 3.0
    far = SQUARE + 10.0
    inner = SQUARE * 0.25 + 1.0
    assert planar.polygons_overlap(SQUARE, shifted)
    assert not planar.polygons_overlap(SQUARE, far)
    assert planar.polygons_overlap(SQUARE, inner) and planar.polygons_overlap(inner, SQUARE)


def test_the_inner_box_lies_inside_even_a_concave_ring() -> None:
    notched = np.array([[0.0, 0.0], [6.0, 0.0], [6.0, 6.0], [3.0, 4.0], [0.0, 6.0], [0.0, 0.0]])
    for shape in (SQUARE, notched):
        low_x, low_y, high_x, high_y = planar.inner_box(shape)
        assert low_x < high_x and low_y < high_y
        grid = np.stack(
            np.meshgrid(np.linspace(low_x, high_x, 25), np.linspace(low_y, high_y, 25)), axis=-1
        ).reshape(-1, 2)
        assert planar.inside_polygon(grid, shape).all()
    # A ring whose vertices' mean lies outside it gets no box (each point is tested).
    ell = np.array([[0.0, 0.0], [6.0, 0.0], [6.0, 2.0], [2.0, 2.0], [2.0, 6.0], [0.0, 6.0]])
    low_x, _, high_x, _ = planar.inner_box(np.concatenate((ell, ell[:1])))
    assert low_x > high_x


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
