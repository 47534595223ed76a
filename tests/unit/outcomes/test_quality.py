"""Live quality figures against values computed by hand (and, on random data, by a plain
per-row loop written here, independent of `quality`'s numpy)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from dispatch_contract.outcomes import OutcomeStatus
from dispatch_service.outcomes.quality import (
    QualityKey,
    expected_calibration_error,
    live_quality,
)
from dispatch_service.outcomes.store import JoinedRow

T0 = 1_709_500_000.0


def row(
    *,
    eta: float,
    realised_minutes: float,
    p: float,
    on_time: bool,
    cost: float = 5.0,
    version: int = 1,
    city: str = "shanghai",
    level: int = 0,
    status: OutcomeStatus = OutcomeStatus.DELIVERED,
) -> JoinedRow:
    """A delivered decision taken at T0 for an order created 5 minutes before, promised in
    ``realised + 5 +/- 1`` minutes so that it is on time or late as asked."""
    delivered_at = T0 + realised_minutes * 60.0
    promised = realised_minutes + 5.0 + (1.0 if on_time else -1.0)
    return JoinedRow(
        model_version=version,
        city=city,
        fallback_level=level,
        entry_point="dispatch_fused",
        decided_at=T0,
        created_at=T0 - 300.0,
        promised_minutes=promised,
        assigned_rider="r1",
        eta_minutes=eta,
        ontime_probability=p,
        cost=cost,
        status=status,
        picked_up_at=T0 + 60.0,
        delivered_at=delivered_at if status is OutcomeStatus.DELIVERED else None,
        rider_id="r1",
    )


def test_figures_equal_hand_computed_values() -> None:
    rows = [
        row(eta=10, realised_minutes=12, p=0.95, on_time=True, cost=5),
        row(eta=20, realised_minutes=18, p=0.15, on_time=False, cost=6),
        row(eta=30, realised_minutes=35, p=0.55, on_time=True, cost=7),
        row(eta=40, realised_minutes=40, p=0.65, on_time=False, cost=8),
        row(eta=99, realised_minutes=1, p=0.5, on_time=True, status=OutcomeStatus.CANCELLED),
    ]
    (key, figures), *rest = live_quality(rows).items()
    assert rest == []
    assert key == QualityKey(1, "shanghai", 0)
    assert (figures.deliveries, figures.cancelled, figures.reassigned) == (4, 1, 0)
    # errors predicted - realised: -2, 2, -5, 0
    assert figures.eta_mae == pytest.approx(9 / 4)
    assert figures.eta_bias == pytest.approx(-5 / 4)
    # (0.05^2 + 0.15^2 + 0.45^2 + 0.65^2) / 4
    assert figures.brier == pytest.approx(0.65 / 4)
    # one delivery per bin (9, 1, 5, 6): the mean |p - y|
    assert figures.ece == pytest.approx((0.05 + 0.15 + 0.45 + 0.65) / 4)
    assert figures.late_rate == pytest.approx(0.5)
    assert figures.delivery_minutes == pytest.approx((12 + 18 + 35 + 40) / 4)
    assert figures.cost == pytest.approx(6.5)


def test_ece_weighs_each_bin_by_its_share() -> None:
    p = np.array([0.81, 0.89, 0.05, 1.0])
    y = np.array([1.0, 0.0, 0.0, 1.0])
    # bin 8: |0.85 - 0.5| x 2/4; bin 0: |0.05 - 0| x 1/4; bin 9 (1.0 falls in it): 0
    assert expected_calibration_error(p, y) == pytest.approx(0.35 * 0.5 + 0.05 * 0.25)


def test_groups_by_version_city_and_level() -> None:
    rows = [
        row(eta=10, realised_minutes=10, p=0.9, on_time=True, version=1),
        row(eta=10, realised_minutes=16, p=0.9, on_time=False, version=2),
        row(eta=10, realised_minutes=13, p=0.9, on_time=True, version=2, city="chengdu"),
        row(eta=10, realised_minutes=20, p=0.9, on_time=True, version=2, level=1),
    ]
    figures = live_quality(rows)
    assert list(figures) == [
        QualityKey(1, "shanghai", 0),
        QualityKey(2, "chengdu", 0),
        QualityKey(2, "shanghai", 0),
        QualityKey(2, "shanghai", 1),
    ]
    assert figures[QualityKey(2, "shanghai", 0)].eta_bias == pytest.approx(-6.0)
    assert figures[QualityKey(2, "chengdu", 0)].eta_mae == pytest.approx(3.0)
    assert figures[QualityKey(2, "shanghai", 1)].late_rate == 0.0


def test_no_delivery_gives_no_figure() -> None:
    rows = [row(eta=10, realised_minutes=10, p=0.9, on_time=True, status=OutcomeStatus.REASSIGNED)]
    figures = live_quality(rows)[QualityKey(1, "shanghai", 0)]
    assert figures.deliveries == 0 and figures.reassigned == 1
    assert np.isnan(figures.eta_mae) and np.isnan(figures.brier)


def test_random_rows_match_a_plain_loop() -> None:
    rng = random.Random(46)
    rows = [
        row(
            eta=rng.uniform(5, 60),
            realised_minutes=rng.uniform(5, 60),
            p=rng.random(),
            on_time=rng.random() < 0.7,
            cost=rng.uniform(3, 12),
        )
        for _ in range(500)
    ]
    figures = live_quality(rows)[QualityKey(1, "shanghai", 0)]
    errors, squared, late = [], [], 0
    bins: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        assert r.delivered_at is not None and r.eta_minutes is not None
        assert r.ontime_probability is not None
        realised = (r.delivered_at - r.decided_at) / 60.0
        errors.append(r.eta_minutes - realised)
        y = 1.0 if r.delivered_at - r.created_at <= r.promised_minutes * 60 else 0.0
        late += y == 0.0
        squared.append((r.ontime_probability - y) ** 2)
        bins.setdefault(min(int(r.ontime_probability * 10), 9), []).append(
            (r.ontime_probability, y)
        )
    ece = sum(
        len(v) / len(rows) * abs(sum(p for p, _ in v) / len(v) - sum(y for _, y in v) / len(v))
        for v in bins.values()
    )
    assert figures.eta_mae == pytest.approx(sum(abs(e) for e in errors) / len(rows))
    assert figures.eta_bias == pytest.approx(sum(errors) / len(rows))
    assert figures.brier == pytest.approx(sum(squared) / len(rows))
    assert figures.ece == pytest.approx(ece)
    assert figures.late_rate == pytest.approx(late / len(rows))
