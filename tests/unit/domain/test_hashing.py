"""The stable id hash: FNV-1a, the same in every process, and light to import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dispatch_service.domain.hashing import fnv1a_64, rider_id_hashes

ROOT = Path(__file__).resolve().parents[3]


def reference_fnv1a(data: bytes) -> int:
    value = 0xCBF29CE484222325
    for byte in data:
        value ^= byte
        value = (value * 0x100000001B3) % (1 << 64)
    return value


def test_fnv1a_known_vectors() -> None:
    hashes = fnv1a_64([b"", b"a", b"foobar"])
    assert hashes.dtype == np.uint64
    assert hashes.tolist() == [0xCBF29CE484222325, 0xAF63DC4C8601EC8C, 0x85944171F73967E8]


def test_fnv1a_matches_reference_on_random_ids() -> None:
    rng = np.random.default_rng(7)
    ids = [rng.integers(0, 256, rng.integers(0, 65)).astype(np.uint8).tobytes() for _ in range(500)]
    ids += [b"\x00", b"a\x00", b"a\x00\x00", b"\x00a", b"\xff" * 64]  # NULs are data too
    assert fnv1a_64(ids).tolist() == [reference_fnv1a(item) for item in ids]
    assert len(set(fnv1a_64([b"a", b"a\x00", b"a\x00\x00"]).tolist())) == 3


def test_fnv1a_is_the_same_in_another_process() -> None:
    code = (
        "from dispatch_service.domain.hashing import fnv1a_64;"
        "print(fnv1a_64([b'rider-1', b'rider-2']).tolist())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(fnv1a_64([b"rider-1", b"rider-2"]).tolist())


def test_fnv1a_scalar_and_vector_paths_agree() -> None:
    rng = np.random.default_rng(23)
    ids = [bytes(rng.integers(0, 256, int(rng.integers(0, 65)), dtype=np.uint8)) for _ in range(60)]
    expected = [reference_fnv1a(item) for item in ids]
    assert fnv1a_64(ids).tolist() == expected  # over the byte budget: numpy columns
    assert [int(fnv1a_64([item])[0]) for item in ids] == expected  # one id: Python loop


def test_cached_rider_hashes_equal_fnv1a() -> None:
    ids = [f"cached-{i}".encode() for i in range(40)]
    first = rider_id_hashes(ids[:25])
    again = rider_id_hashes(ids)  # 25 cached, 15 new
    assert first.tolist() == fnv1a_64(ids[:25]).tolist()
    assert again.tolist() == fnv1a_64(ids).tolist()
    assert again.dtype == np.uint64


@pytest.mark.parametrize(
    "module",
    [
        "dispatch_service.domain.hashing",
        "dispatch_service.routing",
        "dispatch_service.routing.engine",
        "dispatch_service.routing.fallback",
        "dispatch_service.routing.metrics",
        "dispatch_service.routing.policy",
        "dispatch_service.routing.settings",
        "dispatch_service.routing.shadow",
    ],
)
def test_routing_hashes_user_ids_without_importing_scipy(module: str) -> None:
    """Routing buckets users by this hash; importing it must not load the resolver's SciPy."""
    probe = f"import sys, {module}; print('scipy' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
