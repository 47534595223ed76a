"""Ground truth of the registered cities: the worlds the dispatch model learns and is judged in.

The model never sees this module's parameters, only the pair features the server computes;
the simulator plays the real cities. It is deliberately richer than straight-line distance
(what nearest-rider dispatch assumes) and deliberately simple enough to read in one sitting:

- each city (`city_world`) is its registry entry's map (`domain.cities`: service area,
  barriers and crossings, free-flow speeds, road circuity; simulated, not surveyed) plus
  what only the world knows: where orders and riders cluster, how congestion spreads, what
  a crossing costs in minutes. The four shipped cities' knobs are written out below; any
  other registered city gets a world built from its entry alone (`entry_world`: several
  demand centres placed from the area's shape, spreads and congestion scaled to its size),
  so a city added to the registry is simulated, trained on or evaluated without code;
- positions are worked in the city's east/north km plane around its centre;
- roads are straight lines times the map's circuity; a leg whose ends lie on different
  sides of a barrier (river, railway, ring road) goes through that barrier's best crossing
  (`domain.roads`), which costs kilometres and, for two-wheelers, minutes;
- congestion is a smooth field, heaviest in the centre and around the hot spots, scaled by
  the local hour (rush hours ~8-9 and ~18-19, light at night, milder rush on weekends);
  cars suffer more from it than two-wheelers;
- every order a rider already carries adds a stop and slows the rider down;
- restaurants need preparation time: a rider who arrives early waits;
- FRAGILE adds handling time and slows the trip; LARGE_ITEM needs a car and THERMAL_BOX needs
  a rider with a thermal box. The simulator does not forbid breaking a hard constraint (or
  exceeding capacity): it prices it as a hand-over to another rider (minutes and money);
- travel time carries lognormal multiplicative noise (mean one), so outcomes are noisy.

Promises. A platform quotes each order a delivery time when it is placed, from the
restaurant's preparation time and the trip distance, with a buffer sized so that its
dispatcher keeps the large majority of promises: published figures for the large Chinese
food-delivery platforms put on-time rates above 90 %, and a quote that a good dispatcher
misses one time in five would not survive in a real market. Here the promise is
``promise_base_minutes + promise_per_km * straight-line km + jitter`` (x0.8 for PRIORITY),
with the base calibrated on held-out default-regime windows so that the oracle (the
simulator's own expectations, exact assignment) is on time for about 90 % of orders
(``make evaluate`` reports the figure); the quote does not know the hour's traffic or the
riders' supply, so the stress regimes (``REGIMES``: peak, long distance, scarcity ...)
keep their difficulty.

Two simplifications keep the on-time probability in closed form: the noise multiplies only
the travel minutes, and the pickup wait is computed from the *expected* approach time (the
platform tells the restaurant the rider's ETA, so the kitchen's slack is known at dispatch).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import shapely
from numpy.typing import ArrayLike, NDArray
from scipy.special import ndtr

from dispatch_contract import OrderConstraint, Vehicle
from dispatch_service.domain import geo, roads
from dispatch_service.domain.cities import City, CityRegistry, default_registry
from dispatch_service.domain.feasibility import THERMAL_EQUIPMENT_BIT, feasible, spare_slots
from dispatch_service.domain.features import local_time
from dispatch_service.domain.ids import id_rank
from dispatch_service.domain.stacking import stacked_extra_load
from dispatch_service.domain.window import DispatchWindow

__all__ = [
    "DEFAULT_CITY",
    "MONDAY_MIDNIGHT_LOCAL",
    "REGIMES",
    "THERMAL_EQUIPMENT_BIT",
    "UNASSIGNED_PENALTY_MINUTES",
    "BoolArray",
    "CityConfig",
    "FloatArray",
    "IntArray",
    "Leg",
    "OrderOutcomes",
    "PairTimes",
    "Regime",
    "city_world",
    "city_worlds",
    "congestion",
    "entry_world",
    "evaluate_assignment",
    "expected_outcome",
    "generate_regime_window",
    "generate_window",
    "hour_level",
    "order_outcomes",
    "random_dispatch_time",
    "sample_outcome",
    "sequential_extra_load",
    "to_plane",
    "travel_leg",
    "zone_level",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
BoolArray = NDArray[np.bool_]

# Unix time of Monday 2024-03-04 00:00 at UTC+8 (every shipped city's zone); random windows
# fall in the weeks after.
MONDAY_MIDNIGHT_LOCAL: Final = 1_709_481_600


def _shanghai() -> City:
    return default_registry().get("shanghai")


# ------------------------------------------------------------------------------ the city


@dataclass(frozen=True)
class CityConfig:
    """Every knob of one simulated city; the defaults are Shanghai's world.

    ``map``: the city's registry entry (area, clock, barriers, speeds, circuity). Points are
    (lat, lon) degrees; ``lat_range`` x ``lon_range`` is where points may fall (inside the
    service area).
    """

    map: City = field(default_factory=_shanghai)
    lat_range: tuple[float, float] = (30.95, 31.45)
    lon_range: tuple[float, float] = (121.15, 121.80)
    # (lat, lon, weight): malls and restaurant streets where orders and riders cluster.
    hot_spots: tuple[tuple[float, float, float], ...] = (
        (31.2304, 121.4737, 1.6),  # People's Square
        (31.2286, 121.4480, 1.3),  # Jing'an
        (31.1940, 121.4365, 1.3),  # Xujiahui
        (31.2397, 121.4998, 1.2),  # Lujiazui
        (31.2990, 121.5130, 1.0),  # Wujiaochang
        (31.2230, 121.4170, 0.9),  # Zhongshan Park
        (31.2100, 121.5450, 0.9),  # Century Park
        (31.2050, 121.5900, 0.7),  # Zhangjiang
        (31.1950, 121.3200, 0.7),  # Hongqiao
        (31.1120, 121.3820, 0.6),  # Minhang
        (31.3500, 121.4500, 0.5),  # Baoshan
        (31.1400, 121.5300, 0.5),  # Pujiang / Sanlin
    )
    order_spot_share: float = 0.85  # other pickups anywhere in the core box
    order_spot_spread_km: float = 1.2
    rider_spot_share: float = 0.6  # other riders anywhere in the core box
    rider_spot_spread_km: float = 2.5
    core_lat_range: tuple[float, float] = (31.05, 31.40)
    core_lon_range: tuple[float, float] = (121.30, 121.68)
    dropoff_gamma_shape: float = 2.0
    dropoff_gamma_scale_km: float = 1.3
    dropoff_min_km: float = 0.3
    dropoff_max_km: float = 8.0
    max_order_age_s: int = 480  # orders arrive up to 8 minutes before dispatch

    # Promise: 30..75 minutes, longer for longer trips, shorter for PRIORITY orders. The
    # base is calibrated so that the oracle dispatcher (ground-truth scores, exact
    # assignment) is on time for about 90 % of the default regime's orders (module
    # docstring); it depends on distance only, not on the hour, so peak windows stay hard.
    promise_base_minutes: float = 38.0
    promise_per_km: float = 3.2
    promise_jitter_minutes: tuple[float, float] = (-3.0, 6.0)
    priority_promise_factor: float = 0.8
    promise_range_minutes: tuple[float, float] = (30.0, 75.0)

    thermal_rate: float = 0.15
    large_rate: float = 0.05
    fragile_rate: float = 0.10
    priority_rate: float = 0.10

    vehicle_mix: tuple[float, float, float] = (0.60, 0.25, 0.15)  # e-bike, motorbike, car
    thermal_box_rate: float = 0.40
    # Capacity choices and their weights per vehicle (cars carry more).
    capacity_choices: tuple[tuple[int, ...], ...] = ((1, 2, 3), (2, 3), (2, 3, 4))
    capacity_weights: tuple[tuple[float, ...], ...] = ((0.2, 0.5, 0.3), (0.5, 0.5), (0.2, 0.4, 0.4))

    # Minutes each barrier crossing costs beyond its distance, per Vehicle (ramps, ferry
    # waits, level crossings; e-bikes use ferries).
    crossing_minutes: tuple[float, float, float] = (5.0, 3.0, 1.0)

    congestion_sensitivity: tuple[float, float, float] = (0.35, 0.55, 1.0)
    # Congestion = 1 + zone level * hour level.
    zone_base: float = 0.25
    zone_centre_peak: float = 1.0
    zone_centre_sigma_km: float = 8.0
    zone_spot_peak: float = 0.3
    zone_spot_sigma_km: float = 1.5
    hour_base: float = 0.35
    night_factor: float = 0.3  # 0:00-5:00 keeps this share of the base level
    rush_hours: tuple[float, float] = (8.5, 18.5)
    rush_peaks: tuple[float, float] = (0.9, 0.8)
    rush_sigma_hours: tuple[float, float] = (0.9, 1.1)
    lunch_peak: float = 0.3
    weekend_rush_factor: float = 0.5

    load_stop_minutes: float = 3.0  # each carried order adds a stop
    load_speed_penalty: float = 0.06  # and slows the rider by 6 %
    prep_minutes: float = 10.0  # restaurant preparation from order creation
    thermal_prep_minutes: float = 4.0  # hot meals take longer
    pickup_handling_minutes: float = 2.0
    dropoff_handling_minutes: float = 2.0
    fragile_handling_minutes: float = 3.0
    fragile_speed_factor: float = 0.9
    large_handling_minutes: float = 4.0
    violation_minutes: float = 30.0  # hand-over after a broken hard constraint / full rider
    violation_cost_cny: float = 15.0

    noise_sigma: tuple[float, float, float] = (0.22, 0.25, 0.30)  # lognormal, per Vehicle

    pay_base_cny: float = 5.0
    pay_per_km: float = 1.0
    pay_per_minute: float = 0.25
    vehicle_cost_per_km: tuple[float, float, float] = (0.05, 0.2, 0.8)
    large_surcharge_cny: float = 6.0
    fragile_surcharge_cny: float = 1.0

    weeks: int = 3  # span of random dispatch times
    busy_hour_share: float = 0.7  # the rest of the windows fall at uniformly random hours
    # Relative order volume per local hour (0..23) for the busy share.
    hour_demand: tuple[float, ...] = field(
        default=(
            0.3, 0.2, 0.1, 0.1, 0.1, 0.2, 0.4, 0.8, 1.2, 1.0, 1.2, 2.5,
            3.0, 2.0, 1.2, 1.0, 1.3, 2.2, 3.0, 2.6, 1.8, 1.3, 0.9, 0.5,
        )
    )  # fmt: skip


DEFAULT_CITY: Final = CityConfig()

# What only the simulated world knows of each shipped city, beyond its map: where orders
# and riders cluster and how wide, and how congestion spreads. Any other registered city's
# world is built from its registry entry (`entry_world`).
_WORLDS: Final[dict[str, dict[str, Any]]] = {
    "shanghai": {},
    "beijing": {
        "lat_range": (39.75, 40.06),
        "lon_range": (116.20, 116.62),
        "core_lat_range": (39.80, 40.02),
        "core_lon_range": (116.25, 116.57),
        "hot_spots": (
            (39.9150, 116.4040, 1.5),  # Wangfujing
            (39.9330, 116.4540, 1.3),  # Sanlitun
            (39.9080, 116.4600, 1.3),  # Guomao
            (39.9830, 116.3160, 1.2),  # Zhongguancun
            (39.9990, 116.4800, 0.9),  # Wangjing
            (39.9160, 116.3600, 0.8),  # Xidan / Financial Street
            (39.8650, 116.3790, 0.7),  # Beijing South
            (39.9590, 116.2980, 0.6),  # Wanshou Road
            (39.8600, 116.4700, 0.5),  # Panjiayuan / Jinsong
        ),
        "order_spot_spread_km": 1.4,
        "rider_spot_spread_km": 2.8,
        "zone_centre_sigma_km": 9.0,
        "zone_centre_peak": 1.2,
        "crossing_minutes": (4.0, 3.0, 2.0),
    },
    "shenzhen": {
        "lat_range": (22.48, 22.70),
        "lon_range": (113.80, 114.30),
        "core_lat_range": (22.50, 22.66),
        "core_lon_range": (113.86, 114.22),
        "hot_spots": (
            (22.5431, 114.0579, 1.4),  # Futian CBD
            (22.5400, 114.1100, 1.2),  # Luohu
            (22.5170, 113.9300, 1.2),  # Nanshan / Houhai
            (22.5400, 113.9500, 1.0),  # Science Park
            (22.5600, 114.0300, 0.8),  # Xiangmihu
            (22.5800, 113.8900, 0.7),  # Bao'an centre
            (22.6100, 114.0300, 0.7),  # Longhua
            (22.5550, 114.1700, 0.5),  # Buji / Shawan
        ),
        "order_spot_share": 0.75,
        "order_spot_spread_km": 1.8,
        "rider_spot_share": 0.5,
        "rider_spot_spread_km": 3.0,
        "zone_centre_sigma_km": 12.0,
        "zone_centre_peak": 0.8,
        "crossing_minutes": (4.0, 2.5, 1.5),
    },
    "chengdu": {
        "lat_range": (30.52, 30.80),
        "lon_range": (103.92, 104.22),
        "core_lat_range": (30.56, 30.76),
        "core_lon_range": (103.96, 104.18),
        "hot_spots": (
            (30.6586, 104.0648, 1.5),  # Tianfu Square
            (30.6570, 104.0800, 1.3),  # Chunxi Road
            (30.6450, 104.0440, 1.0),  # Kuanzhai Alley
            (30.5730, 104.0660, 1.1),  # Tianfu Software Park
            (30.6300, 104.0810, 0.9),  # Jiuyanqiao
            (30.6930, 104.1050, 0.6),  # Jianshe Road
            (30.6880, 104.0300, 0.6),  # Jinniu
            (30.6080, 104.0270, 0.5),  # Wuhou / Gaopeng
        ),
        "order_spot_spread_km": 1.3,
        "rider_spot_spread_km": 2.6,
        "zone_centre_sigma_km": 8.5,
        "zone_centre_peak": 1.1,
        "crossing_minutes": (4.5, 3.0, 1.5),
    },
}


def city_world(city: City) -> CityConfig:
    """The simulated world of a registered city: its map and its world's knobs (the shipped
    cities' from `_WORLDS`, any other city's built from its registry entry: `entry_world`)."""
    if city.id not in _WORLDS:
        return entry_world(city)
    return CityConfig(map=city, **_WORLDS[city.id])


# A new city's demand centres: one per this many km² of service area, within these bounds.
_KM2_PER_CENTRE: Final = 120.0
_CENTRES: Final = (4, 10)


def entry_world(city: City) -> CityConfig:
    """A plausible world for a city known only by its registry entry.

    The map (area, barriers and crossings, speeds, circuity) is the entry's. What only the
    world knows is drawn from the area's shape, the same way for every city:

    - where points fall: the largest box around the centre that the area holds (shapely's
      test), the core 10 % smaller;
    - demand centres: the city's centre (weight 1.5) and one more per ~120 km² of area (4 to
      10 in all), each the point of a 40 x 40 grid over the area that is farthest from the
      centres chosen so far, discounted by its distance from the city centre (a Gaussian of
      0.45 x the area's equivalent radius R): spread over the city, across its barriers,
      denser towards the middle; a centre's weight falls from 1.5 with its distance;
    - spreads and congestion scaled to the city: orders within clip(0.1 R, 1, 2) km of a
      centre, riders twice as wide, congestion's central bump clip(0.4 R, 5, 14) km wide;
    - promises quoted for the city's roads: the minutes per straight km scaled from the
      default world's by the road circuity and the motorbike's free-flow speed (a platform
      quotes each city its own way; Shanghai's quote would be late in a slower city).

    The rest (rates, fleet mix, noise, the promise's base) are the defaults the shipped
    cities share.
    """
    plane_area = shapely.Polygon(city.plane(city.area))
    radius_km = float(np.sqrt(plane_area.area / np.pi))
    box = _inner_box_around_centre(city)
    lat_pad, lon_pad = 0.05 * (box[2] - box[0]), 0.05 * (box[3] - box[1])
    count = int(np.clip(round(plane_area.area / _KM2_PER_CENTRE), *_CENTRES))
    grid_lat, grid_lon = np.meshgrid(
        np.linspace(box[0], box[2], 40), np.linspace(box[1], box[3], 40)
    )
    grid = np.stack((grid_lat.ravel(), grid_lon.ravel()), axis=1)
    grid = grid[city.contains(grid)]
    grid_km = city.plane(grid)
    prior = np.exp(-0.5 * (np.linalg.norm(grid_km, axis=1) / (0.45 * radius_km)) ** 2)
    chosen_km = [np.zeros(2)]
    spots = [(city.centre[0], city.centre[1], 1.5)]
    for _ in range(count - 1):
        gap = np.min(np.linalg.norm(grid_km[:, None, :] - np.asarray(chosen_km)[None], axis=2), 1)
        best = int(np.argmax(gap * prior))
        chosen_km.append(grid_km[best])
        weight = 1.5 * float(
            np.exp(-0.5 * (np.linalg.norm(grid_km[best]) / (0.5 * radius_km)) ** 2)
        )
        spots.append((float(grid[best, 0]), float(grid[best, 1]), round(max(weight, 0.4), 3)))
    spread = float(np.clip(0.1 * radius_km, 1.0, 2.0))
    return CityConfig(
        map=city,
        lat_range=(float(box[0]), float(box[2])),
        lon_range=(float(box[1]), float(box[3])),
        core_lat_range=(float(box[0] + lat_pad), float(box[2] - lat_pad)),
        core_lon_range=(float(box[1] + lon_pad), float(box[3] - lon_pad)),
        hot_spots=tuple(spots),
        order_spot_spread_km=spread,
        rider_spot_spread_km=2.0 * spread,
        zone_centre_sigma_km=float(np.clip(0.4 * radius_km, 5.0, 14.0)),
        promise_per_km=DEFAULT_CITY.promise_per_km * _road_minutes_per_km(city, DEFAULT_CITY.map),
    )


def _road_minutes_per_km(city: City, reference: City) -> float:
    """How many times longer a straight km takes by motorbike on ``city``'s roads than on
    ``reference``'s (circuity over free-flow speed)."""
    motorbike = Vehicle.MOTORBIKE
    return float(
        (city.road_circuity / city.speeds_kmh[motorbike])
        / (reference.road_circuity / reference.speeds_kmh[motorbike])
    )


def _inner_box_around_centre(city: City) -> FloatArray:
    """[4] (lat low, lon low, lat high, lon high): the area's bounding box shrunk towards
    the centre, 2.5 % of it a step, until the area holds it (shapely's test)."""
    lo, hi = city.area.min(axis=0), city.area.max(axis=0)
    centre = np.asarray(city.centre)
    for step in range(40):
        keep = 1.0 - 0.025 * step
        low, high = centre + (lo - centre) * keep, centre + (hi - centre) * keep
        if city.shape.contains(shapely.box(low[1], low[0], high[1], high[0])):
            return np.concatenate((low, high))
    raise ValueError(f"{city.id}: no box around the centre fits inside the service area")


def city_worlds(registry: CityRegistry | None = None) -> dict[str, CityConfig]:
    """Every registered city's world, by city id."""
    registry = registry or default_registry()
    return {city.id: city_world(city) for city in registry.cities}


def _v3(values: tuple[float, float, float]) -> FloatArray:
    return np.asarray(values, dtype=np.float64)


# ---------------------------------------------------------------------------- geography


def to_plane(latlon: ArrayLike, config: CityConfig = DEFAULT_CITY) -> FloatArray:
    """[n, 2] (lat, lon) -> [n, 2] (east_km, north_km) around the city's centre."""
    return config.map.plane(np.asarray(latlon, dtype=np.float64).reshape(-1, 2))


def hour_level(hour: float, weekend: bool, config: CityConfig = DEFAULT_CITY) -> float:
    """How busy the roads are at a local hour (0 = empty); multiplies the zone level."""

    def bump(centre: float, sigma: float) -> float:
        gap = abs(hour - centre) % 24.0
        gap = min(gap, 24.0 - gap)
        return float(np.exp(-0.5 * (gap / sigma) ** 2))

    rush_scale = config.weekend_rush_factor if weekend else 1.0
    level = config.hour_base + config.lunch_peak * bump(12.5, 1.0)
    for centre, peak, sigma in zip(
        config.rush_hours, config.rush_peaks, config.rush_sigma_hours, strict=True
    ):
        level += rush_scale * peak * bump(centre, sigma)
    if hour < 5.0:
        level *= config.night_factor
    return level


def zone_level(points_en: FloatArray, config: CityConfig = DEFAULT_CITY) -> FloatArray:
    """Smooth congestion field over the city: heavy in the centre and around hot spots."""
    r2 = np.sum(points_en**2, axis=-1)
    level = config.zone_base + config.zone_centre_peak * np.exp(
        -0.5 * r2 / config.zone_centre_sigma_km**2
    )
    spots = to_plane(np.asarray([s[:2] for s in config.hot_spots]), config)
    d2 = np.sum((points_en[..., None, :] - spots) ** 2, axis=-1)
    level = level + config.zone_spot_peak * np.exp(-0.5 * d2 / config.zone_spot_sigma_km**2).sum(
        axis=-1
    )
    return np.asarray(level)


def congestion(
    points_en: FloatArray, hour: float, weekend: bool, config: CityConfig = DEFAULT_CITY
) -> FloatArray:
    """Travel-time multiplier (>= 1) for a fully sensitive vehicle at these points."""
    return np.asarray(1.0 + zone_level(points_en, config) * hour_level(hour, weekend, config))


@dataclass(frozen=True)
class Leg:
    """One vectorised leg: road km, minutes, and how many barriers it crossed."""

    road_km: FloatArray
    minutes: FloatArray
    crossings: IntArray


def travel_leg(
    start_en: FloatArray,
    end_en: FloatArray,
    vehicle: NDArray[np.integer[Any]],
    load: ArrayLike,
    *,
    hour: float,
    weekend: bool,
    config: CityConfig = DEFAULT_CITY,
    speed_factor: ArrayLike = 1.0,
) -> Leg:
    """Travel between [P, 2] plane points by [P] vehicles carrying [P] orders.

    Congestion is averaged over three samples of the route (start, middle, end); each
    barrier crossed adds its detour (`domain.roads`) and ``crossing_minutes``.
    """
    legs = roads.leg_roads(config.map, start_en, end_en)
    middle = 0.5 * (start_en + end_en)
    km = legs.road_km(config.map)
    level = (
        congestion(start_en, hour, weekend, config)
        + congestion(middle, hour, weekend, config)
        + congestion(end_en, hour, weekend, config)
    ) / 3.0
    sensitivity = _v3(config.congestion_sensitivity)[vehicle]
    load_arr = np.asarray(load, dtype=np.float64)
    speed = (
        config.map.speeds_kmh[vehicle]
        / (1.0 + sensitivity * (level - 1.0))
        / (1.0 + config.load_speed_penalty * load_arr)
        * np.asarray(speed_factor, dtype=np.float64)
    )
    minutes = km / speed * 60.0 + legs.crossings * _v3(config.crossing_minutes)[vehicle]
    return Leg(road_km=np.asarray(km), minutes=np.asarray(minutes), crossings=legs.crossings)


# ------------------------------------------------------------------------------- outcomes


@dataclass(frozen=True)
class PairTimes:
    """The deterministic parts of one order-rider pair's delivery (minutes from dispatch)."""

    travel_minutes: FloatArray  # noisy part: approach + trip legs
    fixed_minutes: FloatArray  # wait, handling, stops, hand-over
    approach_minutes: FloatArray  # the approach leg's share of travel_minutes
    pickup_fixed_minutes: FloatArray  # the wait and handling before the pickup
    order_age_minutes: FloatArray
    promised_minutes: FloatArray
    road_km: FloatArray
    base_cost: FloatArray  # everything but the per-minute pay
    sigma: FloatArray
    violation: BoolArray


def _pair_times(
    window: DispatchWindow,
    order_idx: ArrayLike,
    rider_idx: ArrayLike,
    extra_load: ArrayLike | None,
    config: CityConfig,
) -> PairTimes:
    orders = np.asarray(order_idx, dtype=np.int64).reshape(-1)
    riders = np.asarray(rider_idx, dtype=np.int64).reshape(-1)
    if orders.shape != riders.shape:
        raise ValueError(f"order_idx {orders.shape} and rider_idx {riders.shape} must match")
    extra = (
        np.zeros(orders.shape, dtype=np.int64)
        if extra_load is None
        else np.broadcast_to(np.asarray(extra_load, dtype=np.int64).reshape(-1), orders.shape)
    )
    hour, weekend = local_time(window.dispatch_time, config.map)
    vehicle = window.rider_vehicle[riders].astype(np.int64)
    load = window.rider_load[riders].astype(np.int64) + extra
    flags = window.constraints[orders].astype(np.int64)
    thermal = (flags & OrderConstraint.THERMAL_BOX) != 0
    large = (flags & OrderConstraint.LARGE_ITEM) != 0
    fragile = (flags & OrderConstraint.FRAGILE) != 0
    violation = ~feasible(
        flags,
        window.rider_equipment[riders],
        vehicle,
        load,
        window.rider_capacity[riders],
    )

    rider_en = to_plane(window.rider_position[riders], config)
    pickup_en = to_plane(window.pickup[orders], config)
    dropoff_en = to_plane(window.dropoff[orders], config)
    approach = travel_leg(
        rider_en, pickup_en, vehicle, load, hour=hour, weekend=weekend, config=config
    )
    trip = travel_leg(
        pickup_en,
        dropoff_en,
        vehicle,
        load,
        hour=hour,
        weekend=weekend,
        config=config,
        speed_factor=np.where(fragile, config.fragile_speed_factor, 1.0),
    )
    age = (window.dispatch_time - window.created_at[orders]).astype(np.float64) / 60.0
    prep = config.prep_minutes + config.thermal_prep_minutes * thermal
    wait = np.maximum(0.0, np.maximum(0.0, prep - age) - approach.minutes)
    fixed = (
        wait
        + config.pickup_handling_minutes
        + config.dropoff_handling_minutes
        + config.fragile_handling_minutes * fragile
        + config.large_handling_minutes * large
        + config.load_stop_minutes * load
        + config.violation_minutes * violation
    )
    road_km = approach.road_km + trip.road_km
    base_cost = (
        config.pay_base_cny
        + (config.pay_per_km + _v3(config.vehicle_cost_per_km)[vehicle]) * road_km
        + config.large_surcharge_cny * large
        + config.fragile_surcharge_cny * fragile
        + config.violation_cost_cny * violation
    )
    return PairTimes(
        travel_minutes=approach.minutes + trip.minutes,
        fixed_minutes=np.asarray(fixed),
        approach_minutes=np.asarray(approach.minutes),
        pickup_fixed_minutes=np.asarray(wait + config.pickup_handling_minutes),
        order_age_minutes=age,
        promised_minutes=window.promised_minutes[orders].astype(np.float64),
        road_km=np.asarray(road_km),
        base_cost=np.asarray(base_cost),
        sigma=_v3(config.noise_sigma)[vehicle],
        violation=np.asarray(violation),
    )


def expected_outcome(
    window: DispatchWindow,
    order_idx: ArrayLike,
    rider_idx: ArrayLike,
    config: CityConfig = DEFAULT_CITY,
    extra_load: ArrayLike | None = None,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Noise-free (eta_minutes from dispatch, P(on time), expected cost CNY) per pair.

    ``extra_load`` adds orders to the riders' current load (orders given earlier in the same
    window). On time means: order age + delivery minutes <= promised minutes; with travel
    minutes T * exp(sigma Z - sigma^2 / 2) that is a normal CDF in closed form.
    """
    t = _pair_times(window, order_idx, rider_idx, extra_load, config)
    eta = t.travel_minutes + t.fixed_minutes
    budget = t.promised_minutes - t.order_age_minutes - t.fixed_minutes
    ratio = np.maximum(budget, 1e-9) / np.maximum(t.travel_minutes, 1e-9)
    z = (np.log(ratio) + 0.5 * t.sigma**2) / t.sigma
    ontime = np.where(budget > 0.0, ndtr(z), 0.0)
    cost = t.base_cost + config.pay_per_minute * eta
    return np.asarray(eta), np.asarray(ontime), np.asarray(cost)


def _noise(t: PairTimes, normals: FloatArray) -> FloatArray:
    """The travel minutes' multiplicative noise (mean one) for these standard normals."""
    return np.asarray(np.exp(t.sigma * normals - 0.5 * t.sigma**2))


def _realise(
    t: PairTimes, normals: FloatArray, config: CityConfig
) -> tuple[FloatArray, BoolArray, FloatArray]:
    minutes = t.travel_minutes * _noise(t, normals) + t.fixed_minutes
    on_time = t.order_age_minutes + minutes <= t.promised_minutes
    cost = t.base_cost + config.pay_per_minute * minutes
    return np.asarray(minutes), np.asarray(on_time), np.asarray(cost)


def sample_outcome(
    window: DispatchWindow,
    order_idx: ArrayLike,
    rider_idx: ArrayLike,
    rng: np.random.Generator,
    config: CityConfig = DEFAULT_CITY,
    *,
    extra_load: ArrayLike | None = None,
) -> tuple[FloatArray, BoolArray, FloatArray]:
    """One noisy realisation per pair: (minutes from dispatch to delivery, on time, cost CNY).

    Realised minutes are the same quantity as the expected ETA; on time compares order age
    plus those minutes with the promise.
    """
    t = _pair_times(window, order_idx, rider_idx, extra_load, config)
    return _realise(t, rng.standard_normal(t.travel_minutes.shape), config)


def sequential_extra_load(window: DispatchWindow, assigned: NDArray[np.integer[Any]]) -> IntArray:
    """Orders given earlier in this window to the same rider, per order (0 when first).

    The rule of ``domain.stacking.stacked_extra_load`` (one rule for the pipeline's
    stack-aware re-scoring and for the simulated outcome): a rider with several new orders
    carries them one after another in creation order, ties by order id as the served
    resolution breaks them, not by row.
    """
    return stacked_extra_load(window.created_at, assigned, id_rank(window.order_ids.tolist()))


def evaluate_assignment(
    window: DispatchWindow,
    assigned_rider_index: NDArray[np.integer[Any]],
    rng: np.random.Generator,
    config: CityConfig = DEFAULT_CITY,
) -> dict[str, float]:
    """Realise one assignment (-1 = unassigned) and score it like operations would.

    One standard normal is drawn per *order* (not per assigned pair), so two policies fed
    the same seed share each order's luck. Unassigned orders count as late; delivery minutes
    and cost average over assigned orders; minutes are measured from order creation.
    """
    assigned = np.asarray(assigned_rider_index, dtype=np.int64).reshape(-1)
    if assigned.shape[0] != window.num_orders:
        raise ValueError(f"need one rider index per order ({window.num_orders})")
    if ((assigned < -1) | (assigned >= window.num_riders)).any():
        raise ValueError("rider indices must be -1 or within the window's riders")
    normals = rng.standard_normal(window.num_orders)
    rows = np.flatnonzero(assigned >= 0)
    extra = sequential_extra_load(window, assigned)[rows]
    times = _pair_times(window, rows, assigned[rows], extra, config)
    minutes, on_time, cost = _realise(times, normals[rows], config)
    n_assigned = int(rows.size)
    return {
        "orders": float(window.num_orders),
        "assigned": float(n_assigned),
        "assigned_share": n_assigned / window.num_orders,
        "mean_delivery_minutes": float(np.mean(times.order_age_minutes + minutes))
        if n_assigned
        else float("nan"),
        "ontime_rate": float(np.sum(on_time)) / window.num_orders,
        "mean_cost_cny": float(np.mean(cost)) if n_assigned else float("nan"),
        "violation_share": float(np.sum(times.violation)) / window.num_orders,
    }


# An unassigned order is delivered (by a later window) this long after its promise, and late.
UNASSIGNED_PENALTY_MINUTES: Final = 30.0


@dataclass(frozen=True)
class OrderOutcomes:
    """One realised assignment, order by order (every order counts, assigned or not)."""

    assigned: BoolArray
    minutes_from_dispatch: FloatArray  # realised delivery minutes; NaN where unassigned
    pickup_minutes_from_dispatch: FloatArray  # realised pickup minutes; NaN where unassigned
    delivery_minutes: FloatArray  # from creation; unassigned: promise + penalty
    on_time: BoolArray  # unassigned: late
    cost: FloatArray  # CNY; NaN where unassigned
    extra_load: IntArray  # the rider's earlier new orders in this window


def order_outcomes(
    window: DispatchWindow,
    assigned_rider_index: NDArray[np.integer[Any]],
    rng: np.random.Generator,
    config: CityConfig = DEFAULT_CITY,
) -> OrderOutcomes:
    """Realise an assignment like `evaluate_assignment` (one normal per order, so policies
    fed the same seed share each order's luck), keeping every order's outcome: unassigned
    orders count as delivered ``UNASSIGNED_PENALTY_MINUTES`` after their promise, and late."""
    assigned = np.asarray(assigned_rider_index, dtype=np.int64).reshape(-1)
    if assigned.shape[0] != window.num_orders:
        raise ValueError(f"need one rider index per order ({window.num_orders})")
    normals = rng.standard_normal(window.num_orders)
    rows = np.flatnonzero(assigned >= 0)
    extra = sequential_extra_load(window, assigned)
    times = _pair_times(window, rows, assigned[rows], extra[rows], config)
    minutes, on_time_rows, cost_rows = _realise(times, normals[rows], config)
    promised = window.promised_minutes.astype(np.float64)
    delivery = promised + UNASSIGNED_PENALTY_MINUTES
    delivery[rows] = times.order_age_minutes + minutes
    from_dispatch = np.full(window.num_orders, np.nan)
    from_dispatch[rows] = minutes
    # The same draw as the delivery: the approach leg is the first part of the travel.
    pickup = np.full(window.num_orders, np.nan)
    noise = _noise(times, normals[rows])
    pickup[rows] = times.approach_minutes * noise + times.pickup_fixed_minutes
    on_time = np.zeros(window.num_orders, dtype=np.bool_)
    on_time[rows] = on_time_rows
    cost = np.full(window.num_orders, np.nan)
    cost[rows] = cost_rows
    return OrderOutcomes(
        assigned=assigned >= 0,
        minutes_from_dispatch=from_dispatch,
        pickup_minutes_from_dispatch=pickup,
        delivery_minutes=delivery,
        on_time=on_time,
        cost=cost,
        extra_load=extra,
    )


# ------------------------------------------------------------------------------- windows


def random_dispatch_time(rng: np.random.Generator, config: CityConfig = DEFAULT_CITY) -> int:
    """A unix time within ``config.weeks`` weeks; mostly busy hours, some at any hour."""
    day = int(rng.integers(0, 7 * config.weeks))
    if rng.random() < config.busy_hour_share:
        weights = np.asarray(config.hour_demand, dtype=np.float64)
        hour = int(rng.choice(24, p=weights / weights.sum()))
    else:
        hour = int(rng.integers(0, 24))
    second = int(rng.integers(0, 3600))
    return MONDAY_MIDNIGHT_LOCAL + day * 86_400 + hour * 3600 + second


def _clip_to_city(latlon: FloatArray, config: CityConfig) -> FloatArray:
    """Points clipped into ``lat_range`` x ``lon_range`` (a box inside the service area)."""
    return np.stack(
        [
            np.clip(latlon[:, 0], *config.lat_range),
            np.clip(latlon[:, 1], *config.lon_range),
        ],
        axis=1,
    )


def _km_to_deg(
    east_km: FloatArray, north_km: FloatArray, config: CityConfig
) -> tuple[FloatArray, FloatArray]:
    lat0 = config.map.centre[0]
    dlat = np.degrees(north_km / geo.EARTH_RADIUS_KM)
    dlon = np.degrees(east_km / (geo.EARTH_RADIUS_KM * np.cos(np.radians(lat0))))
    return dlat, dlon


def _clustered_points(
    rng: np.random.Generator, n: int, spot_share: float, spread_km: float, config: CityConfig
) -> FloatArray:
    """n (lat, lon): a share around weighted hot spots (Gaussian), the rest in the core box."""
    spots = np.asarray(config.hot_spots, dtype=np.float64)
    weights = spots[:, 2] / spots[:, 2].sum()
    pick = rng.choice(len(spots), size=n, p=weights)
    dlat, dlon = _km_to_deg(rng.normal(0.0, spread_km, n), rng.normal(0.0, spread_km, n), config)
    clustered = np.stack([spots[pick, 0] + dlat, spots[pick, 1] + dlon], axis=1)
    uniform = np.stack(
        [rng.uniform(*config.core_lat_range, n), rng.uniform(*config.core_lon_range, n)], axis=1
    )
    use_spot = rng.random(n) < spot_share
    return _clip_to_city(np.where(use_spot[:, None], clustered, uniform), config)


def _ids(prefix: str, numbers: NDArray[np.integer[Any]]) -> NDArray[np.object_]:
    out = np.empty(numbers.shape[0], dtype=object)
    out[:] = [f"{prefix}-{n}".encode() for n in numbers.tolist()]
    return out


def generate_window(
    rng: np.random.Generator,
    num_orders: int,
    num_riders: int,
    dispatch_time: int | None = None,
    config: CityConfig = DEFAULT_CITY,
) -> DispatchWindow:
    """A realistic dispatch window in WGS-84 drawn from ``rng`` (same seed, same window)."""
    if num_orders < 1 or num_riders < 1:
        raise ValueError("a window needs at least one order and one rider")
    now = random_dispatch_time(rng, config) if dispatch_time is None else int(dispatch_time)

    pickup = _clustered_points(
        rng, num_orders, config.order_spot_share, config.order_spot_spread_km, config
    )
    trip_km = np.clip(
        config.dropoff_min_km
        + rng.gamma(config.dropoff_gamma_shape, config.dropoff_gamma_scale_km, num_orders),
        config.dropoff_min_km,
        config.dropoff_max_km,
    )
    heading = rng.uniform(0.0, 2.0 * np.pi, num_orders)
    dlat, dlon = _km_to_deg(trip_km * np.sin(heading), trip_km * np.cos(heading), config)
    dropoff = _clip_to_city(pickup + np.stack([dlat, dlon], axis=1), config)
    created_at = now - rng.integers(0, config.max_order_age_s + 1, num_orders)

    bits = np.zeros(num_orders, dtype=np.int32)
    for flag, rate in (
        (OrderConstraint.THERMAL_BOX, config.thermal_rate),
        (OrderConstraint.LARGE_ITEM, config.large_rate),
        (OrderConstraint.FRAGILE, config.fragile_rate),
        (OrderConstraint.PRIORITY, config.priority_rate),
    ):
        bits |= np.where(rng.random(num_orders) < rate, int(flag), 0).astype(np.int32)
    straight_km = geo.haversine_km(pickup[:, 0], pickup[:, 1], dropoff[:, 0], dropoff[:, 1])
    promised = (
        config.promise_base_minutes
        + config.promise_per_km * straight_km
        + rng.uniform(*config.promise_jitter_minutes, num_orders)
    )
    priority = (bits & OrderConstraint.PRIORITY) != 0
    promised = np.where(priority, promised * config.priority_promise_factor, promised)
    promised = np.round(np.clip(promised, *config.promise_range_minutes), 1)

    position = _clustered_points(
        rng, num_riders, config.rider_spot_share, config.rider_spot_spread_km, config
    )
    vehicle = rng.choice(
        3, size=num_riders, p=np.asarray(config.vehicle_mix) / sum(config.vehicle_mix)
    )
    capacity = np.zeros(num_riders, dtype=np.int32)
    for kind in range(3):
        rows = np.flatnonzero(vehicle == kind)
        choices = np.asarray(config.capacity_choices[kind])
        weights = np.asarray(config.capacity_weights[kind], dtype=np.float64)
        capacity[rows] = rng.choice(choices, size=rows.size, p=weights / weights.sum())
    load = np.floor(rng.random(num_riders) * (capacity + 1)).astype(np.int32)
    equipment = np.where(rng.random(num_riders) < config.thermal_box_rate, THERMAL_EQUIPMENT_BIT, 0)

    first_order = int(rng.integers(0, 1_000_000))
    first_rider = int(rng.integers(0, 100_000))
    return DispatchWindow(
        order_ids=_ids("o", first_order + np.arange(num_orders)),
        order_user_ids=_ids("u", rng.integers(0, 100_000, num_orders)),
        pickup=pickup,
        dropoff=dropoff,
        created_at=created_at.astype(np.int64),
        promised_minutes=promised.astype(np.float32),
        constraints=bits,
        rider_ids=_ids("r", first_rider + np.arange(num_riders)),
        rider_position=position,
        rider_load=load,
        rider_capacity=capacity,
        rider_vehicle=vehicle.astype(np.int32),
        rider_equipment=equipment.astype(np.int32),
        dispatch_time=now,
    )


# ------------------------------------------------------------------------------- regimes


@dataclass(frozen=True)
class Regime:
    """A family of windows the evaluation judges policies on.

    ``hours``: local hours the dispatch time is drawn from (weekdays only when set), None
    for the city's usual mix; ``scarce``: keep only as many riders (in random order) as it
    takes for their total spare capacity to reach the number of orders.
    """

    name: str
    num_orders: int = 64
    num_riders: int = 200
    hours: tuple[float, float] | None = None
    scarce: bool = False
    # Knobs of the city's world this regime changes (name, value), e.g. longer trips.
    changes: tuple[tuple[str, Any], ...] = ()

    def world(self, city: CityConfig = DEFAULT_CITY) -> CityConfig:
        """``city``'s world as this regime changes it."""
        return dataclasses.replace(city, **dict(self.changes)) if self.changes else city


def _regimes() -> dict[str, Regime]:
    peak_hours = (11.5, 13.0)
    regimes = (
        Regime("default"),
        Regime("peak", num_orders=128, hours=peak_hours),
        Regime("night", num_orders=32, num_riders=100, hours=(0.0, 5.0)),
        Regime(
            "long_distance",
            changes=(("dropoff_gamma_scale_km", 3.0), ("dropoff_max_km", 15.0)),
        ),
        Regime("hard_constraints", changes=(("thermal_rate", 0.5), ("large_rate", 0.2))),
        Regime("scarcity", scarce=True),
        Regime("peak_scarcity", num_orders=128, num_riders=300, hours=peak_hours, scarce=True),
    )
    return {regime.name: regime for regime in regimes}


REGIMES: Final = _regimes()


def generate_regime_window(
    rng: np.random.Generator, regime: Regime, city: CityConfig = DEFAULT_CITY
) -> DispatchWindow:
    """One window of ``regime`` in ``city`` drawn from ``rng`` (same seed, same window)."""
    config = regime.world(city)
    dispatch_time = None
    if regime.hours is not None:
        day = int(rng.integers(0, 5))  # a weekday of the first week
        hour = rng.uniform(*regime.hours)
        dispatch_time = MONDAY_MIDNIGHT_LOCAL + day * 86_400 + int(hour * 3600)
    window = generate_window(rng, regime.num_orders, regime.num_riders, dispatch_time, config)
    if not regime.scarce:
        return window
    spare = spare_slots(window.rider_load, window.rider_capacity)
    order = rng.permutation(window.num_riders)
    enough = int(np.searchsorted(np.cumsum(spare[order]), window.num_orders)) + 1
    keep = np.sort(order[: max(1, min(enough, window.num_riders))])
    return dataclasses.replace(
        window,
        rider_ids=window.rider_ids[keep],
        rider_position=window.rider_position[keep],
        rider_load=window.rider_load[keep],
        rider_capacity=window.rider_capacity[keep],
        rider_vehicle=window.rider_vehicle[keep],
        rider_equipment=window.rider_equipment[keep],
    )
