"""Give the C heap's free memory back to the OS after a big CPU computation.

glibc keeps what a thread frees in that thread's arena for reuse. A training step or a
generation batch on a CPU allocates gigabytes of short-lived tensors; when two threads take
turns at such work (the trainer that also generates, asyncio.to_thread's pool), the arenas
keep their peaks and fragment, and the process grows step after step until the OOM killer
ends it, though what is live stays the same (docs/vs-trl.md, "The trainer's memory on a
CPU"). `malloc_trim` returns the free pages; it costs about 70 ms a GiB, so it runs only
once RELEASE_AT bytes are free. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache

RELEASE_AT = 1 << 30
"""Free heap bytes from which a release is worth its cost (a tiny model's step never gets here)."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@cache
def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim  # noqa: B018 - glibc has both (2.33+), or this is not the glibc we know
        return libc
    except (OSError, AttributeError):  # not glibc, or older than 2.33
        return None


def free_heap_bytes() -> int | None:
    """Bytes the heap holds free (glibc's mallinfo2().fordblks, every arena); None elsewhere."""
    libc = _libc()
    return None if libc is None else libc.mallinfo2().fordblks


def release_free_heap(at_least: int = RELEASE_AT) -> bool:
    """Return the heap's free pages to the OS when `at_least` bytes are free; whether it did."""
    free = free_heap_bytes()
    if free is None or free < at_least:
        return False
    _libc().malloc_trim(0)
    return True
