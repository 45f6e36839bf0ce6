"""A child process that must not outlive its parent (a reward worker, a trainer rank)."""

from __future__ import annotations

import os
import signal


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent exits (PR_SET_PDEATHSIG), for children
    that a kill of their parent's process group would miss. Exits at once when the parent
    is already gone. Elsewhere a no-op."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the parent died before prctl took effect
        os._exit(1)
