"""The training package's road columns against the simulator's own geometry."""

from __future__ import annotations

import numpy as np
import pytest

from dispatch_contract import NUM_PAIR_FEATURES, PAIR_FEATURE_NAMES, PAIR_FEATURES
from dispatch_service.offline import simulator, training
from dispatch_service.offline.training.data import F32
from dispatch_service.offline.training.road import ROAD_FEATURES, RoadMap, road_columns


def _rows(points: dict[str, F32]) -> F32:
    """Feature rows whose zone columns hold the given (east, north) points, the rest noise."""
    rng = np.random.default_rng(5)
    n = len(next(iter(points.values())))
    x = rng.standard_normal((n, NUM_PAIR_FEATURES)).astype(np.float32)
    for name, en in points.items():
        x[:, PAIR_FEATURE_NAMES.index(f"{name}_zone_east_km")] = en[:, 0]
        x[:, PAIR_FEATURE_NAMES.index(f"{name}_zone_north_km")] = en[:, 1]
    return x


def _near_the_river(rng: np.random.Generator, n: int) -> F32:
    """(east, north) points within 3 km of the river, north beyond both ends of its knots."""
    north = rng.uniform(-45.0, 35.0, n)
    east = simulator.river_east_km(north) + rng.uniform(-3.0, 3.0, n)
    points: F32 = np.stack([east, north], axis=1).astype(np.float32)
    return points


def test_the_river_is_the_simulators_beyond_both_ends_too() -> None:
    north = np.linspace(-60.0, 50.0, 1101)  # the knots span -40 .. 30
    river = simulator.river_east_km(north)
    west = np.stack([river - 0.01, north], axis=1).astype(np.float32)
    east = np.stack([river + 0.01, north], axis=1).astype(np.float32)
    columns = road_columns(_rows({"rider": west, "pickup": east, "dropoff": east}), RoadMap.of())
    np.testing.assert_array_equal(columns[:, 0], 1.0)  # approach: 10 m west -> 10 m east
    np.testing.assert_array_equal(columns[:, 1], 0.0)  # trip: stays on the east bank


def test_crossings_and_detours_match_the_simulators_geometry() -> None:
    rng = np.random.default_rng(1)
    rider, pickup, dropoff = (_near_the_river(rng, 4000) for _ in range(3))
    columns = road_columns(
        _rows({"rider": rider, "pickup": pickup, "dropoff": dropoff}), RoadMap.of()
    )
    assert columns.shape == (4000, len(ROAD_FEATURES)) and columns.dtype == np.float32
    crossings = simulator.crossings_en()
    for (start, end), (cross, detour) in (((rider, pickup), (0, 2)), ((pickup, dropoff), (1, 3))):
        a, b = start.astype(np.float64), end.astype(np.float64)
        crosses = simulator.river_side(a) != simulator.river_side(b)
        assert 0.2 < crosses.mean() < 0.8  # both kinds of leg are tested
        np.testing.assert_array_equal(columns[:, cross], crosses.astype(np.float32))
        via = np.min(
            np.linalg.norm(a[:, None] - crossings, axis=2)
            + np.linalg.norm(b[:, None] - crossings, axis=2),
            axis=1,
        )
        expected = np.where(crosses, via - np.linalg.norm(a - b, axis=1), 0.0)
        np.testing.assert_allclose(columns[:, detour], expected, atol=1e-4)
        assert (columns[crosses, detour] >= -1e-4).all()


def test_the_graph_computes_the_road_columns_as_numpy_does(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    config = training.TrainConfig(seed=3, windows=4, holdout_windows=2, epochs=1, hidden=(8,))
    assert config.road_features  # every recipe has them
    result = training.train_and_export(config, tmp_path_factory.mktemp("road"), command="road")
    rng = np.random.default_rng(2)
    rider, pickup, dropoff = (_near_the_river(rng, 3000) for _ in range(3))
    features = _rows({"rider": rider, "pickup": pickup, "dropoff": dropoff})
    graph = training.ort_predict(result.model_path.read_bytes(), features)
    assert training.max_relative_difference(graph, result.model.predict(features)) < 1e-5
    assert result.model.inputs(features).shape[1] == NUM_PAIR_FEATURES + len(ROAD_FEATURES)
    assert result.card["architecture"]["road_features"] == list(ROAD_FEATURES)
    assert PAIR_FEATURES.dims[-1] == NUM_PAIR_FEATURES  # the served input is unchanged
