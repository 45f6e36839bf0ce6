"""The trainer gives a big CPU step's freed memory back (services/common/heap.py)."""

from __future__ import annotations

import pytest

from agrpo.services.common import heap

pytestmark = pytest.mark.skipif(heap.free_heap_bytes() is None, reason="not glibc")


def _rss_mb() -> int:
    with open("/proc/self/status") as f:
        return int(f.read().split("VmRSS:")[1].split()[0]) // 1024


def _fragment(mb: int) -> list[bytearray]:
    """Leave about `mb` MiB free inside the heap: many small blocks, every other one freed."""
    blocks = [bytearray(64 * 1024) for _ in range(mb * 32)]  # 64 KiB: below the mmap threshold
    keep = blocks[1::2]
    del blocks
    return keep


def test_free_memory_goes_back_once_there_is_enough():
    keep = _fragment(512)
    free = heap.free_heap_bytes()
    assert free is not None and free > 200 * 2**20
    assert not heap.release_free_heap(at_least=free + 1)  # below the bar: nothing happens
    before = _rss_mb()
    assert heap.release_free_heap(at_least=free // 2)
    assert _rss_mb() < before - 100, (before, _rss_mb())
    assert len(keep) > 0
