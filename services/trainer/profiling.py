"""torch.profiler over a window of training steps (trainer.profile_steps).

Why: a step that takes longer in the service than in a benchmark of the same shape is lost
either on the device or on the host (kernel launches, the GIL shared with generation and
gRPC, waits for the GPU). The window covers whole steps as the loop runs them, the wait for
samples included, and every thread of the process, so the trainer's own generation shows
too. It writes, under <output_dir>/profile/:

- steps_A-B.txt: the window's wall time, the GPU's busy time in it, the ops that took the
  most time on the host and on the device, and the GPU's longest idle gaps with the host ops
  that ran in them;
- trace_A-B.json.gz: the timeline (chrome://tracing or https://ui.perfetto.dev).

A run resumed inside the window profiles from its first step; one that ends inside it writes
what it profiled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agrpo.services.common.logging import get_logger

if TYPE_CHECKING:
    from torch.profiler import profile

log = get_logger("trainer.profile")

TOP_OPS = 40
"""Rows of each op table in steps_A-B.txt."""


class StepProfiler:
    """Starts before step `first` is pulled and stops after step `last` is logged; inert
    when no window is set."""

    def __init__(self, window: tuple[int, int] | None, output_dir: str | Path, cuda: bool) -> None:
        self.window = window
        self.folder = Path(output_dir) / "profile"
        self.cuda = cuda
        self._profiler: profile | None = None
        self._started = 0.0
        self._steps = (0, 0)  # the first step profiled and the last one logged

    def before_step(self, step: int) -> None:
        """`step`: the step about to be pulled (1-based)."""
        if self.window is None or self._profiler is not None or not self.window[0] <= step <= self.window[1]:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._profiler = profiler = profile(activities=activities, experimental_config=_every_thread(self.cuda))
        profiler.start()
        self._started = time.perf_counter()
        self._steps = (step, step - 1)
        log.info("profiling steps %d-%d", step, self.window[1])

    def after_step(self, step: int) -> Callable[[], None] | None:
        """`step`: the step just logged. After the window's last one the profiler stops and this
        returns what writes the files (seconds for a big window: run it off the event loop)."""
        if self._profiler is None or self.window is None:
            return None
        self._steps = (self._steps[0], step)
        return self._stop() if step >= self.window[1] else None

    def close(self) -> Callable[[], None] | None:
        """A run that ends inside the window still writes what it profiled."""
        return self._stop() if self._profiler is not None else None

    def _stop(self) -> Callable[[], None]:
        profiler, self._profiler = self._profiler, None
        assert profiler is not None
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        wall = time.perf_counter() - self._started
        profiler.stop()
        return partial(self.write, profiler, wall)

    def write(self, profiler, wall_s: float) -> None:
        first, last = self._steps
        self.folder.mkdir(parents=True, exist_ok=True)
        table = self.folder / f"steps_{first}-{last}.txt"
        trace = self.folder / f"trace_{first}-{last}.json.gz"
        averages = profiler.key_averages()
        lines = [f"steps {first}-{last}: {wall_s:.3f} s wall", "", "by host time (self):",
                 averages.table(sort_by="self_cpu_time_total", row_limit=TOP_OPS)]
        if self.cuda:
            busy, gaps = idle_gaps(profiler.events())
            lines[0] += f", GPU busy {busy:.3f} s ({busy / wall_s:.0%})"
            lines += ["", "by device time (self):", averages.table(sort_by="self_device_time_total", row_limit=TOP_OPS),
                      "", "the GPU's longest idle gaps (ms, at ms into the window: what the host ran):"]
            lines += [f"{ms:8.2f} at {at:8.1f}: {ops}" for ms, at, ops in gaps]
        table.write_text("\n".join(lines) + "\n")
        profiler.export_chrome_trace(str(trace))
        log.info("profile of steps %d-%d: %s (%s)", first, last, table, lines[0])


def _every_thread(cuda: bool):
    """Kineto's options: every thread's ops (the step runs in a worker thread, generation in
    another), Python's garbage collections, and on a GPU its synchronisations. Options this torch
    lacks are left out."""
    from torch._C._profiler import _ExperimentalConfig

    wanted: dict[str, Any] = {"profile_all_threads": True, "record_python_gc_info": True, "enable_cuda_sync_events": cuda}
    while wanted:
        try:
            return _ExperimentalConfig(**wanted)
        except TypeError as exc:
            unknown = [name for name in wanted if name in str(exc)]
            if not unknown:
                break
            wanted.pop(unknown[0])
    return _ExperimentalConfig()


def idle_gaps(events, top: int = 12) -> tuple[float, list[tuple[float, float, str]]]:
    """The GPU's busy seconds (the union of its kernels and copies) and its longest idle gaps
    between the first and the last of them: (ms, ms after the first event, the host ops that
    started inside the gap, most frequent first). Where the device idles the host is the cost."""
    from collections import Counter
    from itertools import pairwise

    kernels = sorted((e.time_range.start, e.time_range.end) for e in events if _on_device(e))
    if not kernels:
        return 0.0, []
    host = sorted((e.time_range.start, e.name) for e in events if not _on_device(e))
    merged = [list(kernels[0])]
    for begin, end in kernels[1:]:
        if begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    busy = sum(end - begin for begin, end in merged) / 1e6
    origin = min(kernels[0][0], host[0][0] if host else kernels[0][0])
    gaps = sorted(((b[0] - a[1], a[1], b[0]) for a, b in pairwise(merged)), reverse=True)[:top]
    out = []
    for length, begin, end in gaps:
        names = Counter(name for t, name in host if begin <= t < end)
        out.append((length / 1e3, (begin - origin) / 1e3,
                    ", ".join(f"{n[:50]} x{c}" for n, c in names.most_common(4)) or "-"))
    return busy, out


def _on_device(event) -> bool:
    kind = getattr(event, "device_type", None)
    return kind is not None and getattr(kind, "name", str(kind)).upper().endswith("CUDA")
