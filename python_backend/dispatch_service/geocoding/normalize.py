"""Address text normalisation: one spelling per address, so the cache and the matchers agree.

Users type the same address many ways: full-width digits and letters from a Chinese input
method, stray spaces, traditional characters for the number suffix, ``#`` for 号, a city
without its 市. Normalising first makes those variants one cache key and lets the
gazetteer match them with plain substring search.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

__all__ = [
    "normalize_address",
    "normalize_city",
]


# Traditional forms seen in addresses -> simplified (after NFKC).
_TRADITIONAL: Final = str.maketrans(
    {
        "號": "号",
        "樓": "楼",
        "區": "区",
        "縣": "县",
        "門": "门",
        "廣": "广",
        "場": "场",
        "東": "东",
        "橋": "桥",
        "灣": "湾",
        "莊": "庄",
        "層": "层",
        "\u3007": "0",
    }
)
_SPACE: Final = re.compile(r"\s+")
# "88#", "88 號", "No.88" -> "88号"
_NUMBER_HASH: Final = re.compile(r"(\d+)\s*#")
_NUMBER_PREFIX: Final = re.compile(r"(?i)(?<![a-z])no\.?\s*(\d+)")
# Words after the address proper that do not move the point ("附近" = nearby).
_TRAILING_NOISE: Final = re.compile(r"(附近|旁边|旁|对面|一带|周边)+$")
# "上海" written without its 市 (but not "上海市", "上海路" or "上海南站").
_MUNICIPALITIES: Final = ("北京", "上海", "天津", "重庆")
_MUNICIPALITY: Final = re.compile(r"^(" + "|".join(_MUNICIPALITIES) + r")(?!市)")
_ROAD_ABBREVIATION: Final = re.compile(r"(?<=[\u4e00-\u9fff])(?i:rd\.?|road)$")


def normalize_address(text: str) -> str:
    """The canonical spelling of ``text`` (idempotent; "" stays "")."""
    value = unicodedata.normalize("NFKC", text).translate(_TRADITIONAL)
    value = _NUMBER_PREFIX.sub(r"\1号", value)
    value = _NUMBER_HASH.sub(r"\1号", value)
    value = _SPACE.sub("", value).lower()
    value = _ROAD_ABBREVIATION.sub("路", value)
    value = _TRAILING_NOISE.sub("", value)
    match = _MUNICIPALITY.match(value)
    if match and not _is_other_word(value, match.end()):
        value = value[: match.end()] + "市" + value[match.end() :]
    return value


def _is_other_word(value: str, end: int) -> bool:
    """True when the municipality name is the start of another name ("上海路", "上海南站")."""
    return value[end : end + 1] in {"路", "街", "南", "北", "东", "西", "站", "大", "中"}


def normalize_city(text: str) -> str:
    """The canonical spelling of a city field: a name as addresses, an adcode as digits."""
    value = unicodedata.normalize("NFKC", text).strip()
    if value.isdigit():
        return value
    value = normalize_address(value)
    return value[:-1] if value.endswith("市") and len(value) > 2 else value
