"""Children that must not outlive their parent: a reward worker, a trainer rank, and every
process `agrpo run` starts (services, vLLM), so a SIGKILL of the launcher leaves nothing behind."""

from __future__ import annotations

import os
import signal
import sys
import threading

# Run as `python -c _EXEC_DYING_WITH_PARENT cmd args...`: PR_SET_PDEATHSIG survives exec, so the
# command gets SIGKILL when the process that started it dies. No import of ours: any interpreter.
_EXEC_DYING_WITH_PARENT = ("import ctypes, os, signal, sys\n"
                           "ctypes.CDLL('libc.so.6').prctl(1, signal.SIGKILL)\n"
                           "os.getppid() == 1 and os._exit(1)\n"
                           "os.execvp(sys.argv[1], sys.argv[1:])")


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


def dying_with_this_process(argv: list[str]) -> list[str]:
    """`argv` wrapped so that it dies with this process, even when this one is SIGKILLed.
    Linux only, and only when called on the main thread: the kernel sends the signal when the
    thread that started the child ends, which for the main thread is the process's end."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return list(argv)
    return [sys.executable, "-c", _EXEC_DYING_WITH_PARENT, *argv]
