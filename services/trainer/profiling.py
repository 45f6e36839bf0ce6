"""torch.profiler over a window of training steps (trainer.profile_steps).

Why: a step that takes longer in the service than in a benchmark of the same shape is lost
either on the device or on the host (kernel launches, the GIL shared with generation and
gRPC, waits for the GPU). The window covers whole steps as the loop runs them, the wait for
samples included, and every thread of the process, so the trainer's own generation shows
too. It writes, under <output_dir>/profile/:

- steps_A-B.txt: the window's wall time, the GPU's busy time in it, and the ops that took
  the most time on the host and on the device;
- trace_A-B.json.gz: the timeline (chrome://tracing or https://ui.perfetto.dev).
"""

from __future__ import annotations

import time
from pathlib import Path

from agrpo.services.common.logging import get_logger

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
        self._profiler = None
        self._started = 0.0

    def before_step(self, step: int) -> None:
        """`step`: the step about to be pulled (1-based)."""
        if self.window is None or self._profiler is not None or step != self.window[0]:
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self._profiler = profile(activities=activities, experimental_config=_every_thread(self.cuda))
        self._profiler.start()
        self._started = time.perf_counter()
        log.info("profiling steps %d-%d", *self.window)

    def after_step(self, step: int) -> None:
        """`step`: the step just logged; the window's last one writes the files."""
        if self._profiler is None or self.window is None or step < self.window[1]:
            return
        profiler, self._profiler = self._profiler, None
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        wall = time.perf_counter() - self._started
        profiler.stop()
        self.write(profiler, wall)

    def close(self) -> None:
        """A run that ends inside the window still writes what it profiled."""
        if self._profiler is not None:
            self.after_step(self.window[1] if self.window else 0)

    def write(self, profiler, wall_s: float) -> None:
        first, last = self.window or (0, 0)
        self.folder.mkdir(parents=True, exist_ok=True)
        table = self.folder / f"steps_{first}-{last}.txt"
        trace = self.folder / f"trace_{first}-{last}.json.gz"
        averages = profiler.key_averages()
        busy = gpu_busy_s(profiler.events()) if self.cuda else None
        lines = [f"steps {first}-{last}: {wall_s:.3f} s wall"
                 + ("" if busy is None else f", GPU busy {busy:.3f} s ({busy / wall_s:.0%})"),
                 "", "by host time (self):",
                 averages.table(sort_by="self_cpu_time_total", row_limit=TOP_OPS)]
        if self.cuda:
            lines += ["", "by device time (self):", averages.table(sort_by="self_device_time_total", row_limit=TOP_OPS)]
        table.write_text("\n".join(lines) + "\n")
        profiler.export_chrome_trace(str(trace))
        log.info("profile of steps %d-%d: %s (%s)", first, last, table, lines[0])


def _every_thread(cuda: bool):
    """Kineto's options: every thread's ops (the step runs in a worker thread, generation in
    another), Python's garbage collections, and on a GPU its synchronisations. Options this torch
    lacks are left out."""
    from torch._C._profiler import _ExperimentalConfig

    wanted = {"profile_all_threads": True, "record_python_gc_info": True, "enable_cuda_sync_events": cuda}
    while wanted:
        try:
            return _ExperimentalConfig(**wanted)
        except TypeError as exc:
            unknown = [name for name in wanted if name in str(exc)]
            if not unknown:
                break
            wanted.pop(unknown[0])
    return _ExperimentalConfig()


def gpu_busy_s(events) -> float:
    """Seconds in which at least one GPU kernel or copy ran (overlaps counted once)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in events
                   if _on_device(e) and e.time_range.end > e.time_range.start)
    return union_length(spans) / 1e6


def union_length(spans: list[tuple[float, float]]) -> float:
    """Total length covered by sorted (start, end) spans."""
    total, reach = 0.0, float("-inf")
    for start, end in spans:
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _on_device(event) -> bool:
    kind = getattr(event, "device_type", None)
    return kind is not None and getattr(kind, "name", str(kind)).upper().endswith("CUDA")
