"""The worker process: loads the reward functions once, then runs one call at a time.

Protocol over a duplex pipe (pickled tuples):
- worker -> parent, once: ("ready", [FunctionInfo, ...]) or ("init_error", message)
- parent -> worker: (call_id, function_index, kwargs, budget_s), or None to exit
- worker -> parent: (call_id, True, [float | TimedOut | None, ...]) or (call_id, False, reason)

Calls run in the process's main thread, so signal-based time limits work: functions
that score items one by one give each item a limit within the call's `budget_s`
(deadline.py). The parent enforces the budget itself by killing the process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

from agrpo.services.common.lifetime import die_with_parent

from .deadline import call_budget
from .registry import FunctionSpec, invoke, load

WORKER_NICENESS = 10
"""Added to a worker's niceness: the server's front (admission, refusals, answers) runs first."""


def _reason(exc: BaseException) -> str:
    """`Type: message` plus the innermost frame: enough to find the bug, short enough to log."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"[:2000]


def _die_with_parent() -> None:
    """Linux: SIGKILL us when our parent exits, so a hung call cannot outlive a killed
    server. With forkserver our parent is the fork server, which exits with the server
    once no child holds its "alive" pipe: a child inherits that pipe, so we close it."""
    try:
        from multiprocessing import forkserver

        # Private, but stable since Python 3.4 (Any: typeshed does not list _forkserver_alive_fd).
        server: Any = forkserver._forkserver
        if server._forkserver_alive_fd is not None:
            os.close(server._forkserver_alive_fd)
            server._forkserver_alive_fd = None
    except (AttributeError, OSError):
        pass
    die_with_parent()


def _yield_to_the_front() -> None:
    """Score at a lower CPU priority than the server's gRPC front: under overload the front
    must keep the CPU it needs to admit or refuse each call at once, or the calls queue in
    the kernel and gRPC before anything is decided (docs/reward-api.md, "Errors and retries")."""
    try:
        os.nice(WORKER_NICENESS)
    except OSError:
        pass


def worker_main(conn: Connection, specs: list[FunctionSpec], sys_path: list[str]) -> None:
    """Entry point of a worker process."""
    _die_with_parent()
    _yield_to_the_front()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    sys.path[:] = [*sys_path, *(p for p in sys.path if p not in sys_path)]
    try:
        loaded = [load(spec) for spec in specs]
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the start
        conn.send(("init_error", str(exc)))
        return
    conn.send(("ready", [info for _, info in loaded]))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    while True:
        try:
            message: Any = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        call_id, index, kwargs, budget_s = message
        reply: tuple[Any, bool, Any]  # (call_id, True, scores) or (call_id, False, reason)
        try:
            with call_budget(budget_s):
                reply = (call_id, True, invoke(loaded[index][0], kwargs, loop))
        except BaseException as exc:  # noqa: BLE001 - even SystemExit costs one score only
            reply = (call_id, False, _reason(exc))
        try:
            conn.send(reply)
        except Exception as exc:  # noqa: BLE001 - e.g. unpicklable; the parent must hear back
            conn.send((call_id, False, f"could not return the result: {_reason(exc)}"))
