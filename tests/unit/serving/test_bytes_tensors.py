"""serving.bytes_tensors against the decoder of Triton's own Python backend (the
`triton_python_backend_utils` that `make setup` lays out), element for element."""

from __future__ import annotations

import importlib.util
import struct
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dispatch_service.core.paths import REPO_ROOT
from dispatch_service.serving.bytes_tensors import decode_bytes_tensor, use_fast_bytes_decoding

BACKEND_UTILS = REPO_ROOT / ".triton" / "backends" / "python" / "triton_python_backend_utils.py"


@pytest.fixture(scope="module")
def backend() -> ModuleType:
    if not BACKEND_UTILS.is_file():
        pytest.skip("the Python backend is laid out by `make setup`")
    spec = importlib.util.spec_from_file_location("backend_utils_reference", BACKEND_UTILS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def encoded(items: list[bytes]) -> np.ndarray[Any, np.dtype[np.uint8]]:
    data = b"".join(struct.pack("<I", len(item)) + item for item in items)
    return np.frombuffer(data, dtype=np.uint8)


CASES = {
    "equal lengths": [f"r-{i:05d}".encode() for i in range(5000)],
    "mixed lengths": [f"rider-{i}".encode() for i in range(1200)],
    "one element": [b"order-1"],
    "none": [],
    "empty elements": [b"", b"", b""],
    "a small window's ids": [f"r-{i:05d}".encode() for i in range(20)],
    "trailing NUL kept": [b"ab\x00", b"cd\x00"],
    "trailing NUL kept, many": [f"r-{i:05d}\x00".encode() for i in range(200)],
    "inner NUL and UTF-8": [b"a\x00b", "上海".encode()[:3], "北京".encode()[:3]],
    "binary": [bytes(range(256)), bytes(range(255, -1, -1))],
}


@pytest.mark.parametrize("items", CASES.values(), ids=CASES.keys())
def test_decodes_as_the_backend_does(backend: ModuleType, items: list[bytes]) -> None:
    ours = decode_bytes_tensor(encoded(items))
    theirs = backend.deserialize_bytes_tensor(encoded(items))
    assert ours.dtype == theirs.dtype == np.object_ and ours.shape == theirs.shape
    assert ours.tolist() == theirs.tolist() == items


@pytest.mark.parametrize(
    "data",
    [b"\x05\x00\x00\x00abc", b"\x01\x00", b"\x02\x00\x00\x00ab\x09\x00\x00\x00x"],
    ids=["element past the end", "length cut short", "second element past the end"],
)
def test_a_buffer_ending_inside_an_element_is_refused(backend: ModuleType, data: bytes) -> None:
    array = np.frombuffer(data, dtype=np.uint8)
    with pytest.raises(struct.error):
        backend.deserialize_bytes_tensor(array)
    with pytest.raises(struct.error):
        decode_bytes_tensor(array)


def test_installed_where_the_stub_looks_it_up() -> None:
    module = SimpleNamespace(deserialize_bytes_tensor=None)
    use_fast_bytes_decoding(module)
    assert module.deserialize_bytes_tensor is decode_bytes_tensor
