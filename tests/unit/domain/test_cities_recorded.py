"""The registry's answers against answers recorded before its geometry moved to shapely.

`data/recorded_city_answers.npz` holds 640 simulated windows (160 per shipped city, half of
them with points moved onto, a hair either side of, or well inside a city's border vertices
or into another city) with the city each was located in or the refusal's message, and 10,560
legs (every rider to every pickup, every trip) with the barriers each crossed and the km the
crossings added, all as the hand-written geometry computed them at the time. The points are
stored, not seeds, so a change to the simulator does not change what is compared.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from dispatch_service.core.errors import DispatchInputError
from dispatch_service.domain import roads
from dispatch_service.domain.cities import default_registry
from dispatch_service.offline import simulator

RECORDED = np.load(Path(__file__).parent / "data" / "recorded_city_answers.npz")


def test_every_recorded_window_is_located_or_refused_as_recorded() -> None:
    registry = default_registry()
    orders, riders = RECORDED["pickup"].shape[1], RECORDED["rider"].shape[1]
    template = simulator.generate_window(np.random.default_rng(0), orders, riders)
    refused = 0
    for number in range(RECORDED["city"].shape[0]):
        window = dataclasses.replace(
            template,
            pickup=RECORDED["pickup"][number],
            dropoff=RECORDED["dropoff"][number],
            rider_position=RECORDED["rider"][number],
        )
        expected_city, expected_message = RECORDED["city"][number], RECORDED["message"][number]
        if expected_city:
            assert registry.locate(window).id == expected_city, number
        else:
            refused += 1
            with pytest.raises(DispatchInputError) as caught:
                registry.locate(window)
            assert str(caught.value) == expected_message, number
    assert 100 < refused < 400  # both kinds of answer are well represented


def test_every_recorded_leg_crosses_the_recorded_barriers_with_the_recorded_detour() -> None:
    registry = default_registry()
    for number, city in enumerate(registry.cities):
        rows = np.flatnonzero(RECORDED["leg_city"] == number)
        assert rows.size > 1000
        start = city.plane(RECORDED["leg_start"][rows])
        end = city.plane(RECORDED["leg_end"][rows])
        legs = roads.leg_roads(city, start, end)
        barriers = len(city.barriers)
        np.testing.assert_array_equal(legs.crossed, RECORDED["leg_crossed"][rows, :barriers])
        np.testing.assert_allclose(legs.detour_km, RECORDED["leg_detour_km"][rows], atol=1e-9)
