"""The GPU's memory while a benchmark run lasts: nvidia-smi's memory.used every 0.5 s into a file,
its peak per GPU at the end (both sides of a race alike; nothing where there is no nvidia-smi)."""

from __future__ import annotations

import subprocess
from pathlib import Path


class GpuMemory:
    """nvidia-smi's memory.used per GPU every 0.5 s while a run lasts (both sides alike); nothing
    where there is no nvidia-smi."""

    def __init__(self, path: Path) -> None:
        self.path, self.proc = path, None
        try:
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits",
                                          "-lms", "500"], stdout=path.open("w"), stderr=subprocess.DEVNULL)
        except OSError:
            self.proc = None

    def stop(self) -> dict:
        """{"gpu_peak_gib": the highest GPU's peak, "gpu_peak_gib_per_gpu": {index: peak}} or {}."""
        if self.proc is None:
            return {}
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        return gpu_peaks(self.path.read_text())


def gpu_peaks(text: str) -> dict:
    """Peak GiB per GPU from nvidia-smi's "index, MiB" lines."""
    peak: dict[str, float] = {}
    for line in text.splitlines():
        index, _, mib = line.partition(",")
        try:
            peak[index.strip()] = max(peak.get(index.strip(), 0.0), float(mib) / 1024)
        except ValueError:
            continue
    if not peak:
        return {}
    return {"gpu_peak_gib": round(max(peak.values()), 2), "gpu_peak_gib_per_gpu": {k: round(v, 2) for k, v in peak.items()}}
