"""A pool of reward worker processes with a per-call deadline.

Each worker runs one call at a time. A call that outlives its deadline gets its worker
SIGKILLed and replaced; a worker that dies mid-call (crash, OOM kill, SIGKILL) fails
that call with a reason and is replaced. A worker found dead before a call (it died
while idle) is replaced first, and a call it could not even be sent goes to the
replacement, so a death costs only the calls that were running. Either way the pool
keeps serving.

Pipe I/O is blocking, so each worker has one thread of a private executor driving it;
the event loop only awaits futures.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agrpo.services.common.logging import get_logger
from agrpo.services.common.timeouts import WORKER_RESTART_BACKOFF_MAX_S, WORKER_RESTART_BACKOFF_S

from .registry import FunctionInfo, FunctionSpec
from .results import TimedOut
from .worker import worker_main

log = get_logger("reward.pool")

# Preloaded once by the forkserver, so a replacement worker starts in milliseconds.
_PRELOAD = ["agrpo.services.reward.worker", "agrpo.services.reward.builtins", "math_verify",
            "latex2sympy2_extended"]


@dataclass(frozen=True)
class CallOutcome:
    """How one function call went: status "ok" (values set), "failed" or "timeout"
    ("unsent" only inside the pool: the worker was dead before it got the call)."""

    status: str
    values: list[float | TimedOut | None] | None = None
    reason: str = ""
    elapsed_s: float = 0.0


class WorkerStartError(RuntimeError):
    """A worker could not load the reward functions (bad config or import error)."""


class _Worker:
    """One worker process and the parent's end of its pipe; used from one thread only."""

    def __init__(self, ctx: Any, specs: list[FunctionSpec], start_timeout_s: float) -> None:
        self._ctx, self._specs, self._start_timeout_s = ctx, specs, start_timeout_s
        self._ids = itertools.count()
        self.process: Any = None
        self.conn: Any = None

    def start(self) -> list[FunctionInfo]:
        """Spawn the process and wait for its list of loaded functions."""
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(target=worker_main, args=(child, self._specs, list(sys.path)),
                                    name="agrpo-reward-worker", daemon=True)
        process.start()
        child.close()
        self.process, self.conn = process, parent
        if not parent.poll(self._start_timeout_s):
            self.kill()
            raise WorkerStartError(f"worker did not start within {self._start_timeout_s:.0f}s")
        try:
            kind, payload = parent.recv()
        except (EOFError, OSError):
            code = self.kill()
            raise WorkerStartError(f"worker exited during start (exit code {code})") from None
        if kind != "ready":
            self.kill()
            raise WorkerStartError(payload)
        return payload

    def kill(self) -> int | None:
        """SIGKILL (no-op when already dead), reap, close the pipe; return the exit code."""
        if self.process is None:
            return None
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        code = self.process.exitcode
        if not self.conn.closed:
            self.conn.close()
        self.process = None
        return code

    def call(self, index: int, kwargs: dict[str, Any], timeout_s: float) -> CallOutcome:
        """Run one call under a deadline; on any outcome but a reply, the worker is dead."""
        call_id = next(self._ids)
        start = time.monotonic()
        try:
            self.conn.send((call_id, index, kwargs, timeout_s))
        except (OSError, EOFError):  # nothing ran: the pool sends it to a replacement
            self.kill()
            return CallOutcome("unsent", reason="worker process was dead before the call")
        deadline = start + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                return CallOutcome("timeout", reason=f"no result within {timeout_s:g}s; worker "
                                   "killed and replaced", elapsed_s=time.monotonic() - start)
            try:
                ready = self.conn.poll(min(remaining, 1.0))
                reply = self.conn.recv() if ready else None
            except (EOFError, OSError):
                return self._died(start)
            if reply is not None:
                reply_id, ok, payload = reply
                if reply_id != call_id:
                    continue  # a stale reply cannot happen (one call at a time); be safe
                elapsed = time.monotonic() - start
                if ok:
                    return CallOutcome("ok", values=payload, elapsed_s=elapsed)
                return CallOutcome("failed", reason=f"raised {payload}", elapsed_s=elapsed)

    def _died(self, start: float) -> CallOutcome:
        code = self.kill()
        return CallOutcome("failed", reason=f"worker process died during the call (exit code "
                           f"{code}); replaced", elapsed_s=time.monotonic() - start)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()


@dataclass
class _Job:
    index: int
    kwargs: dict[str, Any]
    timeout_s: float
    future: asyncio.Future


class WorkerPool:
    """`num_workers` processes fed from one job queue; `run()` scores one function call."""

    def __init__(self, specs: list[FunctionSpec], num_workers: int, start_method: str = "forkserver",
                 start_timeout_s: float = 60.0,
                 on_event: Callable[[str, int], None] | None = None) -> None:
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(_PRELOAD)
        self._workers = [_Worker(self._ctx, specs, start_timeout_s) for _ in range(num_workers)]
        self._executor = ThreadPoolExecutor(num_workers, thread_name_prefix="reward-pool")
        self._jobs: asyncio.Queue[_Job] = asyncio.Queue()
        self._runners: list[asyncio.Task] = []
        self._on_event = on_event or (lambda event, value: None)
        self.busy = 0

    async def start(self) -> list[FunctionInfo]:
        """Start every worker; return the functions they loaded (WorkerStartError if not)."""
        loop = asyncio.get_running_loop()
        # Let every start finish before cleaning up: closing a worker another thread is
        # still starting would race on its pipe.
        infos = await asyncio.gather(*(loop.run_in_executor(self._executor, w.start)
                                       for w in self._workers), return_exceptions=True)
        failed = [r for r in infos if isinstance(r, BaseException)]
        if failed:
            await self.close()
            raise failed[0]
        self._runners = [asyncio.create_task(self._run_worker(w)) for w in self._workers]
        first = infos[0]
        assert not isinstance(first, BaseException)  # a failed start raised above
        return first

    @property
    def queue_depth(self) -> int:
        """Calls waiting for a free worker."""
        return self._jobs.qsize()

    async def run(self, index: int, kwargs: dict[str, Any], timeout_s: float) -> CallOutcome:
        """Queue one call of function `index`; resolve when a worker has answered."""
        job = _Job(index, kwargs, timeout_s, asyncio.get_running_loop().create_future())
        self._jobs.put_nowait(job)
        self._on_event("queue_depth", self._jobs.qsize())
        return await job.future

    async def _run_worker(self, worker: _Worker) -> None:
        while True:
            job = await self._jobs.get()
            self._on_event("queue_depth", self._jobs.qsize())
            if job.future.cancelled():
                continue
            self.busy += 1
            self._on_event("busy", self.busy)
            try:
                outcome = await self._call(worker, job)
            finally:
                self.busy -= 1
                self._on_event("busy", self.busy)
            if not job.future.done():
                job.future.set_result(outcome)
            if not worker.alive:
                await self._replace(worker, outcome.status)

    async def _call(self, worker: _Worker, job: _Job) -> CallOutcome:
        """Run `job` on `worker`, first replacing it if it died while idle; a call it
        could not be sent (it died just now) goes once more, to the replacement."""
        loop = asyncio.get_running_loop()
        for _ in range(2):
            if not worker.alive:
                await self._replace(worker, "idle")
            outcome = await loop.run_in_executor(
                self._executor, worker.call, job.index, job.kwargs, job.timeout_s)
            if outcome.status != "unsent":
                return outcome
        return CallOutcome("failed", reason=f"{outcome.reason}, twice; replaced")

    async def _replace(self, worker: _Worker, cause: str) -> None:
        """Start a fresh process in place of a dead one, retrying until it comes up."""
        loop = asyncio.get_running_loop()
        self._on_event(f"restart_{cause}", 1)
        delay = WORKER_RESTART_BACKOFF_S
        while True:
            try:
                await loop.run_in_executor(self._executor, worker.start)
                log.warning("replaced a reward worker (%s)", cause)
                return
            except WorkerStartError:
                log.exception("could not replace a reward worker; retrying in %.1fs", delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, WORKER_RESTART_BACKOFF_MAX_S)

    async def close(self) -> None:
        """Stop the runners and the processes (asking politely first)."""
        for task in self._runners:
            task.cancel()
        await asyncio.gather(*self._runners, return_exceptions=True)
        for worker in self._workers:
            if worker.alive:
                try:
                    worker.conn.send(None)
                except OSError:
                    pass
                worker.process.join(1)
            worker.kill()
        self._executor.shutdown(wait=False, cancel_futures=True)
