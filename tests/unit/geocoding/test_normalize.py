"""Behaviour of dispatch_service.geocoding.normalize: one spelling per address."""

from __future__ import annotations

import pytest

from dispatch_service.geocoding.normalize import normalize_address, normalize_city


@pytest.mark.parametrize(
    ("typed", "canonical"),
    [
        ("上海市徐汇区安平路100号", "上海市徐汇区安平路100号"),
        ("上海市徐汇区安平路１００号", "上海市徐汇区安平路100号"),  # full-width digits
        ("上海市 徐汇区  安平路 100 号", "上海市徐汇区安平路100号"),  # spaces
        ("上海市\u3000徐汇区\t安平路100号", "上海市徐汇区安平路100号"),  # ideographic space, tab
        ("上海市徐汇区安平路100號", "上海市徐汇区安平路100号"),  # traditional 號
        ("上海市徐汇区安平路100#", "上海市徐汇区安平路100号"),
        ("上海市徐汇区安平路１００＃", "上海市徐汇区安平路100号"),  # noqa: RUF001
        ("上海市徐汇区安平路No.100", "上海市徐汇区安平路100号"),
        ("上海徐汇区安平路100号", "上海市徐汇区安平路100号"),  # city without 市
        ("上海市徐汇区安平路100号附近", "上海市徐汇区安平路100号"),
        ("ＡＢＣ大厦", "abc大厦"),  # full-width letters, case folded
        ("", ""),
    ],
)
def test_variants_share_one_spelling(typed: str, canonical: str) -> None:
    assert normalize_address(typed) == canonical


@pytest.mark.parametrize("name", ["上海路1号", "上海南站", "上海中心"])
def test_a_place_named_after_the_city_keeps_its_name(name: str) -> None:
    assert normalize_address(name) == name


def test_normalisation_is_idempotent() -> None:
    for text in ["上海 徐汇区 安平路１００號附近", "No. 5 康盛路", "北京朝阳区"]:
        once = normalize_address(text)
        assert normalize_address(once) == once


def test_city_names_and_adcodes() -> None:
    assert normalize_city("上海市") == normalize_city("上海") == "上海"
    assert normalize_city(" 310000 ") == "310000"
    assert normalize_city("３１００００") == "310000"  # noqa: RUF001
    assert normalize_city("") == ""
